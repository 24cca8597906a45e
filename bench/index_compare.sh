#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs the HotRing comparison matrix of issue 3 with index_bench and prints a
# table of measured ratios against the targets:
#   theta 1.22, ratio 8, C : hotring-s >= 3.0x chain, >= 1.5x lfht, visited/read <= 1.3
#   theta 0.99, ratio 8, C : hotring-s >= 2.0x chain
#   uniform,    ratio 8, C : hotring-s >= 0.95x chain
#   misses,     ratio 16   : hotring-s >= 1.5x chain
#   YCSB-A, 100-byte values, theta 1.22 : hotring-s >= 1.3x chain
#   hot-set shift          : head_hit back to >= 90% of steady within 1 s
#   theta 1.22, ratio 8    : hotring-s >= 1.0x lfht-auto with >= 4x less bucket memory
# Raw JSON lines go to the output directory (one .jsonl per configuration),
# progress to stderr, the table to stdout. Exit status 0 whether or not the
# targets are met (it is a measurement, not a test); 2 on usage errors.
set -euo pipefail

usage() {
  cat <<EOF
usage: $0 [-k KEYS] [-s SECONDS] [-w SECONDS] [-r ROUNDS] [-t THREADS] [-B BATCH] [-q] [-o DIR] [-b INDEX_BENCH] [-x 'extra flags']
  -k KEYS      keys loaded per run (default 4000000)
  -s SECONDS   timed phase per index (default 5; the shift run uses max(4, SECONDS))
  -w SECONDS   index_bench --warmup: each index first runs the workload this long,
               not counted (default 0: the timed phases start right after the
               loads, while HotRing still places its heads; the shift run never
               warms up, its subject is that placement)
  -r ROUNDS    interleave the indexes of a run in ROUNDS slices of SECONDS/ROUNDS
               (default 5; all indexes of a run are loaded at once) so that the
               machine's load drifts alike for all of them
  -t THREADS   worker threads (default 2)
  -B BATCH     index_bench --batch: runs of up to BATCH consecutive reads go to an
               index's batched get (default 1: key by key everywhere, what one
               kv.Get sees; HotRing and chain have batched gets of the same
               prefetching shape, lfht reads key by key whatever BATCH is)
  -q           quick: 400000 keys, 1 s runs (a smoke test, numbers are not comparable)
  -o DIR       where to keep the JSON lines (default a new temporary directory)
  -b PATH      index_bench binary (default build/bench/index_bench next to this script)
  -x FLAGS     extra flags for every index_bench run (e.g. '--seed 7')
environment: MISS_RATIO (default 0.5) and MISS_DIST (default uniform) for the miss
run; SHIFT_THETA (default 1.22) for the shift run.
EOF
}

here=$(cd "$(dirname "$0")" && pwd)
bin="$here/../build/bench/index_bench"
keys=4000000 secs=5 warm=0 rounds=5 threads=2 batch=1 out="" extra=""
while getopts "k:s:w:r:t:B:qo:b:x:h" opt; do
  case $opt in
    k) keys=$OPTARG ;;
    s) secs=$OPTARG ;;
    w) warm=$OPTARG ;;
    r) rounds=$OPTARG ;;
    t) threads=$OPTARG ;;
    B) batch=$OPTARG ;;
    q) keys=400000 secs=1 ;;
    o) out=$OPTARG ;;
    b) bin=$OPTARG ;;
    x) extra=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
command -v jq >/dev/null || { echo "$0: needs jq" >&2; exit 2; }
[ -x "$bin" ] || { echo "$0: $bin not built (cmake --build build --target index_bench)" >&2; exit 2; }
if ! "$bin" --help | grep -q hotring; then
  echo "$0: $bin was built without HotRing (kv_index missing)" >&2
  exit 2
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/index_compare.XXXXXX)
mkdir -p "$out"
miss_ratio=${MISS_RATIO:-0.5}
miss_dist=${MISS_DIST:-uniform}
shift_theta=${SHIFT_THETA:-1.22}
shift_secs=$(awk -v s="$secs" 'BEGIN { print (s < 4 ? 4 : s) }')
shift_at=$(awk -v s="$shift_secs" 'BEGIN { print s / 2 }')

# run NAME FLAGS...: one index_bench invocation, JSON lines to $out/NAME.jsonl.
# Flags given later override the common ones (--rounds 1 for the shift run).
run() {
  local name=$1
  shift
  echo "== $name: index_bench $*" >&2
  # shellcheck disable=SC2086
  "$bin" --keys "$keys" --seconds "$secs" --rounds "$rounds" --threads "$threads" \
    --batch "$batch" --warmup "$warm" $extra "$@" \
    >"$out/$name.jsonl" 2>"$out/$name.log" || {
    echo "$0: $name failed, see $out/$name.log" >&2
    tail -5 "$out/$name.log" >&2
    return 1
  }
}

# val NAME JQ: a number from the result lines of NAME ("null" when missing).
val() {
  jq -rs "map(select(.summary != true and .series == null)) | $2 // null" "$out/$1.jsonl"
}
mops() { val "$1" "map(select(.impl == \"$2\"))[0].mops"; }
ratio() { awk -v a="$(mops "$1" "$2")" -v b="$(mops "$1" "$3")" \
  'BEGIN { if (a == "null" || b == "null" || b == 0) print "null"; else printf "%.3f", a / b }'; }
# The same ratio from ops per worker CPU-second (robust when the machine is
# shared: an index is not charged for time its threads spent descheduled).
cmops() { val "$1" "map(select(.impl == \"$2\"))[0].cpu_mops"; }
cratio() { awk -v a="$(cmops "$1" "$2")" -v b="$(cmops "$1" "$3")" \
  'BEGIN { if (a == "null" || b == "null" || b == 0) print "null"; else printf "%.3f", a / b }'; }

fails=0
# row LABEL MEASURED OP TARGET UNIT
row() {
  local ok
  ok=$(awk -v m="$2" -v op="$3" -v t="$4" 'BEGIN {
    if (m == "null" || m == "") { print "n/a"; exit }
    r = (op == ">=") ? (m >= t) : (m <= t); print r ? "PASS" : "FAIL" }')
  [ "$ok" = PASS ] || fails=$((fails + 1))
  printf "%-46s %10s%-2s %3s %6s%-2s %s\n" "$1" "$2" "$5" "$3" "$4" "$5" "$ok"
}

start=$(date +%s)
run t122 --impl hotring-s,hotring-r,chain,lfht,lfht-auto --workload C --dist zipf --theta 1.22 --ratio 8
run t099 --impl hotring-s,chain --workload C --dist zipf --theta 0.99 --ratio 8
run uniform --impl hotring-s,chain --workload C --dist uniform --ratio 8
run miss --impl hotring-s,chain --workload C --dist "$miss_dist" --theta 0.99 --ratio 16 \
  --miss-ratio "$miss_ratio"
run ycsba --impl hotring-s,chain --workload A --dist zipf --theta 1.22 --ratio 8 --value-size 100
run shift --impl hotring-s,hotring-r --workload C --dist zipf --theta "$shift_theta" --ratio 8 \
  --seconds "$shift_secs" --shift-at "$shift_at" --rounds 1 --warmup 0
elapsed=$(($(date +%s) - start))

mem=$(awk -v a="$(val t122 'map(select(.impl == "lfht-auto"))[0].bucket_bytes')" \
  -v b="$(val t122 'map(select(.impl == "hotring-s"))[0].bucket_bytes')" \
  'BEGIN { if (a == "null" || b == "null" || b == 0) print "null"; else printf "%.2f", a / b }')

echo
echo "index_compare: keys=$keys seconds=$secs warmup=$warm rounds=$rounds threads=$threads batch=$batch (raw JSON in $out, ${elapsed} s)"
printf "%-46s %12s %10s  %s\n" "check" "measured" "target" "result"
row "theta 1.22 r8 C: hotring-s / chain" "$(ratio t122 hotring-s chain)" ">=" 3.0 x
row "theta 1.22 r8 C: hotring-s / lfht" "$(ratio t122 hotring-s lfht)" ">=" 1.5 x
row "theta 1.22 r8 C: hotring-s visited/read" \
  "$(val t122 'map(select(.impl == "hotring-s"))[0].visited_per_read')" "<=" 1.3 ""
row "theta 0.99 r8 C: hotring-s / chain" "$(ratio t099 hotring-s chain)" ">=" 2.0 x
row "uniform r8 C: hotring-s / chain" "$(ratio uniform hotring-s chain)" ">=" 0.95 x
row "misses ${miss_ratio} ($miss_dist) r16: hotring-s / chain" "$(ratio miss hotring-s chain)" \
  ">=" 1.5 x
row "YCSB-A 100 B theta 1.22: hotring-s / chain" "$(ratio ycsba hotring-s chain)" ">=" 1.3 x
row "shift: hotring-s recovery to 90% head_hit" \
  "$(val shift 'map(select(.impl == "hotring-s"))[0].recover_ms')" "<=" 1000 ms
row "shift: hotring-r recovery to 90% head_hit" \
  "$(val shift 'map(select(.impl == "hotring-r"))[0].recover_ms')" "<=" 1000 ms
row "theta 1.22 r8: hotring-s / lfht-auto" "$(ratio t122 hotring-s lfht-auto)" ">=" 1.0 x
row "bucket memory lfht-auto / hotring-s" "$mem" ">=" 4.0 x
echo
echo "the same throughput ratios per worker CPU-second (load $(cut -d' ' -f1-3 /proc/loadavg)):"
printf "  t122 /chain %s  /lfht %s  /lfht-auto %s  t099 /chain %s  uniform /chain %s  miss /chain %s  ycsba /chain %s\n" \
  "$(cratio t122 hotring-s chain)" "$(cratio t122 hotring-s lfht)" "$(cratio t122 hotring-s lfht-auto)" \
  "$(cratio t099 hotring-s chain)" "$(cratio uniform hotring-s chain)" "$(cratio miss hotring-s chain)" \
  "$(cratio ycsba hotring-s chain)"
echo
echo "details:"
for f in t122 t099 uniform miss ycsba shift; do
  jq -r --arg f "$f" 'select(.summary != true and .series == null) |
    "  \($f)\t\(.impl)\tbatch \(.batch)\t\(.mops) Mops/s\t\(.cpu_mops) Mops/cpu-s\tvisited/read \(.visited_per_read)\thead_hit \(.head_hit)\tbuckets \(.final_buckets) (\(.bucket_bytes) B)\titem \(.item_bytes) B" +
    (if .shift_at then "\tsteady \(.steady_head_hit) dip \(.dip_head_hit) recover \(.recover_ms) ms" else "" end)' \
    "$out/$f.jsonl"
done
echo "targets missed: $fails"
