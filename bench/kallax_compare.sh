#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# kallax_compare.sh: the KallaxDB comparison (issue 19). Each engine gets the
# same emulated device, one volume (no tiering): a slowfs mount with the
# fast profile of mount_pair.sh and --compress, loads the same records, and
# runs YCSB C, B, A, F and D on them (in that order, read-only first, D last
# since it inserts). Prints a table: ops/s, average and p99 read latency,
# CPU per operation (tier_bench's getrusage), index memory per key, and the
# logical and physical bytes of the device after the load (slowfs's
# compression model), with each engine's ratio to RocksDB on the targets.
#
#   bench/kallax_compare.sh [--engines "kallax hotkv-kallax hotkv rocksdb-fd"] [--records 300000]
#       [--value-size 1000] [--dist zipf0.99] [--mem-mb 16] [--write-buffer-mb 16]
#       [--seconds 10] [--warmup 5] [--threads 4] [--compress lz4|zstd]
#       [--workloads "C B A F D"] [--kallax-blocks 0] [--base /tmp/kallax_compare]
#       [--out results.jsonl] [--repeat 1]
#
# Space is measured on the load's mount (slowfs keeps its compression table
# in memory); the runs remount the device without the model, so its CPU does
# not crowd the engines. hotkv is the node's engine (HotRing over the LSM,
# every level on the one volume: HotRAP and NHC have no slow volume to act
# on); hotkv-kallax is the node's engine over kallax (kvnode --engine
# kallax: HotRing over the store, its memory --mem-mb + --write-buffer-mb
# like hotkv's); rocksdb-fd is RocksDB with bloom filters and a block cache
# of --mem-mb. kallax is the bare store with a write buffer of its own and
# no read cache, so the default --mem-mb is small for everyone. Run it alone on the machine:
# flock -o /tmp/hotkv-bench.lock bench/kallax_compare.sh ...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
TIER_BENCH=${TIER_BENCH:-$root/build/bench/tier/tier_bench}
export SLOWFS=${SLOWFS:-$root/build/bench/slowfs/slowfs}
# shellcheck source=slowfs/mount_pair.sh
source "$here/slowfs/mount_pair.sh"

engines="kallax hotkv-kallax hotkv rocksdb-fd" records=300000 vsize=1000 dist=zipf0.99 mem_mb=16 wb_mb=16
seconds=10 warmup=5 threads=4 compress=lz4 workloads="C B A F D" kblocks=0
base=/tmp/kallax_compare out="" repeat=1
while [[ $# -gt 0 ]]; do
  case $1 in
  --engines) engines=$2; shift ;;
  --records) records=$2; shift ;;
  --value-size) vsize=$2; shift ;;
  --dist) dist=$2; shift ;;
  --mem-mb) mem_mb=$2; shift ;;
  --write-buffer-mb) wb_mb=$2; shift ;;
  --seconds) seconds=$2; shift ;;
  --warmup) warmup=$2; shift ;;
  --threads) threads=$2; shift ;;
  --compress) compress=$2; shift ;;
  --workloads) workloads=$2; shift ;;
  --kallax-blocks) kblocks=$2; shift ;;
  --base) base=$2; shift ;;
  --out) out=$2; shift ;;
  --repeat) repeat=$2; shift ;;
  -h | --help) sed -n '4,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "kallax_compare: unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -x $TIER_BENCH ]] || { echo "kallax_compare: build tier_bench first ($TIER_BENCH)" >&2; exit 1; }
mkdir -p "$base"
base=$(realpath "$base")
out=${out:-$base/results.jsonl}
: >"$out"
trap 'mp_unmount' EXIT
trap 'exit 130' INT TERM
profile=$FAST_PROFILE

# bench ENGINE WORKLOAD [flags...]: one tier_bench run on $base/dev, JSON to $out.
bench() {
  local e=$1 w=$2
  shift 2
  echo "kallax_compare: $e $w $*" >&2
  "$TIER_BENCH" --engine "$e" --fast-dir "$base/dev/$e" --mem-mb "$mem_mb" \
    --write-buffer-mb "$wb_mb" --records "$records" --value-size "$vsize" --threads "$threads" \
    --seconds "$seconds" --warmup "$warmup" --workload "$w" --dist "$dist" --progress 10 \
    --kallax-blocks "$kblocks" --settle 120 "$@" 2> >(grep --line-buffered -v ' INFO ' >&2) |
    tee -a "$out"
}

# space ENGINE: the device's logical and physical bytes after the load, as
# a JSON line (from slowfs's exit report).
space() {
  local e=$1 line
  line=$(grep 'compress=' "$base/dev.log" | tail -1)
  python3 - "$e" "$line" >>"$out" <<'PY'
import json, re, sys
f = dict(re.findall(r"(\w+)=(\w+)", sys.argv[2]))
print(json.dumps({"space": sys.argv[1], "compress": f.get("compress"),
                  "logical_bytes": int(f.get("logical_bytes", 0)),
                  "physical_bytes": int(f.get("physical_bytes", 0))}))
PY
}

for rep in $(seq "$repeat"); do
  for e in $engines; do
    rm -rf "$base/dev.backing" "$base/dev.log"
    mp_start dev "$base" "$profile --compress $compress" || exit 1
    mkdir -p "$base/dev/$e"
    bench "$e" C --load-only
    mp_unmount
    space "$e"
    mp_start dev "$base" "$profile" || exit 1
    for w in $workloads; do
      bench "$e" "$w" --no-load
    done
    mp_unmount
  done
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
runs = [r for r in rows if "engine" in r and r.get("ops", 0)]
loads = [r for r in rows if "engine" in r and not r.get("ops", 0)]
space = {}
for r in rows:
    if "space" in r:
        space.setdefault(r["space"], []).append(r)
def med(v):
    v = sorted(x for x in v if x is not None)
    return v[len(v) // 2] if v else None
def f(x, fmt):
    return fmt % x if x is not None else "-"
cell = {}
for r in runs:
    cell.setdefault((r["workload"], r["engine"]), []).append(r)
engines = sorted({e for _, e in cell})
print("%-3s %-13s %10s %10s %10s %10s %6s" % ("wl", "engine", "ops/s", "avg get", "p99 get",
      "cpu/op", "runs"))
for (w, e), rs in sorted(cell.items()):
    print("%-3s %-13s %10s %10s %10s %10s %6d" % (w, e, f(med([r["ops_per_s"] for r in rs]), "%.0f"),
          f(med([r["avg_get_us"] for r in rs]), "%.1fus"),
          f(med([r["p99_get_us"] for r in rs]), "%.0fus"),
          f(med([r["cpu_us_per_op"] for r in rs]), "%.1fus"), len(rs)))
print()
print("%-13s %14s %14s %14s %12s" % ("engine", "index B/key", "logical", "physical", "load ops/s"))
for e in engines:
    ld = [r for r in loads if r["engine"] == e]
    sp = space.get(e, [])
    print("%-13s %14s %14s %14s %12s" % (e, f(med([r["index_mem_per_key"] for r in ld]), "%.2f"),
          f(med([s["logical_bytes"] for s in sp]), "%d"),
          f(med([s["physical_bytes"] for s in sp]), "%d"),
          f(med([r["load_ops_per_s"] for r in ld]), "%.0f")))
def val(w, e, k):
    return med([r[k] for r in cell.get((w, e), [])])
rk = "rocksdb-fd"
def ratio(a, b):
    return a / b if a is not None and b else None
for kx in [e for e in ("kallax", "hotkv-kallax") if e in engines and rk in engines]:
    print()
    idx = [med([r["index_mem_per_key"] for r in loads if r["engine"] == e]) for e in (kx, rk)]
    phys = [med([s["physical_bytes"] for s in space.get(e, [])]) for e in (kx, rk)]
    checks = [
        ("index memory per key <= 0.1 x RocksDB", ratio(idx[0], idx[1]), lambda x: x <= 0.1),
        ("YCSB F ops/s >= 1.5 x RocksDB", ratio(val("F", kx, "ops_per_s"),
                                              val("F", rk, "ops_per_s")), lambda x: x >= 1.5),
        ("YCSB C avg read latency <= 0.7 x RocksDB", ratio(val("C", kx, "avg_get_us"),
                                                      val("C", rk, "avg_get_us")),
         lambda x: x <= 0.7),
        ("physical bytes <= 1.3 x RocksDB", ratio(phys[0], phys[1]), lambda x: x <= 1.3),
    ]
    for name, x, ok in checks:
        print("%-13s %-42s %8s  %s" % (kx, name, f(x, "%.3f"),
                                       "-" if x is None else "met" if ok(x) else "MISSED"))
PY
