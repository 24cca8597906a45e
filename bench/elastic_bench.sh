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
# over the rounds); stderr: progress and a table. Ports BASE (router),
# BASE+1..4 (n1..n4); default 17700. Everything runs under a temp dir that
# is removed on exit, with every process this script started (also on
# Ctrl-C). Default run (1M keys, 3 rounds): about 10-15 minutes on 2 cores.
# --quick: 100k keys, 1 round, 3 s warm-up, 8 s baseline. --keep: keep the
# temp dir (data, logs, timelines, kvctl output) for a look afterwards.
set -euo pipefail

BUILD=build keys=1000000 vsize=100 rounds=3 warmup=5 baseline=20 after=5 workload=A
dist=zipf threads=2 conc=16 mbps=0 port=17700
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) keys=$2; shift ;;
    --value-size) vsize=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    --after) after=$2; shift ;;
    --workload) workload=$2; shift ;;
    --dist) dist=$2; shift ;;
    --threads) threads=$2; shift ;;
    --concurrency) conc=$2; shift ;;
    --stream-mbps) mbps=$2; shift ;;
    --port) port=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --quick) keys=100000 rounds=1 warmup=3 baseline=8 ;;
    --keep) CL_KEEP=1 ;;
    -h | --help) sed -n '3,35p' "$0"; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
for v in keys vsize rounds warmup baseline after threads conc mbps port; do
  case "${!v}" in '' | *[!0-9]*) echo "$0: --$v must be a whole number" >&2; exit 2 ;; esac
done
[ "$rounds" -ge 1 ] && [ "$baseline" -ge 2 ] || { echo "$0: --rounds >= 1, --baseline >= 2" >&2; exit 2; }
for b in node/kvnode shard/kvrouter client/kvctl bench/kvbench/kvbench; do
  [ -x "$BUILD/$b" ] || { echo "$0: missing $BUILD/$b (build first)" >&2; exit 2; }
done
CL_NAME=elastic_bench
. "$(dirname "$0")/cluster_lib.sh"
cl_ports_free "$port" $((port + 1)) $((port + 2)) $((port + 3)) $((port + 4)) || exit 2

TMP=$(mktemp -d /tmp/elastic_bench.XXXXXX)
trap cl_cleanup EXIT
trap 'exit 130' INT TERM
router=$(cl_url "$port")
seeds=$(cl_url $((port + 1))),$(cl_url $((port + 2))),$(cl_url $((port + 3)))
n4=$(cl_url $((port + 4)))
mbps_flag=()
[ "$mbps" -gt 0 ] && mbps_flag=(--stream-mbps "$mbps")

start_cluster() { # DATA_DIR
  for i in 1 2 3; do cl_node "n$i" $((port + i)) "$1/n$i"; done
  [ -f "$1/.init" ] || {
    cl_kvctl --router "$(cl_url $((port + 1)))" cluster init --rf 2 \
      "n1=$(cl_url $((port + 1)))" "n2=$(cl_url $((port + 2)))" "n3=$(cl_url $((port + 3)))" > /dev/null
    touch "$1/.init"
  }
  cl_router "$port" "$seeds"
}

# Waits (60 s) until the router's status shows N nodes serving.
wait_serving() { # N
  for _ in $(seq 300); do
    [ "$(cl_kvctl --router "$router" --json status 2> /dev/null | grep -o '"serving":"serving"' | wc -l)" -ge "$1" ] && return 0
    sleep 0.2
  done
  cl_log "the nodes did not all serve within 60 s"
  return 1
}

# A node's admin.Stats value NAME from a `kvctl --json status` line.
node_stat() { # STATUS_JSON ID NAME
  awk -v id="{\"id\":\"$2\"" -v k="\"$3\":\"" '{ i = index($0, id); if (!i) exit
    s = substr($0, i); j = index(s, k); if (!j) exit; s = substr(s, j + length(k))
    print substr(s, 1, index(s, "\"") - 1) }' <<< "$1"
}

# ---- load once --------------------------------------------------------------------------
cl_log "keys $keys x $vsize B, rf 2, $rounds rounds; workload $workload $dist, $threads x $conc in flight; load average $(cl_load1)"
start_cluster "$TMP/base"
cl_fg load "$BUILD/bench/kvbench/kvbench" --router "$router" --keys "$keys" --value-size "$vsize" \
  --report-top 0 --timeout-ms 30000 --load --load-seconds 3600 --workload C --seconds 0.2 \
  --threads 2 --concurrency 32 > "$TMP/load.json" 2> "$TMP/load.err" || true
loaded=$(tail -n 1 "$TMP/load.json" | jnum loaded)
[ "${loaded:-0}" = "$keys" ] || { cl_log "load failed:"; tail -n 5 "$TMP/load.err" >&2; exit 1; }
load_s=$(tail -n 1 "$TMP/load.json" | jnum load_s)
cl_log "loaded $loaded keys in $load_s s; stopping to keep the data dirs"
cl_stop_all
du_mb=$(du -sm "$TMP/base" | cut -f1)

# ---- rounds -----------------------------------------------------------------------------
# One round; prints its JSON line.
round() { # R
  local r=$1 dir="$TMP/run" l0 l1 t0 k0 k1 rc=0 bp done_line st
  rm -rf "$dir"
  cp -a "$TMP/base" "$dir"
  start_cluster "$dir"
  cl_node n4 $((port + 4)) "$dir/n4"
  wait_serving 3
  l0=$(cl_load1)
  "$BUILD/bench/kvbench/kvbench" --router "$router" --keys "$keys" --value-size "$vsize" \
    --report-top 0 --timeout-ms 10000 --workload "$workload" --dist "$dist" \
    --threads "$threads" --concurrency "$conc" --seconds 3600 --timeline "$dir/tl.jsonl" \
    --timeline-ms 500 > "$dir/kvbench.json" 2> "$dir/kvbench.err" &
  bp=$!
  CL_PID[kvbench]=$bp
  cl_sleep $((warmup + baseline))
  cl_log "round $r: kvctl node add n4 (load average $(cl_load1))"
  k0=$(cl_now_ms)
  cl_fg kvctl timeout 3600 "$BUILD/client/kvctl" --router "$router" --timeout 30000 --json \
    "${mbps_flag[@]}" node add "n4=$n4" > "$dir/kvctl.jsonl" 2> "$dir/kvctl.err" || rc=$?
  k1=$(cl_now_ms)
  cl_sleep "$after"
  cl_stop kvbench INT 300 # it reports what it measured and writes the timeline
  l1=$(cl_load1)
  st=$(cl_kvctl --router "$router" --json status 2> /dev/null || true)
  cp "$dir/kvctl.jsonl" "$TMP/kvctl.$r.jsonl"
  cl_stop_all
  [ $rc -eq 0 ] || { cl_log "round $r: kvctl node add failed ($rc):"; tail -n 3 "$dir/kvctl.err" >&2; }
  done_line=$(grep '"event":"done"' "$dir/kvctl.jsonl" | tail -n 1 || true)
  [ -n "$done_line" ] || done_line='{}'
  t0=$(head -n 1 "$dir/tl.jsonl" | jnum unix_ms)
  local b d a s_keys s_bytes s_secs streams_s
  read -r -a b <<< "$(tl_window "$dir/tl.jsonl" $((t0 + warmup * 1000)) "$k0")"
  read -r -a d <<< "$(tl_window "$dir/tl.jsonl" "$k0" "$k1")"
  read -r -a a <<< "$(tl_window "$dir/tl.jsonl" "$k1" $((k1 + after * 1000)))"
  s_keys=$(jnum keys <<< "$done_line") s_bytes=$(jnum bytes <<< "$done_line")
  s_secs=$(jnum seconds <<< "$done_line")
  streams_s=$(awk '/"event":"progress"/ { d = $0; sub(/.*"streams_done":/, "", d); d += 0
      s = $0; sub(/.*"streams":/, "", s); s += 0; e = $0; sub(/.*"elapsed_s":/, "", e)
      if (s > 0 && d == s) { print e + 0; exit } }' "$dir/kvctl.jsonl")
  local n4k
  n4k=$(node_stat "$st" n4 keys)
  awk -v r="$r" -v keys="$keys" -v vs="$vsize" -v l0="$l0" -v l1="$l1" -v rc="$rc" \
    -v sk="${s_keys:-0}" -v sb="${s_bytes:-0}" -v ss="${s_secs:-0}" -v sts="${streams_s:-null}" \
    -v ks="$((k1 - k0))" -v n4k="${n4k:-null}" \
    -v bo="${b[0]}" -v b50="${b[1]}" -v b99="${b[2]}" -v be="${b[3]}" -v bs="${b[4]}" \
    -v do_="${d[0]}" -v d50="${d[1]}" -v d99="${d[2]}" -v de="${d[3]}" -v ds="${d[4]}" \
    -v ao="${a[0]}" -v a50="${a[1]}" -v a99="${a[2]}" -v ae="${a[3]}" -v as="${a[4]}" '
    function rt(x, y) { return y > 0 ? sprintf("%.3f", x / y) : "null" }
    BEGIN {
      printf "{\"round\":%d,\"keys\":%d,\"value_size\":%d,\"kvctl_rc\":%d,", r, keys, vs, rc
      printf "\"stream_keys\":%d,\"stream_bytes\":%d,\"stream_s\":%s,\"streams_s\":%s,\"kvctl_s\":%.3f,", sk, sb, ss, sts, ks / 1000
      printf "\"stream_mib_s\":%s,\"stream_mb_s\":%s,\"stream_keys_s\":%s,", rt(sb / 1048576, ss), rt(sb / 1e6, ss), (ss > 0 ? sprintf("%.0f", sk / ss) : "null")
      printf "\"base_ops_s\":%s,\"base_p50_us\":%s,\"base_p99_us\":%s,\"base_errors\":%d,\"base_s\":%s,", bo, b50, b99, be, bs
      printf "\"during_ops_s\":%s,\"during_p50_us\":%s,\"during_p99_us\":%s,\"during_errors\":%d,\"during_s\":%s,", do_, d50, d99, de, ds
      printf "\"after_ops_s\":%s,\"after_p50_us\":%s,\"after_p99_us\":%s,\"after_errors\":%d,", ao, a50, a99, ae
      printf "\"tput_ratio\":%s,\"p99_ratio\":%s,\"n4_keys\":%s,\"n4_share\":%s,", rt(do_, bo), rt(d99, b99), n4k, (n4k == "null" ? "null" : rt(n4k, keys * 2 / 4))
      printf "\"load1_start\":%s,\"load1_end\":%s}\n", l0, l1 }'
  [ -n "${CL_KEEP:-}" ] && mv "$dir" "$TMP/run.$r" || rm -rf "$dir"
}

: > "$TMP/rounds.jsonl"
for r in $(seq "$rounds"); do
  round "$r" >> "$TMP/rounds.jsonl" # not in a pipe: a subshell would hide its pids from cl_cleanup
  line=$(tail -n 1 "$TMP/rounds.jsonl")
  echo "$line"
  cl_log "round $r: streamed $(jnum stream_keys <<< "$line") keys in $(jnum stream_s <<< "$line") s ($(jnum stream_mib_s <<< "$line") MiB/s); throughput x$(jnum tput_ratio <<< "$line"), p99 x$(jnum p99_ratio <<< "$line") of baseline; errors $(jnum during_errors <<< "$line")"
done

# ---- summary ----------------------------------------------------------------------------
col() { local f=$1; while read -r l; do jnum "$f" <<< "$l"; done < "$TMP/rounds.jsonl" | grep -v null || true; }
summary='{"summary":true,"bench":"elastic_bench"'
summary+=",\"keys\":$keys,\"value_size\":$vsize,\"rf\":2,\"rounds\":$rounds,\"workload\":\"$workload\",\"dist\":\"$dist\""
summary+=",\"threads\":$threads,\"concurrency\":$conc,\"stream_mbps\":$( [ "$mbps" -gt 0 ] && echo "$mbps" || echo '"default"')"
summary+=",\"load_s\":$load_s,\"data_mb\":$du_mb"
fields=(stream_s streams_s kvctl_s stream_mib_s stream_mb_s stream_keys_s base_ops_s during_ops_s after_ops_s base_p99_us during_p99_us after_p99_us tput_ratio p99_ratio n4_share load1_start load1_end)
declare -A med
for f in "${fields[@]}"; do
  read -r m lo hi <<< "$(stats3 $(col "$f"))"
  med[$f]=$m
  summary+=",\"$f\":$m,\"${f}_min\":$lo,\"${f}_max\":$hi"
done
errs=0
for v in $(col during_errors) $(col base_errors) $(col after_errors); do errs=$((errs + ${v%.*})); done
fails=0
for v in $(col kvctl_rc); do [ "$v" = 0 ] || fails=$((fails + 1)); done
met() { awk -v x="$1" -v t="$2" -v op="$3" 'BEGIN { if (x == "null") print "null"; else if (op == "ge") print (x >= t ? "true" : "false"); else print (x <= t ? "true" : "false") }'; }
summary+=",\"client_errors\":$errs,\"failed_rounds\":$fails"
summary+=",\"tput_target_met\":$(met "${med[tput_ratio]}" 0.8 ge),\"p99_target_met\":$(met "${med[p99_ratio]}" 2 le)}"

{
  printf '\n%-6s %9s %9s %10s %11s %10s %10s %9s %9s %7s %7s %6s\n' round stream_s kvctl_s "MiB/s" "keys/s" base_ops/s dur_ops/s base_p99 dur_p99 tput_x p99_x load1
  while read -r l; do
    printf '%-6s %9s %9s %10s %11s %10s %10s %9s %9s %7s %7s %6s\n' "$(jnum round <<< "$l")" \
      "$(jnum stream_s <<< "$l")" "$(jnum kvctl_s <<< "$l")" "$(jnum stream_mib_s <<< "$l")" \
      "$(jnum stream_keys_s <<< "$l")" "$(jnum base_ops_s <<< "$l")" "$(jnum during_ops_s <<< "$l")" \
      "$(jnum base_p99_us <<< "$l")" "$(jnum during_p99_us <<< "$l")" "$(jnum tput_ratio <<< "$l")" \
      "$(jnum p99_ratio <<< "$l")" "$(jnum load1_end <<< "$l")"
  done < "$TMP/rounds.jsonl"
  printf '%-6s %9s %9s %10s %11s %10s %10s %9s %9s %7s %7s\n' median "${med[stream_s]}" \
    "${med[kvctl_s]}" "${med[stream_mib_s]}" "${med[stream_keys_s]}" "${med[base_ops_s]}" \
    "${med[during_ops_s]}" "${med[base_p99_us]}" "${med[during_p99_us]}" "${med[tput_ratio]}" \
    "${med[p99_ratio]}"
  echo "targets: throughput during >= 0.8x baseline: $(met "${med[tput_ratio]}" 0.8 ge); p99 during <= 2x: $(met "${med[p99_ratio]}" 2 le); client errors $errs; failed rounds $fails"
} >&2
echo "$summary"
