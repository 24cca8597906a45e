#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a local hotkv cluster on 127.0.0.1: N kvnode processes and one
# kvrouter, initialised with `kvctl cluster init` on first start.
#
#   deploy/local-cluster.sh [--nodes N] [--port BASE] [--rf R] [--data DIR]
#                           [--bin DIR] [--foreground] [--auth TOKEN]
#   deploy/local-cluster.sh stop [--data DIR]
#
# The router listens on BASE (default 7000), node i on BASE+i; their HTTP
# listeners (/metrics, /health, the router's dashboard at /) on BASE+2000
# and BASE+2000+i. Data and logs
# go under DIR (default ./data): DIR/nI/ for node data, DIR/logs/*.log, and
# DIR/pids. With --foreground the script waits until Ctrl-C (or SIGTERM),
# then stops every process it started.
set -euo pipefail

nodes=3 port=7000 rf="" data=./data bin="" fg=0 cmd=start auth=""
while [ $# -gt 0 ]; do
  case "$1" in
    stop) cmd=stop ;;
    --nodes) nodes="$2"; shift ;;
    --port) port="$2"; shift ;;
    --rf) rf="$2"; shift ;;
    --data) data="$2"; shift ;;
    --bin) bin="$2"; shift ;;
    --auth) auth="$2"; shift ;;
    --foreground) fg=1 ;;
    -h|--help) sed -n '3,14p' "$0"; exit 0 ;;
    *) echo "local-cluster.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
case "$nodes" in ''|*[!0-9]*) echo "--nodes must be a number" >&2; exit 2 ;; esac
case "$port" in ''|*[!0-9]*) echo "--port must be a number" >&2; exit 2 ;; esac
[ -n "$rf" ] || rf=$(( nodes < 3 ? nodes : 3 ))
here="$(cd "$(dirname "$0")/.." && pwd)"
[ -n "$bin" ] || bin="$here/build"
mkdir -p "$data/logs"
data="$(cd "$data" && pwd)"
pids="$data/pids"

stop_all() {
  [ -f "$pids" ] || return 0
  while read -r pid name; do
    kill -TERM "$pid" 2>/dev/null || true
  done < "$pids"
  for _ in $(seq 50); do
    alive=0
    while read -r pid name; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$pids"
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  while read -r pid name; do kill -KILL "$pid" 2>/dev/null || true; done < "$pids"
  rm -f "$pids"
}

if [ "$cmd" = stop ]; then
  stop_all
  exit 0
fi

for b in node/kvnode shard/kvrouter client/kvctl; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: build first (cmake --build build)" >&2; exit 1; }
done
kvctl=("$bin/client/kvctl" --timeout 2000)
[ -n "$auth" ] && kvctl+=(--auth "$auth")
authflag=()
[ -n "$auth" ] && authflag=(--auth "$auth")

stop_all
: > "$pids"
trap 'stop_all; exit 130' INT TERM

specs=() seeds=()
for i in $(seq 1 "$nodes"); do
  addr="tcp://127.0.0.1:$((port + i))"
  mkdir -p "$data/n$i"
  # each node gets a fast and a slow volume (here two folders of one disk)
  "$bin/node/kvnode" --id "n$i" --listen "$addr" --data-dir "$data/n$i" \
    --fast-dir "$data/n$i/fast" --slow-dir "$data/n$i/slow" "${authflag[@]}" \
    --http-listen "http://127.0.0.1:$((port + 2000 + i))" \
    >> "$data/logs/n$i.log" 2>&1 &
  echo "$! n$i" >> "$pids"
  specs+=("n$i=$addr")
  seeds+=("$addr")
done

wait_ping() { # ADDR: wait until it answers admin.Ping (10 s)
  for _ in $(seq 100); do
    "${kvctl[@]}" --router "$1" ping > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$1 did not come up; see $data/logs/" >&2
  return 1
}
for a in "${seeds[@]}"; do wait_ping "$a" || { stop_all; exit 1; }; done

epoch=$("${kvctl[@]}" --router "${seeds[0]}" --json ping | sed -n 's/.*"map_epoch":\([0-9]*\).*/\1/p')
if [ "${epoch:-0}" = 0 ]; then
  "${kvctl[@]}" cluster init --rf "$rf" "${specs[@]}" || { stop_all; exit 1; }
fi

router="tcp://127.0.0.1:$port"
seedlist=$(IFS=,; echo "${seeds[*]}")
"$bin/shard/kvrouter" --listen "$router" --seeds "$seedlist" "${authflag[@]}" \
  --http-listen "http://127.0.0.1:$((port + 2000))" >> "$data/logs/router.log" 2>&1 &
echo "$! router" >> "$pids"
wait_ping "$router" || { stop_all; exit 1; }
for _ in $(seq 100); do # until the router has learned the map
  "${kvctl[@]}" --router "$router" status > /dev/null 2>&1 && break
  sleep 0.1
done
echo "hotkv: $nodes nodes + router on $router (rf $rf, data $data)"
echo "dashboard: http://127.0.0.1:$((port + 2000))/ (metrics at /metrics; node i's at port $((port + 2000)) + i)"

if [ $fg -eq 1 ]; then
  trap 'echo; echo "stopping..."; stop_all; exit 0' INT TERM
  reported=" "
  while true; do
    while read -r pid name; do
      if ! kill -0 "$pid" 2>/dev/null && [[ "$reported" != *" $pid "* ]]; then
        echo "$name (pid $pid) exited; see $data/logs/$name.log" >&2
        reported="$reported$pid "
      fi
    done < "$pids"
    sleep 2 & wait $!
  done
fi
