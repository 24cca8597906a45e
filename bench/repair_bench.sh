#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 14 "Benchmark": anti-entropy repair of a node that missed 1 % of the
# keys, under a client load, and the hint replay rate; on loopback.
#
#   bench/repair_bench.sh [--keys N] [--differ K] [--hints H] [--value-size B]
#       [--rounds R] [--warmup S] [--baseline S] [--after S] [--workload W]
#       [--dist D] [--threads T] [--concurrency C] [--stream-mbps M]
#       [--port BASE] [--build DIR] [--quick] [--keep]
#
# Once: start n1..n3 (rf 3) and a kvrouter, load N keys of B bytes, stop
# everything and keep the data dirs. Each round copies them and runs:
#
# Repair. Start the nodes with --hint-window 1, SIGKILL n3, wait 2 s (the
# router sees it down), overwrite ids 0..K-1 through the router (QUORUM:
# n1 and n2 take them, their hints for n3 expire after 1 s), wait 3 s and
# restart n3: it reports NEEDS_REPAIR (checked). Then kvbench (workload W,
# T threads x C in flight, --timeline 500 ms) through the router; after
# S_warmup + S_baseline seconds `kvctl repair n3 --json` (default throttle:
# each node's --stream-mbps, 16 MiB/s, unless --stream-mbps), S_after
# seconds more, stop kvbench. Rates from kvctl's last line (keys_compared,
# keys_repaired, bytes, seconds: the whole repair, Merkle digests included);
# client throughput and p99 while kvctl ran against the baseline window
# (target: >= 0.8x throughput). n3 must serve afterwards.
#
# Hint replay. Start the nodes again from the kept dirs (default
# --hint-window), SIGKILL n3, wait 2 s, overwrite ids 0..H-1, read the hints
# n1 and n2 hold for n3 (admin.Stats hints.records / hints.bytes), restart
# n3 and poll until they are 0: replay_s from n3 answering again to the
# drain (drain_s from its restart), hints/s and MB/s over replay_s (the poll
# takes about 0.1-0.3 s, which bounds the resolution; keep H large enough
# that the drain lasts seconds). No client load meanwhile.
#
# stdout: one JSON object per round, the summary last (median, min, max);
# stderr: progress and a table. Rounds record the load average and `ctests`
# (ctest processes seen at the start plus the end of the measured part: a
# test suite beside the benchmark makes its figures noise). Ports BASE (router), BASE+1..3; default
# 17800. Every process is stopped and the temp dir removed on exit.
# Default run (1M keys, 3 rounds): 20-50 minutes on 2 cores, 5-12 of them loading.
# --quick: 100k keys, 1k differing, 50k hints, 1 round, 3 s warm-up, 8 s
# baseline. --keep: keep the temp dir for a look afterwards.
set -euo pipefail
export CL_NAME=repair_bench
# shellcheck source=bench/cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

keys=1000000 differ=10000 hints=200000 CL_PORT=17800 # and the defaults of cl_opt
while [ $# -gt 0 ]; do
  n=0
  cl_opt "$@" || n=$?
  if [ $n -gt 0 ]; then shift $n; continue; fi
  case "$1" in
    --keys) keys=$2; shift ;;
    --differ) differ=$2; shift ;;
    --hints) hints=$2; shift ;;
    --quick) keys=100000 differ=1000 hints=50000 rounds=1 warmup=3 baseline=8 ;;
    -h | --help) sed -n '3,40p' "$0"; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
cl_whole_numbers keys differ hints
if [ "$differ" -gt "$keys" ] || [ "$hints" -gt "$keys" ]; then
  echo "$0: --differ and --hints must be <= --keys" >&2
  exit 2
fi
cl_setup repair_bench 4

# ---- load once --------------------------------------------------------------------------
cl_log "keys $keys x $vsize B, rf 3, $differ differing, $hints hints, $rounds rounds; workload $workload $dist, $threads x $conc in flight; load average $(cl_load1)"
cl_make_base 3 "$keys" "$vsize"

# Kills n3 and overwrites ids 0..N-1 through the router.
miss_writes() { # N
  cl_stop n3 KILL
  cl_sleep 2
  cl_load "$1" "$vsize"
  [ "$(tail -n 1 "$TMP/load.json" | jnum loaded)" = "$1" ] || { cl_log "overwrite failed:"; tail -n 5 "$TMP/load.err" >&2; return 1; }
}

# Waits (TENTHS) until n3's serving state is STATE.
wait_n3() { # STATE TENTHS
  for _ in $(seq "$2"); do
    [ "$(cl_node_stat "$(cl_status)" n3 serving)" = "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

# ---- repair under load: prints the round's repair fields ---------------------------------
repair_part() { # R
  local r=$1 dir="$TMP/run" done_line before after_state secs bytes f
  cl_copy_base "$dir"
  cl_start3 "$dir" 3 --hint-window 1
  cl_wait_serving 3
  miss_writes "$differ"
  cl_sleep 3
  cl_node n3 $((CL_PORT + 3)) "$dir/n3" --hint-window 1
  wait_n3 needs_repair 300 && before=needs_repair || before=$(cl_node_stat "$(cl_status)" n3 serving)
  [ "$before" = needs_repair ] || cl_log "round $r: n3 is '$before', not needs_repair"
  cl_measure "$dir" "round $r: kvctl repair n3" repair n3
  wait_n3 serving 100 && after_state=serving || after_state=$(cl_node_stat "$(cl_status)" n3 serving)
  done_line=$(grep '"event":"done"' "$dir/kvctl.jsonl" | tail -n 1 || true)
  secs=$(jnum seconds <<< "$done_line") bytes=$(jnum bytes <<< "$done_line")
  printf '"kvctl_rc":%d,"n3_before":"%s","n3_after":"%s",' "$KVCTL_RC" "$before" "$after_state"
  for f in ranges leaves_differing records_hashed keys_compared keys_checked keys_repaired bytes; do
    printf '"%s":%s,' "$f" "$(jnum "$f" <<< "$done_line" | grep . || echo null)"
  done
  printf '"repair_s":%s,"kvctl_s":%s,' "${secs:-null}" "$(ratio $((K1 - K0)) 1000)"
  printf '"compared_keys_s":%s,"repaired_keys_s":%s,"hashed_keys_s":%s,"repair_mb_s":%s,' \
    "$(ratio "$(jnum keys_compared <<< "$done_line")" "$secs")" \
    "$(ratio "$(jnum keys_repaired <<< "$done_line")" "$secs")" \
    "$(ratio "$(jnum records_hashed <<< "$done_line")" "$secs")" \
    "$(ratio "$(awk -v b="${bytes:-0}" 'BEGIN { print b / 1e6 }')" "$secs")"
  printf '%s,"load1_start":%s,"load1_end":%s,"ctests":%d' "$WINDOWS" "$L0" "$L1" "$CT"
  cp "$dir/kvctl.jsonl" "$TMP/kvctl.$r.jsonl"
  cl_stop_all
  cl_done_dir "$dir" "repair.$r"
}

# The hints n1 and n2 hold (for n3): "records bytes", "-1 -1" when a peer
# did not report them.
peer_hints() {
  local st
  st=$(cl_status)
  awk -v a="$(cl_node_stat "$st" n1 hints.records)" -v b="$(cl_node_stat "$st" n2 hints.records)" \
    -v c="$(cl_node_stat "$st" n1 hints.bytes)" -v d="$(cl_node_stat "$st" n2 hints.bytes)" \
    'BEGIN { if (a == "" || b == "" || c == "" || d == "") print "-1 -1"; else print a + b, c + d }'
}

# ---- hint replay: prints the round's hint fields ------------------------------------------
hints_part() { # R
  local r=$1 dir="$TMP/run" h0 hb t_start t_up t_end left=1 polls=0 l0 ct
  cl_copy_base "$dir"
  cl_start3 "$dir" 3
  cl_wait_serving 3
  miss_writes "$hints"
  read -r h0 hb <<< "$(peer_hints)"
  l0=$(cl_load1)
  cl_log "round $r: $h0 hints ($hb bytes) for n3; restarting it (load average $l0)"
  ct=$(cl_ctests)
  t_start=$(cl_now_ms)
  cl_node n3 $((CL_PORT + 3)) "$dir/n3"
  t_up=$(cl_now_ms)
  for _ in $(seq 3000); do # 0.1-0.3 s each
    read -r left _ <<< "$(peer_hints)"
    polls=$((polls + 1))
    [ "$left" -eq 0 ] && break
    sleep 0.05
  done
  t_end=$(cl_now_ms)
  [ "$left" -eq 0 ] || cl_log "round $r: $left hints left after $(((t_end - t_start) / 1000)) s"
  local rs=$((t_end - t_up)) ds=$((t_end - t_start))
  printf '"hints":%s,"hint_bytes":%s,"hints_left":%s,"replay_s":%s,"drain_s":%s,"hint_polls":%d,' \
    "$h0" "$hb" "$left" "$(awk -v x="$rs" 'BEGIN { printf "%.3f", x / 1000 }')" \
    "$(awk -v x="$ds" 'BEGIN { printf "%.3f", x / 1000 }')" "$polls"
  ct=$((ct + $(cl_ctests)))
  printf '"replay_hints_s":%s,"replay_mb_s":%s,"load1_hints":%s,"ctests_hints":%d' \
    "$(ratio "$h0" "$(awk -v x="$rs" 'BEGIN { print x / 1000 }')")" \
    "$(ratio "$(awk -v b="$hb" 'BEGIN { print b / 1e6 }')" "$(awk -v x="$rs" 'BEGIN { print x / 1000 }')")" "$l0" "$ct"
  cl_stop_all
  rm -rf "$dir"
}

: > "$TMP/rounds.jsonl"
for r in $(seq "$rounds"); do
  # not in a pipe: a subshell would hide its pids from cl_cleanup
  repair_part "$r" > "$TMP/repair.part"
  hints_part "$r" > "$TMP/hints.part"
  echo "{\"round\":$r,\"keys\":$keys,\"differ\":$differ,$(cat "$TMP/repair.part"),$(cat "$TMP/hints.part")}" >> "$TMP/rounds.jsonl"
  line=$(tail -n 1 "$TMP/rounds.jsonl")
  echo "$line"
  cl_log "round $r: repair compared $(jnum keys_compared <<< "$line") and repaired $(jnum keys_repaired <<< "$line") keys in $(jnum repair_s <<< "$line") s; throughput x$(jnum tput_ratio <<< "$line") of baseline; hints: $(jnum hints <<< "$line") replayed in $(jnum replay_s <<< "$line") s"
done

# ---- summary ----------------------------------------------------------------------------
cl_summary_start repair_bench 3
SUMMARY+=",\"differ\":$differ,\"hints_written\":$hints"
cl_summarize "$TMP/rounds.jsonl" repair_s kvctl_s keys_compared keys_repaired bytes compared_keys_s \
  repaired_keys_s repair_mb_s base_ops_s during_ops_s after_ops_s base_p99_us during_p99_us \
  tput_ratio p99_ratio hints replay_s drain_s replay_hints_s replay_mb_s load1_start load1_end
errs=$(cl_client_errors "$TMP/rounds.jsonl")
fails=$(grep -vc '"kvctl_rc":0,"n3_before":"needs_repair","n3_after":"serving"' "$TMP/rounds.jsonl" || true)
SUMMARY+=",\"client_errors\":$errs,\"failed_rounds\":$fails,\"tput_target_met\":$(cl_met "${MED[tput_ratio]}" 0.8 ge)}"
cl_table "$TMP/rounds.jsonl" repair_s keys_compared keys_repaired compared_keys_s repair_mb_s \
  base_ops_s during_ops_s tput_ratio p99_ratio replay_s replay_hints_s replay_mb_s load1_end
echo "target: throughput during repair >= 0.8x before: $(cl_met "${MED[tput_ratio]}" 0.8 ge); client errors $errs; rounds that failed (kvctl error, n3 not needs_repair before or not serving after): $fails" >&2
echo "$SUMMARY"
