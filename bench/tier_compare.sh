#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tier_compare.sh: runs tier_bench's engine x workload matrix on a fast and a
# slow emulated volume (bench/slowfs/mount_pair.sh) and prints a table with
# each engine's throughput as a ratio to the baseline engine.
#
#   bench/tier_compare.sh [--matrix issue5|issue4] [--engines "hotkv rocksdb-tiering"]
#       [--baseline rocksdb-tiering] [--records 2000000] [--fast-mb 200] [--mem-mb 256]
#       [--write-buffer-mb 64] [--tracker-mb 0] [--runs "RO:hotspot5 RO:hotspot5:shift"]
#       [--nhc on|off] [--fast-stop-pct 100]
#       [--seconds 30] [--warmup 30] [--threads 4] [--plain] [--fast-plain]
#       [--base /tmp/tier_compare] [--out results.jsonl] [--repeat 1]
#       [--ops N] [--insert-ids thread|shared]
#
# Memory: hotkv's memory tier gets --mem-mb + --write-buffer-mb (cache and
#   memtable in one budget); RocksDB a block cache of --mem-mb + --tracker-mb
#   (set it to hotkv's RALT memory, hotrap_state.ralt_mem_bytes) and its
#   memtable of --write-buffer-mb beside it.
# --nhc: hotkv's NHC scheduler (tier_bench --nhc; off = HotRAP alone).
# --fast-stop-pct: hotkv's flush stop (tier_bench --fast-stop-pct, kvnode's
#   flag; default 100, 100000 = none), and rocksdb-capped's put stop.
# --engines: tier_bench's --engine names (hotkv, hotkv-nohotrap,
#   rocksdb-tiering, rocksdb-capped: RocksDB held to --fast-mb, rocksdb-fd...).
# --runs overrides the matrix's runs (WORKLOAD:DIST, read-only ones first);
#   WORKLOAD:DIST:shift moves the hot set halfway through the timed phase
#   (--shift-at) and the table adds the FD hit rate before / at the end.
# issue5 (default): hotspot5 RO, uniform RO, zipf0.99 RO, hotspot5 RW for each
#   engine, FD:SD = 1:10 (2M x 1 KiB records with --fast-mb 200).
# issue4: the hotkv engine alone: load rate, uniform YCSB C and A, write amp.
# Each engine loads once (its load rate is the first run's), the read-only
# workloads reuse the loaded store (--no-load), the writing ones run last.
# --plain uses plain directories under --base instead of slowfs; --fast-plain
# keeps only the slow volume emulated (FUSE round trips make every WAL write
# slow on the emulated fast volume). hotkv-nohotrap is the hotkv engine with
# its HotRAP switch off (plain tiering).
# --ops, --insert-ids: tier_bench's (equal work: each timed phase ends after
#   N ops; inserts from one shared id counter, YCSB's order); the table's
#   "run WA" column is run_write_amp (the warm-up and timed phase with the
#   compaction debt they left, per byte they inserted).
# JSON lines go to --out; the table to stdout; progress to stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
TIER_BENCH=${TIER_BENCH:-$root/build/bench/tier/tier_bench}
export SLOWFS=${SLOWFS:-$root/build/bench/slowfs/slowfs}
# shellcheck source=slowfs/mount_pair.sh
source "$here/slowfs/mount_pair.sh"

matrix=issue5 engines="hotkv rocksdb-tiering" baseline=rocksdb-tiering
records=2000000 fast_mb=200 mem_mb=256 seconds=30 warmup=30 threads=4
plain=0 fast_plain=0 base=/tmp/tier_compare out="" repeat=1 wb_mb=64 tracker_mb=0 runs_arg="" nhc=on fast_stop=""
ops=0 insert_ids=thread
while [[ $# -gt 0 ]]; do
  case $1 in
  --matrix) matrix=$2; shift ;;
  --engines) engines=$2; shift ;;
  --baseline) baseline=$2; shift ;;
  --records) records=$2; shift ;;
  --fast-mb) fast_mb=$2; shift ;;
  --mem-mb) mem_mb=$2; shift ;;
  --write-buffer-mb) wb_mb=$2; shift ;;
  --tracker-mb) tracker_mb=$2; shift ;;
  --runs) runs_arg=$2; shift ;;
  --nhc) nhc=$2; shift ;;
  --fast-stop-pct) fast_stop=$2; shift ;;
  --seconds) seconds=$2; shift ;;
  --warmup) warmup=$2; shift ;;
  --threads) threads=$2; shift ;;
  --plain) plain=1 ;;
  --fast-plain) fast_plain=1 ;;
  --base) base=$2; shift ;;
  --out) out=$2; shift ;;
  --repeat) repeat=$2; shift ;;
  --ops) ops=$2; shift ;;
  --insert-ids) insert_ids=$2; shift ;;
  -h | --help) sed -n '4,41p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "tier_compare: unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
case $matrix in
issue5) runs="RO:hotspot5 RO:uniform RO:zipf0.99 RW:hotspot5" ;;
issue4) runs="C:uniform A:uniform"; engines=hotkv; baseline=hotkv ;;
*) echo "tier_compare: --matrix issue5|issue4" >&2; exit 2 ;;
esac
[[ -n $runs_arg ]] && runs=$runs_arg
[[ -x $TIER_BENCH ]] || { echo "tier_compare: build tier_bench first ($TIER_BENCH)" >&2; exit 1; }
mkdir -p "$base"
base=$(realpath "$base")
out=${out:-$base/results.jsonl}
: >"$out"

trap 'mp_unmount' EXIT
trap 'exit 130' INT TERM
if [[ $plain == 1 ]]; then
  FAST_DIR=$base/fast.plain SLOW_DIR=$base/slow.plain
else
  mp_mount "$base" || exit 1
  [[ $fast_plain == 1 ]] && FAST_DIR=$base/fast.plain
fi
mkdir -p "$FAST_DIR" "$SLOW_DIR"
echo "tier_compare: FD=$FAST_DIR SD=$SLOW_DIR records=$records fast_mb=$fast_mb mem_mb=$mem_mb" \
  "write_buffer_mb=$wb_mb tracker_mb=$tracker_mb" >&2

# bench ENGINE WORKLOAD DIST [flags...]: one tier_bench run, its JSON to $out.
bench() {
  local e=$1 w=$2 d=$3
  shift 3
  [[ $e == hotkv* ]] && set -- --nhc "$nhc" "$@"
  [[ ($e == hotkv* || $e == rocksdb-capped) && -n $fast_stop ]] && set -- --fast-stop-pct "$fast_stop" "$@"
  echo "tier_compare: $e $w $d $*" >&2
  "$TIER_BENCH" --engine "$e" --fast-dir "$FAST_DIR" --slow-dir "$SLOW_DIR" --fast-mb "$fast_mb" \
    --mem-mb "$mem_mb" --write-buffer-mb "$wb_mb" --tracker-mb "$tracker_mb" \
    --records "$records" --threads "$threads" --seconds "$seconds" \
    --warmup "$warmup" --workload "$w" --dist "$d" --progress 10 --ops "$ops" \
    --insert-ids "$insert_ids" "$@" \
    2> >(grep --line-buffered -v ' INFO ' >&2) | tee -a "$out"
}

for rep in $(seq "$repeat"); do
  for e in $engines; do
    rm -rf "${FAST_DIR:?}"/* "${SLOW_DIR:?}"/*
    first=1
    # $runs lists the read-only runs first (they leave the store as loaded)
    for r in $runs; do
      IFS=: read -r w d shift_run <<<"$r"
      extra=()
      [[ $shift_run == shift ]] && extra=(--shift-at "$(python3 -c "print($seconds / 2)")")
      if [[ $first == 1 ]]; then
        bench "$e" "$w" "$d" "${extra[@]}"
        first=0
      else
        bench "$e" "$w" "$d" --no-load "${extra[@]}"
      fi
    done
  done
done

python3 - "$out" "$baseline" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
base = sys.argv[2]
def key(r): return (r["workload"], r["dist"] + ("+shift" if "shift_at" in r else ""))
best = {}
for r in rows:
    best.setdefault((key(r), r["engine"]), []).append(r)
def med(v):
    v = sorted(x for x in v if x is not None)
    return v[len(v) // 2] if v else None
def f(x, fmt):
    return fmt % x if x is not None else "-"
print("%-4s %-15s %-16s %10s %7s %9s %8s %7s %9s %6s %6s %s" % ("wl", "dist", "engine", "ops/s",
      "x base", "p99 get", "fd_hit", "SD B/get", "load/s", "WA", "run WA", "runs"))
for (k, e), rs in sorted(best.items()):
    ops = med([r["ops_per_s"] for r in rs])
    b = best.get((k, base))
    bops = med([r["ops_per_s"] for r in b]) if b else None
    ratio = ops / bops if ops and bops else None
    print("%-4s %-15s %-16s %10s %7s %9s %8s %7s %9s %6s %6s %d" % (k[0], k[1], e, f(ops, "%.0f"),
          f(ratio, "%.2f"), f(med([r["p99_get_us"] for r in rs]), "%.0fus"),
          f(med([r["fd_hit_rate"] for r in rs]), "%.3f"),
          f(med([r["sd_read_bytes_per_get"] for r in rs]), "%.0f"),
          f(med([r["load_ops_per_s"] for r in rs]), "%.0f"),
          f(med([r["write_amp"] for r in rs]), "%.2f"),
          f(med([r.get("run_write_amp") for r in rs]), "%.2f"), len(rs)))
shifts = [r for r in rows if "shift_at" in r]
if shifts:
    print()
    print("%-16s %-10s %9s %9s %9s %10s" % ("engine", "dist", "steady", "end", "end/st", "recovery"))
    for r in shifts:
        print("%-16s %-10s %9s %9s %9s %10s" % (r["engine"], r["dist"],
              f(r["fd_hit_before_shift"], "%.3f"), f(r["fd_hit_end"], "%.3f"),
              f(r["shift_recovery"], "%.3f"), f(r["recovery_s"], "%.1fs")))
PY
