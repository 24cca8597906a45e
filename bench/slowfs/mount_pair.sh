#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# Mounts a fast and a slow slowfs volume side by side and runs a command
# with them, then unmounts both (also on Ctrl-C, SIGTERM or a failing
# command):
#
#   bench/slowfs/mount_pair.sh BASE [command args...]
#
# BASE/fast and BASE/slow are the mount points, served from BASE/fast.backing
# and BASE/slow.backing; the command sees them as $FAST_DIR and $SLOW_DIR.
# Without a command it waits until Ctrl-C. tier_compare.sh sources this file
# for mp_mount / mp_unmount. Environment: SLOWFS (binary, default
# build/bench/slowfs/slowfs), FAST_PROFILE / SLOW_PROFILE (slowfs flags).
#
# Device profiles (what the emulation aims at; cite these when reporting):
#  fast = a local datacenter NVMe SSD. Intel SSD DC P4510 product brief:
#         4 KiB random read latency 77 us, write 18 us (QD1), up to 640k read
#         IOPS, ~3 GB/s sequential. Here: read 80 us, write 20 us, 200k IOPS,
#         2000 MiB/s.
#  slow = a cloud block volume, AWS EBS gp3 at its baseline (Amazon EBS User
#         Guide, "General Purpose SSD volumes": 3,000 IOPS, 125 MiB/s,
#         "single-digit millisecond latency"; I/O counted in units of up to
#         256 KiB). Here: read 1000 us, write 1000 us (fsync too), 3000 IOPS,
#         125 MiB/s.
# FUSE itself adds tens of microseconds per request (more on a loaded host),
# which matters for the fast profile only; compare engines on the same pair.

FAST_PROFILE=${FAST_PROFILE:---read-lat-us 80 --write-lat-us 20 --iops 200000 --mbps 2000}
SLOW_PROFILE=${SLOW_PROFILE:---read-lat-us 1000 --write-lat-us 1000 --iops 3000 --mbps 125}
MP_PIDS=()
MP_MOUNTS=()

mp_is_mounted() { grep -q " $(realpath -m "$1") fuse" /proc/mounts; }

# mp_start NAME BASE PROFILE: one slowfs in the background, waits for it.
mp_start() {
  local name=$1 base=$2 profile=$3 mnt="$2/$1" bk="$2/$1.backing"
  mkdir -p "$mnt" "$bk"
  mp_is_mounted "$mnt" && fusermount3 -u "$mnt"
  # shellcheck disable=SC2086
  "$SLOWFS" --backing "$bk" $profile "$mnt" 2>>"$base/$name.log" &
  MP_PIDS+=($!)
  MP_MOUNTS+=("$mnt")
  for _ in $(seq 100); do
    mp_is_mounted "$mnt" && return 0
    kill -0 "${MP_PIDS[-1]}" 2>/dev/null || break
    sleep 0.05
  done
  echo "mount_pair: slowfs did not mount $mnt (see $base/$name.log)" >&2
  return 1
}

# mp_mount BASE: mounts BASE/fast and BASE/slow; sets FAST_DIR and SLOW_DIR.
mp_mount() {
  local base
  base=$(realpath -m "$1")
  SLOWFS=${SLOWFS:-$(dirname "${BASH_SOURCE[0]}")/../../build/bench/slowfs/slowfs}
  if [[ ! -c /dev/fuse ]] || ! command -v fusermount3 >/dev/null; then
    echo "mount_pair: /dev/fuse or fusermount3 missing: cannot emulate volumes" >&2
    return 1
  fi
  [[ -x $SLOWFS ]] || { echo "mount_pair: no slowfs binary at $SLOWFS" >&2; return 1; }
  mp_start fast "$base" "$FAST_PROFILE" && mp_start slow "$base" "$SLOW_PROFILE" || return 1
  FAST_DIR=$base/fast
  SLOW_DIR=$base/slow
  export FAST_DIR SLOW_DIR
}

# mp_unmount: SIGTERM to each slowfs (it unmounts itself), fusermount3 -u
# for any mount left behind (a killed slowfs).
mp_unmount() {
  local pid mnt
  for pid in "${MP_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${MP_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  for mnt in "${MP_MOUNTS[@]}"; do
    mp_is_mounted "$mnt" && { fusermount3 -u "$mnt" 2>/dev/null || fusermount3 -uz "$mnt"; }
  done
  MP_PIDS=()
  MP_MOUNTS=()
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -u
  [[ $# -ge 1 ]] || { sed -n '4,14p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
  base=$1
  shift
  trap 'mp_unmount' EXIT
  trap 'exit 130' INT TERM
  mp_mount "$base" || exit 1
  echo "mount_pair: FAST_DIR=$FAST_DIR SLOW_DIR=$SLOW_DIR" >&2
  if [[ $# -gt 0 ]]; then
    "$@"
  else
    echo "mount_pair: mounted; Ctrl-C unmounts" >&2
    while :; do
      sleep 3600 &
      wait $! # returns at once on a signal, so the trap runs now
    done
  fi
fi
