#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A cluster across hosts: 3 kvnodes and 2 kvrouters, each in its own network
# namespace, joined by veth pairs to a bridge (10.77.0.0/24). Writes through
# one router are read through the other; one node's link goes down (writes
# at QUORUM go on, reads too) and comes back (it catches up from the hints:
# every key read from it directly is current). Needs root (ip netns); exits
# 77 (skipped) with a message where namespaces cannot be created.
set -euo pipefail
build="$1"
K="$build/client/kvctl"
pre="hk$$"
tmp=$(mktemp -d)
br="${pre}br"
nss=()
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2>/dev/null || true; done
  for ns in "${nss[@]+"${nss[@]}"}"; do ip netns del "$ns" 2>/dev/null || true; done
  ip link del "$br" 2>/dev/null || true
  [ -n "${KV_KEEP_TEST_DATA:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
if [ "$(id -u)" -ne 0 ] || ! ip netns add "${pre}probe" 2>/dev/null; then
  echo "SKIP: network namespaces need root and ip netns (not allowed here)"
  exit 77
fi
ip netns del "${pre}probe"
ip link add "$br" type bridge
ip addr add 10.77.0.254/24 dev "$br"
ip link set "$br" up

# host NAME LASTOCTET: a namespace with a veth to the bridge
host() {
  local ns="$pre$1" a="${pre}${1}a" b="${pre}${1}b"
  ip netns add "$ns"
  nss+=("$ns")
  ip link add "$a" type veth peer name "$b"
  ip link set "$b" netns "$ns"
  ip link set "$a" master "$br" up
  ip -n "$ns" addr add "10.77.0.$2/24" dev "$b"
  ip -n "$ns" link set "$b" up
  ip -n "$ns" link set lo up
}
for i in 1 2 3; do host "n$i" "1$i"; done
for i in 1 2; do host "r$i" "2$i"; done

wait_ping() {
  for _ in $(seq 100); do "$K" --router "$1" --timeout 500 ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "no answer from $1" >&2; exit 1
}
for i in 1 2 3; do
  ip netns exec "${pre}n$i" "$build/node/kvnode" --id "n$i" --listen "tcp://10.77.0.1$i:7001" \
    --data-dir "$tmp/n$i" >"$tmp/n$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do wait_ping "tcp://10.77.0.1$i:7001"; done
"$K" cluster init --rf 3 n1=tcp://10.77.0.11:7001 n2=tcp://10.77.0.12:7001 n3=tcp://10.77.0.13:7001
seeds=tcp://10.77.0.11:7001,tcp://10.77.0.12:7001,tcp://10.77.0.13:7001
for i in 1 2; do
  ip netns exec "${pre}r$i" "$build/shard/kvrouter" --listen "tcp://10.77.0.2$i:7000" \
    --seeds "$seeds" >"$tmp/r$i.log" 2>&1 &
  pids+=($!)
done
r1=tcp://10.77.0.21:7000 r2=tcp://10.77.0.22:7000
wait_ping "$r1"; wait_ping "$r2"

view() { # view ID STATE: r1's failure detector holds node ID in STATE
  local st
  st=$("$K" --router "$r1" --timeout 1000 --json status 2>/dev/null || true)
  printf '%s' "$st" | grep -Eq "\"id\":\"$1\",\"address\":\"[^\"]*\",\"state\":\"[^\"]*\",\"serving\":\"[^\"]*\",\"view\":\"$2\""
}
ops() { # ops VERB FROM TO [SUFFIX]: batch lines for keys FROM..TO
  for k in $(seq "$1" "$2"); do
    if [ "$3" = get ]; then echo "get k$k"; else echo "put k$k v$k$4"; fi
  done
}
expect_values() { # expect_values ROUTER FROM TO SUFFIX [EXTRA kvctl flags]
  local out want
  out=$(ops "$2" "$3" get | "$K" --router "$1" --timeout 10000 ${5:-} batch)
  want=$(for k in $(seq "$2" "$3"); do echo "v$k$4"; done)
  if [ "$out" != "$want" ]; then
    echo "FAIL: values of k$2..k$3 through $1 differ" >&2
    diff <(echo "$want") <(echo "$out") | head >&2
    exit 1
  fi
}
ops 1 2000 put "" | "$K" --router "$r1" --timeout 10000 batch >/dev/null
expect_values "$r2" 1 2000 ""
echo "ok ($SECONDS s): 2000 keys written through r1 read through r2"

ip link set "${pre}n2a" down # n2's link to the others goes down
end=$((SECONDS + 30))
until view n2 down || [ $SECONDS -ge $end ]; do sleep 0.1; done # 2 missed pings
ops 1 2000 put "-b" | "$K" --router "$r1" --timeout 10000 batch >/dev/null
expect_values "$r2" 1 2000 "-b" "--consistency quorum"
echo "ok ($SECONDS s): with n2 cut off, QUORUM writes and reads go on"

ip link set "${pre}n2a" up
end=$((SECONDS + 60)) # the router reads from n2 again once its hints are replayed
until view n2 up || [ $SECONDS -ge $end ]; do sleep 0.1; done
view n2 up || { echo "FAIL: r1 never saw n2 up again" >&2; exit 1; }
expect_values tcp://10.77.0.12:7001 1 2000 "-b"
echo "ok ($SECONDS s): n2 back, caught up from its peers' hints: every key current on n2"
