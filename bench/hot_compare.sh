#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 7, "Effect" and "Overhead": cluster hot-key hints on vs off at zipf
# theta 1.22, and router forwarding throughput with hot-key detection on vs
# off, in one run on loopback.
#
#   bench/hot_compare.sh [-b BUILD_DIR] [-s SECONDS] [-r ROUNDS] [-k KEYS]
#                        [-m MEM_MB] [-T HOT_THRESHOLD] [-t THREADS]
#                        [-c CONCURRENCY] [-p BASE_PORT] [-q] [-P]
#
# Three one-node clusters (rf 1) with identical nodes (--mem-mb MEM_MB: the
# HotRing gets MEM_MB*1024 buckets, so KEYS = 8x that gives rings of about 8
# items and head placement matters):
#   A: node a1 (--hot-threshold HOT_THRESHOLD) behind router "hints";
#   B: node b1 (--hot-threshold 0: hints off, it pins nothing) behind router
#      "nohints" (detection on, like "hints": the routers do the same work);
#   C: node c1 (--hot-threshold 0) behind router "on" (detection on) and
#      router "off" (--hot-sample 0: detection off).
# A and B get the same reads (HotRing's own sampling keeps improving head
# placement with every read, so their read histories must match).
# After loading KEYS keys (16-byte values) into all and a warm-up, each
# round runs kvbench (workload C, zipf THETA) once through "hints",
# "nohints", "on" and "off", reversing the order every other round, then
# through "on" and "off" at once (two kvbench processes sharing the
# machine's noise):
#   hints on vs off  = "hints" vs "nohints"  (node-side effect of the pins)
#   detection on/off = "on" vs "off"         (router cost; same node)
# Node-side index figures are admin.Stats deltas over each run, from 1.5 s
# after its start (for "hints", from when a1 has pins again: an idle router
# withdraws its reports, so pins come back one window into each run). One
# JSON line per run, then the summary as the last line (stdout); progress on
# stderr. Every process started here is stopped, and the temp dir removed,
# on exit and on Ctrl-C. -q: a quick smoke run (1 round of 3 s, 8k keys).
# -P: also profile router "on" with perf for one more run and report the
# share of its CPU samples in the detection code.
set -euo pipefail

build=build secs=5 rounds=3 keys=32768 mem=4 thresh=50 threads=2 conc=16 port=17500 perf=0
theta=1.22
while getopts "b:s:r:k:m:T:t:c:p:qPh" o; do
  case "$o" in
    b) build=$OPTARG ;;
    s) secs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    k) keys=$OPTARG ;;
    m) mem=$OPTARG ;;
    T) thresh=$OPTARG ;;
    t) threads=$OPTARG ;;
    c) conc=$OPTARG ;;
    p) port=$OPTARG ;;
    q) secs=3 rounds=1 keys=8192 mem=1 ;;
    P) perf=1 ;;
    *) sed -n '3,35p' "$0" >&2; exit 2 ;;
  esac
done
# node figures start this long into each run (a quarter of short runs)
skip=$(awk -v s="$secs" 'BEGIN { print (s >= 6 ? 1.5 : s / 4) }')
command -v jq > /dev/null || { echo "$0: needs jq" >&2; exit 2; }
for b in node/kvnode shard/kvrouter client/kvctl bench/kvbench/kvbench; do
  [ -x "$build/$b" ] || { echo "$0: missing $build/$b (build first)" >&2; exit 2; }
done

log() { echo "hot_compare: $*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }

tmp=$(mktemp -d /tmp/hot_compare.XXXXXX)
pids=()
declare -A pid_of # address -> pid of the node or router listening there
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null || true
    wait "$p" 2> /dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

url() { echo "tcp://127.0.0.1:$((port + $1))"; }
na=$(url 1) nb=$(url 2) nc=$(url 3)
rhints=$(url 10) rnohints=$(url 11) ron=$(url 12) roff=$(url 13)
for a in "$na" "$nb" "$nc" "$rhints" "$rnohints" "$ron" "$roff"; do
  p=${a##*:}
  if (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null; then
    echo "$0: port $p is in use (pick another base with -p)" >&2
    exit 2
  fi
done
kvctl=("$build/client/kvctl" --timeout 5000)

wait_ping() { # ADDR
  for _ in $(seq 100); do
    "${kvctl[@]}" --router "$1" ping > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$0: $1 did not come up; logs:" >&2
  tail -n 5 "$tmp"/*.log >&2
  return 1
}
start_node() { # ID ADDR HOT_THRESHOLD
  "$build/node/kvnode" --id "$1" --listen "$2" --data-dir "$tmp/$1" --mem-mb "$mem" \
    --hot-threshold "$3" > "$tmp/$1.log" 2>&1 &
  pids+=($!)
  pid_of[$2]=$!
  wait_ping "$2"
  "${kvctl[@]}" cluster init --rf 1 "$1=$2" > /dev/null
}
start_router() { # NAME ADDR SEED [FLAGS...]
  local name=$1 addr=$2 seed=$3
  shift 3
  "$build/shard/kvrouter" --listen "$addr" --seeds "$seed" "$@" > "$tmp/$name.log" 2>&1 &
  pids+=($!)
  pid_of[$addr]=$!
  wait_ping "$addr"
  for _ in $(seq 100); do # until the router has the map
    "${kvctl[@]}" --router "$addr" status > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# The node's counters we take deltas of, as one JSON object.
snap() { # NODE_ADDR
  "${kvctl[@]}" --router "$1" status --verbose --json | jq -c '.nodes[0].stats | {
    reads: (.["index.reads"] | tonumber), visited: (.["index.visited"] | tonumber),
    head_hits: (.["index.head_hits"] | tonumber),
    pinned_reads: (.["index.pinned_reads"] | tonumber),
    pinned_head_hits: (.["index.pinned_head_hits"] | tonumber),
    pinned: (.["hot.pinned"] | tonumber), buckets: (.["index.buckets"] | tonumber),
    sample_rounds: (.["index.sample_rounds"] | tonumber),
    head_moves: (.["index.head_moves"] | tonumber),
    keys: (.keys | tonumber), evictions: (.["memory.evictions"] | tonumber)}'
}

bench() { # ROUTER SECONDS [FLAGS...]
  local r=$1 s=$2
  shift 2
  timeout $((${s%.*} + 180)) "$build/bench/kvbench/kvbench" --router "$r" --workload C \
    --dist zipf --theta "$theta" --keys "$keys" --value-size 16 --threads "$threads" \
    --concurrency "$conc" --seconds "$s" --report-top 0 "$@" 2> "$tmp/kvbench.err" | tail -n 1
}

# CPU time (user + system, clock ticks) a process has used so far.
cpu_ticks() { # PID
  awk '{ print $14 + $15 }' "/proc/$1/stat"
}
tick_us=$((1000000 / $(getconf CLK_TCK)))

# One measured run: prints its JSON line (stdout) and keeps it for the summary.
run() { # KIND ROUND ROUTER NODE
  local before after sum l b rc0 nc0 rc1 nc1
  l=$(load1)
  rc0=$(cpu_ticks "${pid_of[$3]}") nc0=$(cpu_ticks "${pid_of[$4]}")
  bench "$3" "$secs" > "$tmp/run.json" &
  b=$!
  sleep "$skip"
  if [ "$1" = hints_on ]; then
    for _ in $(seq 20); do
      [ "$(snap "$4" | jq .pinned)" -gt 0 ] && break
      sleep 0.1
    done
  fi
  before=$(snap "$4")
  wait "$b" || true
  rc1=$(cpu_ticks "${pid_of[$3]}") nc1=$(cpu_ticks "${pid_of[$4]}")
  after=$(snap "$4")
  sum=$(cat "$tmp/run.json")
  [ -n "$sum" ] || { echo "$0: kvbench failed:" >&2; cat "$tmp/kvbench.err" >&2; exit 1; }
  jq -cn --arg kind "$1" --argjson round "$2" --argjson b "$before" --argjson a "$after" \
    --argjson s "$sum" --argjson load1 "$l" --argjson rcpu $(((rc1 - rc0) * tick_us)) \
    --argjson ncpu $(((nc1 - nc0) * tick_us)) '{run: $kind, round: $round,
      ops: $s.ops, seconds: $s.seconds, ops_per_s: $s.ops_per_s, p50_us: $s.p50_us,
      p99_us: $s.p99_us, errors: $s.errors, load1: $load1,
      router_cpu_us: $rcpu, node_cpu_us: $ncpu,
      router_us_per_op: ($rcpu / $s.ops), node_us_per_op: ($ncpu / $s.ops),
      index_reads: ($a.reads - $b.reads), index_visited: ($a.visited - $b.visited),
      head_hits: ($a.head_hits - $b.head_hits),
      pinned_reads: ($a.pinned_reads - $b.pinned_reads),
      pinned_head_hits: ($a.pinned_head_hits - $b.pinned_head_hits), pinned_keys: $a.pinned,
      sample_rounds: ($a.sample_rounds - $b.sample_rounds),
      head_moves: ($a.head_moves - $b.head_moves)}
    | . + {visited_per_read: (if .index_reads > 0 then .index_visited / .index_reads else null end),
           head_hit: (if .index_reads > 0 then .head_hits / .index_reads else null end)}' |
    tee -a "$tmp/runs.jsonl"
  log "$(jq -r 'def r3: if . == null then null else . * 1000 | round / 1000 end;
    "round \(.round) \(.run): \(.ops_per_s) ops/s, visited/read \(.visited_per_read | r3),
    head hit \(.head_hit | r3), pinned keys \(.pinned_keys), CPU us/op router
    \(.router_us_per_op | r3) node \(.node_us_per_op | r3), errors \(.errors),
    load \(.load1)"' <<< "$(tail -n 1 "$tmp/runs.jsonl")" | tr -s ' \n' ' ')"
}

load_start=$(load1)
t0=$(date +%s)
log "keys $keys, --mem-mb $mem, $rounds rounds of $secs s, load average $load_start"
start_node a1 "$na" "$thresh"
start_node b1 "$nb" 0
start_node c1 "$nc" 0
start_router hints "$rhints" "$na"
start_router nohints "$rnohints" "$nb"
start_router on "$ron" "$nc"
ron_pid=${pids[-1]}
start_router off "$roff" "$nc" --hot-sample 0
log "loading $keys keys into the nodes"
loaders=()
for r in "$rhints" "$rnohints"; do
  bench "$r" 0.1 --load --concurrency 64 > /dev/null &
  loaders+=($!)
done
bench "$roff" 0.1 --load --concurrency 64 > /dev/null
for l in "${loaders[@]}"; do wait "$l"; done
for n in "$na" "$nb" "$nc"; do
  s=$(snap "$n")
  k=$(jq .keys <<< "$s") bk=$(jq .buckets <<< "$s") ev=$(jq .evictions <<< "$s")
  [ "$k" -eq "$keys" ] || { echo "$0: node $n holds $k keys, not $keys" >&2; exit 1; }
  [ "$ev" -eq 0 ] || log "warning: $ev evictions on $n: rings are thinner than keys/buckets"
done
log "$keys keys in $bk buckets per node ($((keys / bk)) per ring)"

log "warm-up: ${secs} s through each router"
bench "$rhints" "$secs" > /dev/null
log "a1 pinned $(snap "$na" | jq .pinned) keys (--hot-threshold $thresh ops/s)"
bench "$rnohints" "$secs" > /dev/null
bench "$ron" "$secs" > /dev/null

# Both routers of cluster C at once, one kvbench each: they share whatever
# else the machine runs at that moment, so their ratio is a second, less
# noisy, estimate of the detection overhead.
concurrent() { # ROUND
  local on off
  bench "$ron" "$secs" > "$tmp/conc_on.json" &
  on=$!
  off=$(bench "$roff" "$secs")
  wait "$on"
  jq -cn --argjson round "$1" --argjson a "$(cat "$tmp/conc_on.json")" --argjson b "$off" \
    '{run: "concurrent", round: $round, detect_on_ops: $a.ops_per_s,
      detect_off_ops: $b.ops_per_s, overhead_ratio: ($a.ops_per_s / $b.ops_per_s),
      errors: ($a.errors + $b.errors)}' | tee -a "$tmp/conc.jsonl"
  log "round $1 concurrent: on $(jq .detect_on_ops < <(tail -n 1 "$tmp/conc.jsonl")) ops/s, off $(
    jq .detect_off_ops < <(tail -n 1 "$tmp/conc.jsonl")) ops/s"
}

for i in $(seq 1 "$rounds"); do
  if [ $((i % 2)) -eq 1 ]; then
    run hints_on "$i" "$rhints" "$na"
    run hints_off "$i" "$rnohints" "$nb"
    run detect_on "$i" "$ron" "$nc"
    run detect_off "$i" "$roff" "$nc"
  else
    run detect_off "$i" "$roff" "$nc"
    run detect_on "$i" "$ron" "$nc"
    run hints_off "$i" "$rnohints" "$nb"
    run hints_on "$i" "$rhints" "$na"
  fi
  concurrent "$i"
done

# With -P: where the "on" router spends its CPU during one more run, and the
# share of it in the detection code (hk_* sketch and window functions and
# router_hot_*, the forwarding-path hook included).
detect_cpu=null
if [ "$perf" = 1 ]; then
  log "perf: ${secs} s through router on"
  bench "$ron" "$secs" > /dev/null &
  pb=$!
  perf record -F 999 -o "$tmp/perf.data" -p "$ron_pid" -- sleep "$secs" > /dev/null 2>&1 || true
  wait "$pb"
  perf report -i "$tmp/perf.data" --no-children --sort symbol --stdio -q 2> /dev/null |
    awk '$1 ~ /%$/ { sub("%", "", $1); all += $1; if ($3 ~ /^(hk_|router_hot)/) hot += $1 }
      END { if (all > 0) printf "%.4f\n", hot / all; else print "null" }' > "$tmp/perf.share"
  detect_cpu=$(cat "$tmp/perf.share")
  log "share of the on router's CPU samples in detection code: $detect_cpu"
fi
load_end=$(load1)
log "done in $(($(date +%s) - t0)) s, load average $load_end"

jq -cs --slurpfile conc "$tmp/conc.jsonl" --argjson detect_cpu "$detect_cpu" --argjson keys "$keys" --argjson buckets "$bk" --argjson theta "$theta" \
  --argjson l0 "$load_start" --argjson l1 "$load_end" '
  def kind($k): map(select(.run == $k));
  def rate($k): (kind($k) | (map(.ops) | add) / (map(.seconds) | add));
  def ratio($a; $b): if $b > 0 then $a / $b else null end;
  def sum($k; $f): kind($k) | map(.[$f]) | add;
  def round3: . * 1000 | round / 1000;
  def round4: . * 10000 | round / 10000;
  def median: sort | if length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  . as $runs | {summary: true, bench: "hot_compare", workload: "C", theta: $theta,
    keys: $keys, buckets: $buckets, keys_per_ring: ($keys / $buckets),
    hints_on_ops: (rate("hints_on") | round), hints_off_ops: (rate("hints_off") | round),
    hints_ratio: (ratio(rate("hints_on"); rate("hints_off")) | round3),
    visited_on: (ratio(sum("hints_on"; "index_visited"); sum("hints_on"; "index_reads")) | round3),
    visited_off: (ratio(sum("hints_off"; "index_visited"); sum("hints_off"; "index_reads")) | round3),
    head_hit_on: (ratio(sum("hints_on"; "head_hits"); sum("hints_on"; "index_reads")) | round4),
    head_hit_off: (ratio(sum("hints_off"; "head_hits"); sum("hints_off"; "index_reads")) | round4),
    pinned_head_hit: (ratio(sum("hints_on"; "pinned_head_hits"); sum("hints_on"; "pinned_reads"))
                      | if . == null then null else round4 end),
    pinned_read_share: (ratio(sum("hints_on"; "pinned_reads"); sum("hints_on"; "index_reads"))
                        | round4),
    pinned_keys: (kind("hints_on") | last | .pinned_keys),
    pinned_keys_off: (kind("hints_off") + kind("detect_on") | map(.pinned_keys) | max),
    detect_on_ops: (rate("detect_on") | round), detect_off_ops: (rate("detect_off") | round),
    overhead_ratio: (ratio(rate("detect_on"); rate("detect_off")) | round3),
    router_us_per_op_on: (sum("detect_on"; "router_cpu_us") / sum("detect_on"; "ops") | round3),
    router_us_per_op_off: (sum("detect_off"; "router_cpu_us") / sum("detect_off"; "ops") | round3),
    overhead_cpu_ratio: (ratio(sum("detect_off"; "router_cpu_us") / sum("detect_off"; "ops");
                               sum("detect_on"; "router_cpu_us") / sum("detect_on"; "ops")) | round3),
    node_us_per_op_hints_on: (sum("hints_on"; "node_cpu_us") / sum("hints_on"; "ops") | round3),
    node_us_per_op_hints_off: (sum("hints_off"; "node_cpu_us") / sum("hints_off"; "ops") | round3),
    overhead_ratio_rounds: ([range(1; ($runs | map(.round) | max) + 1) as $r |
      ratio($runs | map(select(.round == $r and .run == "detect_on"))[0].ops_per_s;
            $runs | map(select(.round == $r and .run == "detect_off"))[0].ops_per_s) | round3]),
    hints_ratio_rounds: ([range(1; ($runs | map(.round) | max) + 1) as $r |
      ratio($runs | map(select(.round == $r and .run == "hints_on"))[0].ops_per_s;
            $runs | map(select(.round == $r and .run == "hints_off"))[0].ops_per_s) | round3]),
    overhead_ratio_concurrent: (($conc | map(.detect_on_ops) | add) /
                                ($conc | map(.detect_off_ops) | add) | round3),
    overhead_ratio_concurrent_rounds: ($conc | map(.overhead_ratio | round3)),
    detect_cpu_share: $detect_cpu,
    errors: (map(.errors) | add + ($conc | map(.errors) | add)), load1_start: $l0,
    load1_end: $l1}
  | . + {overhead_ratio_median: (.overhead_ratio_rounds | median | round3),
         hints_ratio_median: (.hints_ratio_rounds | median | round3)}' \
  "$tmp/runs.jsonl"
