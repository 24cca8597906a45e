#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 15: hotkv's request path end to end against redis-server, in one run
# on loopback.
#
#   bench/e2e_compare.sh [-b BUILD_DIR] [-s SECONDS] [-r ROUNDS] [-k KEYS]
#                        [-d VALUE_SIZE] [-c IN_FLIGHT] [-p BASE_PORT]
#                        [-o OUT_DIR] [-K "KIND ..."] [-q]
#
# Starts redis-server (Debian's redis-server package, a bench-only
# dependency: installed with apt-get when missing and run as root), a
# one-node hotkv cluster (node s1, rf 1) with a router in front of it, and a
# 3-node cluster (t1..t3, rf 3) with its own router. KEYS keys of VALUE_SIZE
# bytes are loaded into each. Every round then runs, in alternating order
# (reversed every other round), each of these for SECONDS:
#   redis_get, redis_set      redis-benchmark -c IN_FLIGHT -d VALUE_SIZE -r KEYS
#   redis_get_p16             the same with -P 16 (16 pipelined GETs per connection)
#   redis_get_1               -c 1 (one request in flight)
#   node_get, node_a          kvbench straight at s1: workload C / A, uniform,
#                             2 threads x IN_FLIGHT/2 in flight
#   node_zipf                 node_get at zipf theta 1.22
#   node_get_1                node_get with 1 thread x 1 in flight
#   node_batch16              batch_bench: kv.Batch of 16 GETs, IN_FLIGHT batches in flight
#   router_get, router_zipf, router_get_1, router_batch16   the same through s1's router
#   cluster_router_get, cluster_router_a   kvbench through the 3-node cluster's router
#   cluster_direct_get, cluster_direct_a   kvbench --direct against the 3-node cluster
#                             (the smart client; skipped when kvbench has no --direct)
#   cluster_direct_get3       the same at 3 x IN_FLIGHT: each node sees what s1 sees in
#                             node_get (per-CPU figures at equal load per node, the
#                             scaling question; at IN_FLIGHT each node gets a third)
# Each run's line (stdout, JSON) has its throughput, p50, the CPU time the
# server processes and the load generator used (/proc/PID/stat, or
# /usr/bin/time for the generator) and the calls per message the run's
# nodes received (their rpc.calls / rpc.messages counters, from /metrics:
# coalescing, which sets the servers' CPU per call); then a table of the medians with their
# min..max over the rounds, then, as the last line, a JSON object with every
# target ratio: per round, its median and its spread (min, max). Progress on
# stderr. Every process started here is stopped and the temp dir removed on
# exit and on Ctrl-C. -q: a quick smoke run (1 round of 2 s, 20k keys).
# -K runs only the kinds named (e.g. -K "redis_set node_a" for an A/B of the
# write path); the ratios whose runs are missing come out null.
set -euo pipefail

build=build secs=5 rounds=3 keys=100000 vsize=100 conc=50 port=18600 out="" only=""
while getopts "b:s:r:k:d:c:p:o:K:qh" o; do
  case "$o" in
    b) build=$OPTARG ;;
    s) secs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    k) keys=$OPTARG ;;
    d) vsize=$OPTARG ;;
    c) conc=$OPTARG ;;
    p) port=$OPTARG ;;
    o) out=$OPTARG ;;
    K) only=$OPTARG ;;
    q) secs=2 rounds=1 keys=20000 ;;
    *) sed -n '3,35p' "$0" >&2; exit 2 ;;
  esac
done
log() { echo "e2e_compare: $*" >&2; }
command -v jq > /dev/null || { echo "$0: needs jq" >&2; exit 2; }
if ! command -v redis-server > /dev/null || ! command -v redis-benchmark > /dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs redis-server (run: sudo apt-get install -y redis-server)" >&2
    exit 2
  fi
  log "installing redis-server (bench-only dependency)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >&2 ||
    { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends redis-server >&2; }
fi
for b in node/kvnode shard/kvrouter client/kvctl bench/kvbench/kvbench bench/batch_bench; do
  [ -x "$build/$b" ] || { echo "$0: missing $build/$b (build first)" >&2; exit 2; }
done
have_direct=0
"$build/bench/kvbench/kvbench" --help 2>&1 | grep -q -- '--direct' && have_direct=1
half=$((conc / 2))
[ "$half" -ge 1 ] || { echo "$0: -c must be at least 2" >&2; exit 2; }

tmp=$(mktemp -d /tmp/e2e_compare.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null || true
    wait "$p" 2> /dev/null || true
  done
  [ -n "$out" ] && mkdir -p "$out" && cp "$tmp"/*.jsonl "$tmp"/*.log "$out"/ 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

url() { echo "tcp://127.0.0.1:$((port + $1))"; }
hport() { echo $((${1##*:} + 10)); } # ADDR -> its node's /metrics port
rport=$((port + 0)) ns=$(url 1) rs=$(url 2) nt1=$(url 3) nt2=$(url 4) nt3=$(url 5) rt=$(url 6)
for p in $rport ${ns##*:} ${rs##*:} ${nt1##*:} ${nt2##*:} ${nt3##*:} ${rt##*:} \
  $(hport "$ns") $(hport "$nt1") $(hport "$nt2") $(hport "$nt3"); do
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
declare -A pid_of http_of # name -> pid, /metrics port
start_node() { # ID ADDR
  "$build/node/kvnode" --id "$1" --listen "$2" --http-listen "http://127.0.0.1:$(hport "$2")" \
    --data-dir "$tmp/$1" > "$tmp/$1.log" 2>&1 &
  pids+=($!)
  pid_of[$1]=$!
  http_of[$1]=$(hport "$2")
  wait_ping "$2"
}
# "MESSAGES CALLS" the nodes named received so far (their /metrics).
node_msgs() { # ID...
  local id m=0 c=0 a b
  for id in "$@"; do
    [ -n "${http_of[$id]:-}" ] || continue
    read -r a b < <({ exec 3<> "/dev/tcp/127.0.0.1/${http_of[$id]}" &&
      printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && timeout 5 cat <&3; } |
      awk '$1 == "hotkv_node_rpc_messages_received_total" { m = $2 }
           $1 == "hotkv_node_rpc_calls_received_total" { c = $2 }
           END { printf "%d %d\n", m, c }')
    m=$((m + a)) c=$((c + b))
  done
  echo "$m $c"
}
start_router() { # NAME ADDR SEEDS
  "$build/shard/kvrouter" --listen "$2" --seeds "$3" > "$tmp/$1.log" 2>&1 &
  pids+=($!)
  pid_of[$1]=$!
  wait_ping "$2"
  for _ in $(seq 100); do # until the router has the map
    "${kvctl[@]}" --router "$2" status > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}
cpu_ticks() { # PID NAME: user + system, clock ticks; a process that is gone ends the run
  awk '{ print $14 + $15 }' "/proc/$1/stat" 2> /dev/null || {
    echo "$0: $2 (pid $1) is gone; the end of its log:" >&2
    tail -n 20 "$tmp/$2.log" >&2
    exit 1
  }
}
tick_ms=$((1000 / $(getconf CLK_TCK)))
load1() { cut -d' ' -f1 /proc/loadavg; }

# ---- the systems under test ----
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --protected-mode no > "$tmp/redis.log" 2>&1 &
pids+=($!)
pid_of[redis]=$!
for _ in $(seq 100); do redis-cli -p "$rport" ping > /dev/null 2>&1 && break; sleep 0.1; done
start_node s1 "$ns"
"${kvctl[@]}" cluster init --rf 1 "s1=$ns" > /dev/null
start_node t1 "$nt1"
start_node t2 "$nt2"
start_node t3 "$nt3"
"${kvctl[@]}" cluster init --rf 3 "t1=$nt1" "t2=$nt2" "t3=$nt3" > /dev/null
start_router rs "$rs" "$ns"
start_router rt "$rt" "$nt1,$nt2,$nt3"

kvb() { # TARGET SECONDS [FLAGS...]: the summary line; the generator's CPU ms in $tmp/gen.cpu
  local t=$1 s=$2
  shift 2
  /usr/bin/time -f '%U %S' -o "$tmp/gen.time" timeout $((${s%.*} + 180)) \
    "$build/bench/kvbench/kvbench" --router "$t" --keys "$keys" --value-size "$vsize" \
    --report-top 0 --seconds "$s" "$@" 2> "$tmp/kvbench.err" | tail -n 1
  awk '{ printf "%d\n", ($1 + $2) * 1000 }' "$tmp/gen.time" > "$tmp/gen.cpu"
}
log "loading $keys keys of $vsize bytes (redis, s1, the 3-node cluster)"
redis-benchmark -p "$rport" -t set -r "$keys" -n $((keys * 10)) -d "$vsize" -P 16 -q > /dev/null
kvb "$rs" 0.1 --load --threads 2 --concurrency 64 > /dev/null
kvb "$rt" 0.1 --load --threads 2 --concurrency 64 > /dev/null
for n in "$ns" "$nt1"; do
  k=$("${kvctl[@]}" --router "$n" status --json | jq '[.nodes[].stats.keys | tonumber] | max')
  [ "$k" -ge "$keys" ] || { echo "$0: $n holds $k keys, not $keys" >&2; exit 1; }
done

# redis-benchmark counts requests, not seconds: the count for SECONDS comes
# from the rate of the previous run of the same kind (a warm-up sets it).
declare -A rrate=([get]=50000 [set]=50000 [get_p16]=300000 [get_1]=20000)
redis_run() { # KIND -> "ops_per_s p50_us" on stdout, the generator's CPU ms in $tmp/gen.cpu
  local kind=$1 n args=()
  case "$kind" in
    get) args=(-t get -c "$conc") ;;
    set) args=(-t set -c "$conc") ;;
    get_p16) args=(-t get -c "$conc" -P 16) ;;
    get_1) args=(-t get -c 1) ;;
  esac
  n=$(awk -v r="${rrate[$kind]}" -v s="$secs" 'BEGIN { printf "%d", r * s }')
  /usr/bin/time -f '%U %S' -o "$tmp/gen.time" timeout $((${secs%.*} + 180)) \
    redis-benchmark -p "$rport" -r "$keys" -d "$vsize" -n "$n" --csv "${args[@]}" \
    > "$tmp/redis.csv" 2> /dev/null
  awk '{ printf "%d\n", ($1 + $2) * 1000 }' "$tmp/gen.time" > "$tmp/gen.cpu"
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
  local line
  line=$(tail -n 1 "$tmp/redis.csv" | tr -d '"')
  rrate[$kind]=$(cut -d, -f2 <<< "$line" | cut -d. -f1)
  awk -F, '{ printf "%s %s\n", $2, $5 * 1000 }' <<< "$line"
}

# One measured run: prints its JSON line and keeps it for the summary.
declare -A servers=([redis]="redis" [node]="s1" [router]="rs s1" [cluster]="rt t1 t2 t3")
run() { # KIND ROUND
  local kind=$1 round=$2 sys=${1%%_*} res ops p50 secs_run errors=0 l c0=() c1=() i=0 s
  local procs=(${servers[$sys]}) m0 k0 m1 k1
  l=$(load1)
  read -r m0 k0 < <(node_msgs "${procs[@]}")
  for s in "${procs[@]}"; do c0+=($(cpu_ticks "${pid_of[$s]}" "$s")); done
  local t0
  t0=$(date +%s.%N)
  case "$kind" in
    redis_*)
      read -r ops p50 < <(redis_run "${kind#redis_}")
      res=$(jq -cn --argjson o "$ops" --argjson p "$p50" '{ops_per_s: $o, p50_us: $p, errors: 0}') ;;
    node_get | router_get) res=$(kvb "$([ "$sys" = node ] && echo "$ns" || echo "$rs")" "$secs" \
      --workload C --dist uniform --threads 2 --concurrency "$half") ;;
    node_a) res=$(kvb "$ns" "$secs" --workload A --dist uniform --threads 2 --concurrency "$half") ;;
    node_zipf | router_zipf) res=$(kvb "$([ "$sys" = node ] && echo "$ns" || echo "$rs")" "$secs" \
      --workload C --dist zipf --theta 1.22 --threads 2 --concurrency "$half") ;;
    node_get_1 | router_get_1) res=$(kvb "$([ "$sys" = node ] && echo "$ns" || echo "$rs")" \
      "$secs" --workload C --dist uniform --threads 1 --concurrency 1) ;;
    node_batch16 | router_batch16)
      /usr/bin/time -f '%U %S' -o "$tmp/gen.time" "$build/bench/batch_bench" \
        --target "$([ "$sys" = node ] && echo "$ns" || echo "$rs")" --keys "$keys" --batch 16 \
        --concurrency "$conc" --seconds "$secs" > "$tmp/bb.json" 2> "$tmp/bb.err" || {
        echo "$0: $kind failed (batch_bench exited with $?):" >&2
        tail -n 20 "$tmp/bb.err" >&2
        exit 1
      }
      awk '{ printf "%d\n", ($1 + $2) * 1000 }' "$tmp/gen.time" > "$tmp/gen.cpu"
      res=$(tail -n 1 "$tmp/bb.json") ;;
    cluster_router_get) res=$(kvb "$rt" "$secs" --workload C --dist uniform --threads 2 \
      --concurrency "$half") ;;
    cluster_router_a) res=$(kvb "$rt" "$secs" --workload A --dist uniform --threads 2 \
      --concurrency "$half") ;;
    cluster_direct_get) res=$(kvb "$rt" "$secs" --direct --workload C --dist uniform \
      --threads 2 --concurrency "$half") ;;
    cluster_direct_get3) res=$(kvb "$rt" "$secs" --direct --workload C --dist uniform \
      --threads 2 --concurrency $((half * 3))) ;;
    cluster_direct_a) res=$(kvb "$rt" "$secs" --direct --workload A --dist uniform \
      --threads 2 --concurrency "$half") ;;
  esac
  secs_run=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  for s in "${procs[@]}"; do c1+=($(cpu_ticks "${pid_of[$s]}" "$s")); done
  read -r m1 k1 < <(node_msgs "${procs[@]}")
  [ -n "$res" ] || { echo "$0: $kind failed:" >&2; cat "$tmp/kvbench.err" >&2; exit 1; }
  if [ "$(jq '.errors // 0' <<< "$res")" != 0 ]; then # keep what the generator said
    { echo "== $kind round $round"; cat "$tmp/kvbench.err" "$tmp/bb.err" 2> /dev/null || true; } |
      grep -v ' ops/s ' >> "$tmp/errors.log" || true
  fi
  local cpu="{}"
  for s in "${procs[@]}"; do
    cpu=$(jq -c --arg k "$s" --argjson v $(((c1[i] - c0[i]) * tick_ms)) '. + {($k): $v}' \
      <<< "$cpu")
    i=$((i + 1))
  done
  jq -cn --arg kind "$kind" --argjson round "$round" --argjson r "$res" --argjson cpu "$cpu" \
    --argjson gen "$(cat "$tmp/gen.cpu")" --argjson load1 "$l" --argjson wall "$secs_run" \
    --argjson msgs $((m1 - m0)) --argjson calls $((k1 - k0)) '
    ($cpu | [.[]] | add) as $srv |
    {run: $kind, round: $round, ops_per_s: $r.ops_per_s, p50_us: $r.p50_us,
     errors: ($r.errors // 0), error_codes: ($r.error_codes // {}), wall_s: $wall, cpu_ms: $cpu, server_cpu_ms: $srv,
     generator_cpu_ms: $gen, load1: $load1,
     node_calls_per_msg: (if $msgs > 0 then ($calls / $msgs * 100 | round) / 100 else null end),
     server_cpu_s_per_1k: (if $r.ops_per_s > 0 then $srv / 1000 / ($r.ops_per_s * $wall) * 1000
                           else null end)}' | tee -a "$tmp/runs.jsonl"
  log "$(jq -r '"round \(.round) \(.run): \(.ops_per_s | round) ops/s, p50 \(.p50_us) us,
    server CPU \(.server_cpu_ms) ms, calls per node message \(.node_calls_per_msg), errors \(.errors), load \(.load1)"' \
    <<< "$(tail -n 1 "$tmp/runs.jsonl")" | tr -s ' \n' ' ')"
}

kinds=(redis_get redis_set redis_get_p16 redis_get_1 node_get node_a node_zipf node_get_1
  node_batch16 router_get router_zipf router_get_1 router_batch16 cluster_router_get
  cluster_router_a)
[ "$have_direct" = 1 ] && kinds+=(cluster_direct_get cluster_direct_a cluster_direct_get3)
if [ -n "$only" ]; then
  for k in $only; do
    [[ " ${kinds[*]} " == *" $k "* ]] || { echo "$0: -K: no kind $k (${kinds[*]})" >&2; exit 2; }
  done
  read -r -a kinds <<< "$only"
fi
log "warm-up (load average $(load1))"
for k in redis_get redis_set redis_get_p16 redis_get_1; do redis_run "${k#redis_}" > /dev/null; done
kvb "$ns" 2 --workload C --dist uniform --threads 2 --concurrency "$half" > /dev/null
kvb "$rt" 2 --workload C --dist uniform --threads 2 --concurrency "$half" > /dev/null
: > "$tmp/runs.jsonl"
t_start=$(date +%s)
for r in $(seq 1 "$rounds"); do
  order=("${kinds[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#kinds[@]} - 1; i >= 0; i--)); do order+=("${kinds[$i]}"); done
  fi
  for k in "${order[@]}"; do run "$k" "$r"; done
done
log "done in $(($(date +%s) - t_start)) s, load average $(load1)"

# ---- summary: a table of medians (min..max), then every ratio ----
jq -rs '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by(.run) | map({run: .[0].run, ops: (map(.ops_per_s) | median),
    lo: (map(.ops_per_s) | min), hi: (map(.ops_per_s) | max), p50: (map(.p50_us) | median),
    cpu: (map(.server_cpu_s_per_1k) | median),
    cpm: (map(.node_calls_per_msg | select(. != null)) | median)}) |
  (["run", "ops/s median", "min..max", "p50 us", "server CPU s/1k req", "calls/node msg"] | @tsv),
  (.[] | [.run, (.ops | round), "\(.lo | round)..\(.hi | round)", .p50,
          (.cpu // 0 | . * 10000 | round / 10000), (.cpm // "-")] | @tsv)' "$tmp/runs.jsonl" |
  column -t -s $'\t'

jq -cs --argjson keys "$keys" --argjson vsize "$vsize" --argjson conc "$conc" \
  --argjson secs "$secs" '
  def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor]
                     else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def r3: if . == null then null else . * 1000 | round / 1000 end;
  def get($round; $k; $f): map(select(.round == $round and .run == $k))[0][$f];
  . as $runs | ($runs | map(.round) | max) as $n |
  def ratio($a; $fa; $b; $fb): [range(1; $n + 1) as $r |
      (get($r; $a; $fa)) as $x | (get($r; $b; $fb)) as $y |
      if $x == null or $y == null or $y == 0 then empty else $x / $y end];
  def per_cpu($k): [range(1; $n + 1) as $r |
      $runs | map(select(.round == $r and .run == $k))[0] |
      if . == null or .server_cpu_ms == 0 then empty
      else .ops_per_s * .wall_s / (.server_cpu_ms / 1000) end];
  def r5: if . == null then null else . * 100000 | round / 100000 end;
  def stat($xs): {median: ($xs | median | r3), min: ($xs | min | r3), max: ($xs | max | r3),
                  rounds: ($xs | map(r3))};
  def stat5($xs): {median: ($xs | median | r5), min: ($xs | min | r5), max: ($xs | max | r5),
                   rounds: ($xs | map(r5))};
  def cpu1k($k; $who): [range(1; $n + 1) as $r |
      $runs | map(select(.round == $r and .run == $k))[0] |
      if . == null or .ops_per_s == 0 then empty
      else ([$who[] as $w | .cpu_ms[$w] // 0] | add) / 1000 / (.ops_per_s * .wall_s) * 1000 end];
  {summary: true, bench: "e2e_compare", keys: $keys, value_size: $vsize, in_flight: $conc,
   seconds: $secs, rounds: $n,
   node_get_vs_redis: stat(ratio("node_get"; "ops_per_s"; "redis_get"; "ops_per_s")),
   node_write_a_vs_redis_set: stat(ratio("node_a"; "ops_per_s"; "redis_set"; "ops_per_s")),
   router_vs_node: stat(ratio("router_get"; "ops_per_s"; "node_get"; "ops_per_s")),
   node_batch16_vs_redis_p16: stat(ratio("node_batch16"; "ops_per_s"; "redis_get_p16";
                                          "ops_per_s")),
   router_batch16_vs_redis_p16: stat(ratio("router_batch16"; "ops_per_s"; "redis_get_p16";
                                            "ops_per_s")),
   p50_1_router_vs_redis: stat(ratio("router_get_1"; "p50_us"; "redis_get_1"; "p50_us")),
   p50_1_node_vs_redis: stat(ratio("node_get_1"; "p50_us"; "redis_get_1"; "p50_us")),
   zipf_vs_uniform_node: stat(ratio("node_zipf"; "ops_per_s"; "node_get"; "ops_per_s")),
   zipf_vs_uniform_router: stat(ratio("router_zipf"; "ops_per_s"; "router_get"; "ops_per_s")),
   cluster_direct_vs_router: stat(ratio("cluster_direct_get"; "ops_per_s"; "cluster_router_get";
                                        "ops_per_s")),
   cluster_direct_per_cpu_vs_node: stat([per_cpu("cluster_direct_get"), per_cpu("node_get")] |
     transpose | map(select(.[0] != null and .[1] != null) | .[0] / .[1])),
   cluster_direct3_per_cpu_vs_node: stat([per_cpu("cluster_direct_get3"), per_cpu("node_get")] |
     transpose | map(select(.[0] != null and .[1] != null) | .[0] / .[1])),
   cluster_direct3_vs_node: stat(ratio("cluster_direct_get3"; "ops_per_s"; "node_get";
                                       "ops_per_s")),
   cluster_router_per_cpu_vs_node: stat([per_cpu("cluster_router_get"), per_cpu("node_get")] |
     transpose | map(select(.[0] != null and .[1] != null) | .[0] / .[1])),
   cpu_s_per_1k: {
     node_get: stat5(cpu1k("node_get"; ["s1"])), node_a: stat5(cpu1k("node_a"; ["s1"])),
     router_get_router: stat5(cpu1k("router_get"; ["rs"])),
     router_get_node: stat5(cpu1k("router_get"; ["s1"])),
     redis_get: stat5(cpu1k("redis_get"; ["redis"])),
     cluster_router_get_router: stat5(cpu1k("cluster_router_get"; ["rt"])),
     cluster_router_get_nodes: stat5(cpu1k("cluster_router_get"; ["t1", "t2", "t3"])),
     cluster_direct_get_nodes: stat5(cpu1k("cluster_direct_get"; ["t1", "t2", "t3"])),
     cluster_direct_get3_nodes: stat5(cpu1k("cluster_direct_get3"; ["t1", "t2", "t3"])),
     cluster_router_a_nodes: stat5(cpu1k("cluster_router_a"; ["t1", "t2", "t3"])),
     cluster_direct_a_nodes: stat5(cpu1k("cluster_direct_a"; ["t1", "t2", "t3"]))},
   errors: (map(.errors) | add)}' "$tmp/runs.jsonl"
