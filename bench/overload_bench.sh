#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 16 item 5: goodput under overload. A 3-node cluster (rf 3) and a
# kvrouter on loopback; kvbench through the router.
#
#   flock -o /tmp/hotkv-bench.lock bench/overload_bench.sh [--keys N] [--rf R]
#       [--workload W] [--dist D] [--value-size B] [--seconds S]
#       [--capacity-threads T] [--capacity-concurrency C]
#       [--threads T] [--concurrency C] [--deadline-ms MS]
#       [--node-flags "..."] [--router-flags "..."] [--kvbench PATH] [--port BASE]
#       [--build DIR] [--keep]
#
# 1. Load N keys (default 10000, 100-byte values).
# 2. Capacity: kvbench with T x C requests in flight (default 4 x 16) and
#    5 s deadlines for S seconds (default 15): the cluster's unloaded
#    throughput.
# 3. Overload: kvbench with T x C in flight (default 4 x 1000 = 4000) and
#    MS ms deadlines (default 200) for S seconds: goodput (successful ops/s,
#    not-found reads included), the failures by status, p99 of the
#    successes, and the servers' own counters (admin.Stats: rpc.expired,
#    calls dropped because their deadline passed while queued; rpc.shed,
#    calls refused with RESOURCE_EXHAUSTED), when the binaries have them.
# 4. Shutdown: SIGTERM to every process right after the overload; the
#    seconds each takes to exit (SIGKILL after 30 s, reported as "hung").
#
# stdout: one JSON line (the summary); stderr: progress. The load average
# at the start and end of each phase is recorded: on a shared 2-core host
# the figures move with it. Ports BASE (router), BASE+1..3; default 17900.
# Compare builds with --build (e.g. a build of main kept aside), with the
# same load generator (--kvbench, default DIR/bench/kvbench/kvbench; it
# backs off on RESOURCE_EXHAUSTED, as a gRPC client would):
#   flock -o /tmp/hotkv-bench.lock bench/overload_bench.sh --build /tmp/main-build \
#       --kvbench build/bench/kvbench/kvbench
set -euo pipefail
export CL_NAME=overload_bench
# shellcheck source=bench/cluster_lib.sh
. "$(dirname "$0")/cluster_lib.sh"

keys=10000 rf=3 CL_PORT=17900 seconds=15 deadline=200
cap_threads=4 cap_conc=16 ov_threads=4 ov_conc=1000
workload=A dist=uniform node_flags="" router_flags="" kvbench=""
while [ $# -gt 0 ]; do
  n=0
  cl_opt "$@" || n=$?
  if [ $n -gt 0 ]; then shift $n; continue; fi
  case "$1" in
    --keys) keys=$2; shift ;;
    --rf) rf=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --deadline-ms) deadline=$2; shift ;;
    --capacity-threads) cap_threads=$2; shift ;;
    --capacity-concurrency) cap_conc=$2; shift ;;
    --threads) ov_threads=$2; shift ;;
    --concurrency) ov_conc=$2; shift ;;
    --node-flags) node_flags=$2; shift ;;
    --router-flags) router_flags=$2; shift ;;
    --kvbench) kvbench=$2; shift ;;
    -h | --help) sed -n '3,30p' "$0"; exit 0 ;;
    *) echo "$0: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
cl_whole_numbers keys rf seconds deadline cap_threads cap_conc ov_threads ov_conc
cl_setup overload_bench 4
kvbench=${kvbench:-$BUILD/bench/kvbench/kvbench}
# shellcheck disable=SC2206 # flags split on spaces on purpose
nflags=($node_flags) rflags=($router_flags)

cl_log "starting 3 nodes (rf $rf) and a router from $BUILD (load average $(cl_load1))"
for i in 1 2 3; do cl_node "n$i" $((CL_PORT + i)) "$TMP/n$i" ${nflags[@]+"${nflags[@]}"}; done
cl_kvctl --router "$(cl_nurl 1)" cluster init --rf "$rf" "n1=$(cl_nurl 1)" "n2=$(cl_nurl 2)" \
  "n3=$(cl_nurl 3)" > /dev/null
cl_router "$CL_PORT" "$(cl_nurl 1),$(cl_nurl 2),$(cl_nurl 3)" ${rflags[@]+"${rflags[@]}"}
cl_load "$keys" "$vsize"
loaded=$(tail -n 1 "$TMP/load.json" | jnum loaded)
cl_log "loaded ${loaded:-0} keys"

# kvbench through the router: NAME THREADS CONCURRENCY TIMEOUT_MS; the
# summary line goes to TMP/NAME.json.
run_bench() {
  cl_fg "$1" "$kvbench" --router "$(cl_router_url)" --keys "$keys" \
    --value-size "$vsize" --workload "$workload" --dist "$dist" --threads "$2" \
    --concurrency "$3" --timeout-ms "$4" --seconds "$seconds" --report-top 0 \
    > "$TMP/$1.json" 2> "$TMP/$1.err" || true
  tail -n 1 "$TMP/$1.json"
}

# The sum over the nodes (and the router, whose stats `kvctl --json status`
# prints as "router") of admin.Stats counter NAME, or null when no process
# reports it.
server_counter() { # NAME
  { cl_status | grep -o "\"$1\":[0-9]*" || true; } | awk -F: '{ s += $2; n++ } END { print n ? s : "null" }'
}

# The error_codes object of a kvbench summary line.
codes() { sed -n 's/.*"error_codes":\({[^}]*}\).*/\1/p'; }

L0=$(cl_load1)
cl_log "capacity: $cap_threads x $cap_conc in flight, 5000 ms deadlines, $seconds s"
cap=$(run_bench capacity "$cap_threads" "$cap_conc" 5000)
L1=$(cl_load1)
cap_ops=$(jnum ops_per_s <<< "$cap")
cl_log "capacity $cap_ops ops/s (load average $L0 -> $L1)"

exp0=$(server_counter rpc.expired)
shed0=$(server_counter rpc.shed)
L2=$(cl_load1)
cl_log "overload: $ov_threads x $ov_conc in flight, $deadline ms deadlines, $seconds s"
ov=$(run_bench overload "$ov_threads" "$ov_conc" "$deadline")
L3=$(cl_load1)
ov_ops=$(jnum ops_per_s <<< "$ov")
cl_log "goodput $ov_ops ops/s, errors $(jnum errors <<< "$ov") $(codes <<< "$ov") (load average $L2 -> $L3)"
exp1=$(server_counter rpc.expired)
shed1=$(server_counter rpc.shed)
delta() { if [ "$1" = null ] || [ "$2" = null ]; then echo null; else echo $(($2 - $1)); fi; }

# Shutdown right after the overload: SIGTERM to all at once, seconds to exit.
declare -A EXIT_S
t0=$(cl_now_ms)
for n in "${!CL_PID[@]}"; do kill -TERM "${CL_PID[$n]}" 2> /dev/null || true; done
for n in "${!CL_PID[@]}"; do
  pid=${CL_PID[$n]}
  for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2> /dev/null; then
    EXIT_S[$n]='"hung"'
    cl_log "$n (pid $pid) did not exit 30 s after SIGTERM; stacks in $TMP/hang-$n.txt; killing it"
    if command -v gdb > /dev/null; then
      timeout 60 gdb -p "$pid" -batch -ex 'thread apply all bt' > "$TMP/hang-$n.txt" 2>&1 || true
      CL_KEEP=1
    fi
    kill -KILL "$pid" 2> /dev/null || true
  else
    EXIT_S[$n]=$(awk -v a="$t0" -v b="$(cl_now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
  fi
  unset "CL_PID[$n]"
done
exits=""
for n in $(printf '%s\n' "${!EXIT_S[@]}" | sort); do exits+="\"$n\":${EXIT_S[$n]},"; done

printf '{"summary":true,"bench":"overload_bench","build":"%s","keys":%s,"rf":%s,"workload":"%s","dist":"%s","value_size":%s,"seconds":%s,' \
  "$BUILD" "$keys" "$rf" "$workload" "$dist" "$vsize" "$seconds"
printf '"capacity_in_flight":%s,"capacity_ops_s":%s,"capacity_p99_us":%s,"capacity_errors":%s,' \
  $((cap_threads * cap_conc)) "${cap_ops:-null}" "$(jnum p99_us <<< "$cap")" "$(jnum errors <<< "$cap")"
printf '"overload_in_flight":%s,"deadline_ms":%s,"goodput_ops_s":%s,"goodput_ratio":%s,"overload_p99_us":%s,' \
  $((ov_threads * ov_conc)) "$deadline" "${ov_ops:-null}" "$(ratio "${ov_ops:-0}" "${cap_ops:-0}")" "$(jnum p99_us <<< "$ov")"
printf '"overload_errors":%s,"overload_error_codes":%s,"server_expired":%s,"server_shed":%s,' \
  "$(jnum errors <<< "$ov")" "$(codes <<< "$ov" | grep . || echo '{}')" "$(delta "$exp0" "$exp1")" "$(delta "$shed0" "$shed1")"
printf '"load_capacity":[%s,%s],"load_overload":[%s,%s],"exit_s":{%s}}\n' "$L0" "$L1" "$L2" "$L3" "${exits%,}"
