#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 13 "Benchmark": adding a 4th node to a 3-node cluster (rf 2) under a
# client load, on loopback: the streaming rate and what the clients see.
#
#   bench/elastic_bench.sh [--keys N] [--value-size B] [--rounds R]
#       [--warmup S] [--baseline S] [--after S] [--workload W] [--dist D]
#       [--threads T] [--concurrency C] [--stream-mbps M] [--port BASE]
#       [--build DIR] [--quick] [--keep]
#
# Once: start n1..n3 (rf 2) and a kvrouter, load N keys of B bytes through
# the router with kvbench, stop everything and keep the data dirs. Each
# round: copy the kept dirs, start n1..n3, the router and an empty n4; run
# kvbench (workload W, T threads x C in flight, --timeline 500 ms) through
# the router; after S_warmup + S_baseline seconds run
# `kvctl node add n4=ADDR --json` (default throttle: each node's
# --stream-mbps, 16 MiB/s, unless --stream-mbps is given), keep kvbench
# running S_after seconds past its end, then stop it (SIGINT: it still
# reports). Windows of the kvbench timeline (whole 500 ms intervals):
#   baseline = from warm-up end to the start of kvctl,
#   during   = while kvctl ran (map e+1, streams, hint drain, map e+2),
#   after    = the S_after seconds that follow.
# The streaming figures come from kvctl's last line ({"event":"done",
# "keys","bytes","seconds"}: seconds from the streams' start to the
# completed map); `streams_s` is when its progress lines first showed every
# stream done. Targets (issue 13): during/baseline throughput >= 0.8 and
# p99 <= 2x.
#
# stdout: one JSON object per round, the summary last (median, min and max
# over the rounds); stderr: progress and a table. Each round records the
# 1-minute load average at its start and end and `ctests`, the ctest
# processes seen when kvctl started plus when it ended (a test suite beside
# the benchmark makes its figures noise). Ports BASE (router),
# BASE+1..4 (n1..n4); default 17700. Everything runs under a temp dir that
# is removed on exit, with every process this script started (also on
# Ctrl-C). Default run (1M keys, 3 rounds): about 15 minutes on 2 cores, 5
# of them loading. --quick: 100k keys, 1 round, 3 s warm-up, 8 s baseline.
# --keep: keep the temp dir (data, logs, timelines, kvctl output).
set -euo pipefail
export CL_NAME=elastic_bench
# shellcheck source=bench/cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

keys=1000000 CL_PORT=17700 # and the defaults of cl_opt
while [ $# -gt 0 ]; do
  n=0
  cl_opt "$@" || n=$?
  if [ $n -gt 0 ]; then shift $n; continue; fi
  case "$1" in
    --keys) keys=$2; shift ;;
    --quick) keys=100000 rounds=1 warmup=3 baseline=8 ;;
    -h | --help) sed -n '3,35p' "$0"; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
cl_whole_numbers keys
cl_setup elastic_bench 5

# ---- load once --------------------------------------------------------------------------
cl_log "keys $keys x $vsize B, rf 2, $rounds rounds; workload $workload $dist, $threads x $conc in flight; load average $(cl_load1)"
cl_make_base 2 "$keys" "$vsize"

# ---- rounds -----------------------------------------------------------------------------
# One round; prints its JSON line.
round() { # R
  local r=$1 dir="$TMP/run" done_line st sk sb ss sts n4k
  cl_copy_base "$dir"
  cl_start3 "$dir" 2
  cl_node n4 $((CL_PORT + 4)) "$dir/n4"
  cl_wait_serving 3
  cl_measure "$dir" "round $r: kvctl node add n4" node add "n4=$(cl_nurl 4)"
  st=$(cl_status)
  done_line=$(grep '"event":"done"' "$dir/kvctl.jsonl" | tail -n 1 || true)
  sk=$(jnum keys <<< "$done_line") sb=$(jnum bytes <<< "$done_line") ss=$(jnum seconds <<< "$done_line")
  sts=$(awk '/"event":"progress"/ { d = $0; sub(/.*"streams_done":/, "", d); d += 0
      s = $0; sub(/.*"streams":/, "", s); s += 0; e = $0; sub(/.*"elapsed_s":/, "", e)
      if (s > 0 && d == s) { print e + 0; exit } }' "$dir/kvctl.jsonl")
  n4k=$(cl_node_stat "$st" n4 keys)
  printf '{"round":%d,"keys":%d,"value_size":%d,"kvctl_rc":%d,' "$r" "$keys" "$vsize" "$KVCTL_RC"
  printf '"stream_keys":%s,"stream_bytes":%s,"stream_s":%s,"streams_s":%s,"kvctl_s":%s,' \
    "${sk:-null}" "${sb:-null}" "${ss:-null}" "${sts:-null}" "$(ratio $((K1 - K0)) 1000)"
  printf '"stream_mib_s":%s,"stream_mb_s":%s,"stream_keys_s":%s,%s' \
    "$(ratio "$(awk -v b="${sb:-0}" 'BEGIN { print b / 1048576 }')" "${ss:-0}")" \
    "$(ratio "$(awk -v b="${sb:-0}" 'BEGIN { print b / 1e6 }')" "${ss:-0}")" \
    "$(ratio "${sk:-0}" "${ss:-0}")" "$WINDOWS"
  printf ',"n4_keys":%s,"n4_share":%s,"load1_start":%s,"load1_end":%s,"ctests":%d}\n' \
    "${n4k:-null}" "$(ratio "${n4k:-0}" $((keys * 2 / 4)))" "$L0" "$L1" "$CT"
  cp "$dir/kvctl.jsonl" "$TMP/kvctl.$r.jsonl"
  cl_stop_all
  cl_done_dir "$dir" "run.$r"
}

: > "$TMP/rounds.jsonl"
for r in $(seq "$rounds"); do
  round "$r" >> "$TMP/rounds.jsonl" # not in a pipe: a subshell would hide its pids from cl_cleanup
  line=$(tail -n 1 "$TMP/rounds.jsonl")
  echo "$line"
  cl_log "round $r: streamed $(jnum stream_keys <<< "$line") keys in $(jnum stream_s <<< "$line") s ($(jnum stream_mib_s <<< "$line") MiB/s); throughput x$(jnum tput_ratio <<< "$line"), p99 x$(jnum p99_ratio <<< "$line") of baseline; errors $(jnum during_errors <<< "$line")"
done

# ---- summary ----------------------------------------------------------------------------
cl_summary_start elastic_bench 2
cl_summarize "$TMP/rounds.jsonl" stream_s streams_s kvctl_s stream_mib_s stream_mb_s stream_keys_s \
  base_ops_s during_ops_s after_ops_s base_p99_us during_p99_us after_p99_us tput_ratio p99_ratio \
  n4_share load1_start load1_end
errs=$(cl_client_errors "$TMP/rounds.jsonl")
fails=$(grep -vc '"kvctl_rc":0,' "$TMP/rounds.jsonl" || true)
SUMMARY+=",\"client_errors\":$errs,\"failed_rounds\":$fails"
SUMMARY+=",\"tput_target_met\":$(cl_met "${MED[tput_ratio]}" 0.8 ge),\"p99_target_met\":$(cl_met "${MED[p99_ratio]}" 2 le)}"
cl_table "$TMP/rounds.jsonl" stream_s kvctl_s stream_mib_s stream_keys_s base_ops_s during_ops_s \
  base_p99_us during_p99_us tput_ratio p99_ratio load1_end
echo "targets: throughput during >= 0.8x baseline: $(cl_met "${MED[tput_ratio]}" 0.8 ge); p99 during <= 2x: $(cl_met "${MED[p99_ratio]}" 2 le); client errors $errs; failed rounds $fails" >&2
echo "$SUMMARY"
