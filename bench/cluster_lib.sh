# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Shell helpers of the cluster benchmarks (elastic_bench.sh, repair_bench.sh),
# sourced, not run: loopback kvnode/kvrouter processes under one temp dir,
# each tracked and stopped on exit; numbers from the tools' one-line JSON
# objects with awk (no jq: these scripts need only what ./test.sh installs);
# windows of a kvbench --timeline; medians.
#
# The caller sets BUILD (build dir), TMP (its temp dir, removed by
# cl_cleanup unless CL_KEEP is set) and CL_PORT (the router's port; node nI
# listens on CL_PORT+I), and installs `trap cl_cleanup EXIT`.

declare -A CL_PID # process name (n1, router, ...) -> pid
CL_KVCTL_TIMEOUT=10000

cl_log() { echo "${CL_NAME:-bench}: $*" >&2; }
cl_load1() { cut -d' ' -f1 /proc/loadavg; }
# How many ctest processes run on the host (a test suite beside a benchmark
# makes its figures noise; the rounds record it).
cl_ctests() { pgrep -xc ctest || true; }
cl_now_ms() { date +%s%3N; }
cl_url() { echo "tcp://127.0.0.1:$1"; } # PORT
cl_kvctl() { "$BUILD/client/kvctl" --timeout "$CL_KVCTL_TIMEOUT" "$@"; }

# Refuses to run when one of the ports already answers.
cl_ports_free() { # PORT...
  local p
  for p in "$@"; do
    if (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null; then
      echo "$0: port $p is in use (pick another base with --port)" >&2
      return 1
    fi
  done
}

# Sends SIG (TERM) to process NAME and waits until it is gone (TENTHS of a
# second, default 50, then SIGKILL).
cl_stop() { # NAME [SIG [TENTHS]]
  local pid=${CL_PID[$1]:-}
  [ -n "$pid" ] || return 0
  kill "-${2:-TERM}" "$pid" 2> /dev/null || true
  for _ in $(seq "${3:-50}"); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  unset "CL_PID[$1]"
}

cl_stop_all() {
  local n
  for n in "${!CL_PID[@]}"; do kill -TERM "${CL_PID[$n]}" 2> /dev/null || true; done
  for n in "${!CL_PID[@]}"; do cl_stop "$n"; done
}

cl_cleanup() {
  cl_stop_all
  if [ -n "${CL_KEEP:-}" ]; then
    cl_log "kept $TMP"
  elif [ -n "${TMP:-}" ]; then
    rm -rf "$TMP"
  fi
}

# Runs CMD (a binary, not a shell function) in the background as process
# NAME and waits for it, so that a signal to the script is handled at once
# (bash runs traps only after a foreground command ends); returns its status.
cl_fg() { # NAME CMD...
  local name=$1 rc=0
  shift
  "$@" &
  CL_PID[$name]=$!
  wait "${CL_PID[$name]}" || rc=$?
  unset "CL_PID[$name]"
  return $rc
}

# sleep that a signal interrupts.
cl_sleep() { # SECONDS
  sleep "$1" &
  wait $! || true
}

cl_wait_ping() { # ADDR [TENTHS]
  for _ in $(seq "${2:-100}"); do
    cl_kvctl --router "$1" ping > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  cl_log "$1 did not answer; logs in $TMP/logs"
  return 1
}

# Starts kvnode ID on PORT with data in DIR (logs appended to TMP/logs/ID.log).
cl_node() { # ID PORT DIR [FLAGS...]
  local id=$1 port=$2 dir=$3
  shift 3
  mkdir -p "$dir" "$TMP/logs"
  "$BUILD/node/kvnode" --id "$id" --listen "$(cl_url "$port")" --data-dir "$dir" "$@" \
    >> "$TMP/logs/$id.log" 2>&1 &
  CL_PID[$id]=$!
  disown # no "Killed" line from bash when a benchmark SIGKILLs it
  cl_wait_ping "$(cl_url "$port")"
}

# Starts the router on PORT with the given seeds; waits until it has the map.
cl_router() { # PORT SEEDS [FLAGS...]
  local port=$1 seeds=$2
  shift 2
  "$BUILD/shard/kvrouter" --listen "$(cl_url "$port")" --seeds "$seeds" "$@" \
    >> "$TMP/logs/router.log" 2>&1 &
  CL_PID[router]=$!
  disown
  cl_wait_ping "$(cl_url "$port")" || return 1
  for _ in $(seq 100); do
    cl_kvctl --router "$(cl_url "$port")" status > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  cl_log "the router on port $port has no map; logs in $TMP/logs"
  return 1
}

cl_nurl() { cl_url $((CL_PORT + $1)); } # I: node nI's address
cl_router_url() { cl_url "$CL_PORT"; }

# Starts n1..n3 (data in DIR/nI, the node flags given) and the router; runs
# cluster init with RF on the first start in DIR.
cl_start3() { # DIR RF [NODE_FLAGS...]
  local dir=$1 rf=$2 i
  shift 2
  for i in 1 2 3; do cl_node "n$i" $((CL_PORT + i)) "$dir/n$i" "$@"; done
  if [ ! -f "$dir/.init" ]; then
    cl_kvctl --router "$(cl_nurl 1)" cluster init --rf "$rf" "n1=$(cl_nurl 1)" \
      "n2=$(cl_nurl 2)" "n3=$(cl_nurl 3)" > /dev/null
    touch "$dir/.init"
  fi
  cl_router "$CL_PORT" "$(cl_nurl 1),$(cl_nurl 2),$(cl_nurl 3)"
}

# The options both benchmarks take, with their defaults; cl_opt parses one.
BUILD=build vsize=100 rounds=3 warmup=5 baseline=20 after=5 workload=A dist=zipf threads=2
conc=16 mbps=0

# Parses option $1 (value $2) if it is a common one; returns how many words
# it took (1 or 2), 0 if it is not a common option.
cl_opt() { # OPTION [VALUE]
  case "$1" in
    --value-size) vsize=$2 ;;
    --rounds) rounds=$2 ;;
    --warmup) warmup=$2 ;;
    --baseline) baseline=$2 ;;
    --after) after=$2 ;;
    --workload) workload=$2 ;;
    --dist) dist=$2 ;;
    --threads) threads=$2 ;;
    --concurrency) conc=$2 ;;
    --stream-mbps) mbps=$2 ;;
    --port) CL_PORT=$2 ;;
    --build) BUILD=$2 ;;
    --keep) CL_KEEP=1; return 1 ;;
    *) return 0 ;;
  esac
  [ $# -ge 2 ] || { echo "$0: $1 needs a value" >&2; exit 2; }
  return 2
}

# Exits with a usage error unless each named variable holds a whole number.
cl_whole_numbers() { # VAR...
  local v
  for v in "$@"; do
    case "${!v}" in '' | *[!0-9]*) echo "$0: $v must be a whole number" >&2; exit 2 ;; esac
  done
}

# Checks the common options, the binaries and that ports
# CL_PORT..CL_PORT+NPORTS-1 are free, sets MBPS_FLAG (kvctl's
# --stream-mbps, or nothing for the nodes' default), makes TMP and installs
# the traps (cl_cleanup on exit, also on a signal).
cl_setup() { # NAME NPORTS
  local b i ports=()
  cl_whole_numbers vsize rounds warmup baseline after threads conc mbps CL_PORT
  if [ "$rounds" -lt 1 ] || [ "$baseline" -lt 2 ]; then
    echo "$0: --rounds >= 1, --baseline >= 2" >&2
    exit 2
  fi
  MBPS_FLAG=()
  if [ "$mbps" -gt 0 ]; then MBPS_FLAG=(--stream-mbps "$mbps"); fi
  for b in node/kvnode shard/kvrouter client/kvctl bench/kvbench/kvbench; do
    [ -x "$BUILD/$b" ] || { echo "$0: missing $BUILD/$b (build first)" >&2; exit 2; }
  done
  for ((i = 0; i < $2; i++)); do ports+=($((CL_PORT + i))); done
  cl_ports_free "${ports[@]}" || exit 2
  TMP=$(mktemp -d "/tmp/$1.XXXXXX")
  trap cl_cleanup EXIT
  trap 'exit 130' INT TERM
}

# Starts n1..n3 with RF in TMP/base, loads N keys of B bytes and stops
# them: every round starts from a copy of these data dirs (cl_copy_base).
# Sets LOAD_S (seconds the load took) and DATA_MB (size of the dirs).
cl_make_base() { # RF N B
  local line
  cl_start3 "$TMP/base" "$1"
  cl_load "$2" "$3"
  line=$(tail -n 1 "$TMP/load.json")
  [ "$(jnum loaded <<< "$line")" = "$2" ] || { cl_log "load failed:"; tail -n 5 "$TMP/load.err" >&2; exit 1; }
  LOAD_S=$(jnum load_s <<< "$line")
  cl_log "loaded $2 keys in $LOAD_S s; stopping to keep the data dirs"
  cl_stop_all
  DATA_MB=$(du -sm "$TMP/base" | cut -f1)
}

# A fresh copy of TMP/base in DIR.
cl_copy_base() { # DIR
  rm -rf "$1"
  cp -a "$TMP/base" "$1"
}

# Moves a round's DIR to TMP/NAME with --keep (CL_KEEP), else removes it.
cl_done_dir() { # DIR NAME
  if [ -n "${CL_KEEP:-}" ]; then mv "$1" "$TMP/$2"; else rm -rf "$1"; fi
}

# `kvctl --json status` through the router: one line, every node's stats.
cl_status() { cl_kvctl --router "$(cl_router_url)" --json status 2> /dev/null || true; }

# Node ID's field NAME (its "serving" state, or one of its admin.Stats,
# which are strings) from a cl_status line.
cl_node_stat() { # STATUS_JSON ID NAME
  awk -v id="{\"id\":\"$2\"" -v k="\"$3\":\"" '{ i = index($0, id); if (!i) exit
    s = substr($0, i); j = index(s, k); if (!j) exit; s = substr(s, j + length(k))
    print substr(s, 1, index(s, "\"") - 1) }' <<< "$1"
}

# Waits (60 s) until N nodes serve, as the router's status shows them.
cl_wait_serving() { # N
  for _ in $(seq 300); do
    [ "$(cl_status | grep -o '"serving":"serving"' | wc -l)" -ge "$1" ] && return 0
    sleep 0.2
  done
  cl_log "the nodes did not all serve within 60 s"
  return 1
}

# Loads ids 0..N-1 (B-byte values) through the router at the default
# consistency (writes QUORUM); kvbench's summary is the last line of
# TMP/load.json. Not to be run in $(...): cl_cleanup must see its pid.
cl_load() { # N B
  cl_fg load "$BUILD/bench/kvbench/kvbench" --router "$(cl_router_url)" --keys "$1" \
    --value-size "$2" --report-top 0 --timeout-ms 30000 --load --load-seconds 3600 \
    --workload C --seconds 0.2 --threads 2 --concurrency 32 > "$TMP/load.json" \
    2> "$TMP/load.err" || true
}

# Starts kvbench through the router in the background (process "kvbench")
# with a 500 ms timeline in DIR/tl.jsonl; cl_bench_stop ends it (SIGINT: it
# still reports and writes the timeline).
cl_bench_start() { # DIR KVBENCH_ARGS...
  local dir=$1
  shift
  "$BUILD/bench/kvbench/kvbench" --router "$(cl_router_url)" --report-top 0 --timeout-ms 10000 \
    --seconds 3600 --timeline "$dir/tl.jsonl" --timeline-ms 500 "$@" \
    > "$dir/kvbench.json" 2> "$dir/kvbench.err" &
  CL_PID[kvbench]=$!
  disown
}
cl_bench_stop() { cl_stop kvbench INT 300; }

# The measured part of a round: kvbench through the router (the common
# options' workload) for warmup + baseline seconds, then `kvctl --json
# KVCTL_ARGS` (output in DIR/kvctl.jsonl and .err), after seconds more, then
# kvbench stops. Sets L0/L1 (load average at the start/end), CT (ctest
# processes at kvctl's start plus end), K0/K1 (kvctl's start/end, wall-clock
# ms), KVCTL_RC, and WINDOWS: the JSON fields of cl_windows_json, with
# baseline = [kvbench start + warmup, K0), during = [K0, K1), after.
cl_measure() { # DIR WHAT KVCTL_ARGS...
  local dir=$1 what=$2 t0
  shift 2
  L0=$(cl_load1) KVCTL_RC=0
  cl_bench_start "$dir" --keys "$keys" --value-size "$vsize" --workload "$workload" \
    --dist "$dist" --threads "$threads" --concurrency "$conc"
  cl_sleep $((warmup + baseline))
  cl_log "$what (load average $(cl_load1))"
  CT=$(cl_ctests)
  K0=$(cl_now_ms)
  cl_fg kvctl timeout 3600 "$BUILD/client/kvctl" --router "$(cl_router_url)" --timeout 30000 \
    --json "${MBPS_FLAG[@]}" "$@" > "$dir/kvctl.jsonl" 2> "$dir/kvctl.err" || KVCTL_RC=$?
  K1=$(cl_now_ms)
  cl_sleep "$after"
  cl_bench_stop
  L1=$(cl_load1)
  CT=$((CT + $(cl_ctests)))
  if [ "$KVCTL_RC" -ne 0 ]; then
    cl_log "$what: kvctl failed ($KVCTL_RC):"
    tail -n 3 "$dir/kvctl.err" >&2
  fi
  t0=$(head -n 1 "$dir/tl.jsonl" | jnum unix_ms)
  WINDOWS=$(cl_windows_json "$dir/tl.jsonl" $((t0 + warmup * 1000)) "$K0" "$K1" $((K1 + after * 1000)))
}

# The client figures of three windows of the timeline in TL (wall-clock ms:
# base [B0, B1), during [B1, D1), after [D1, A1)) as JSON fields
# (base_*, during_*, after_*: ops_s, p50_us, p99_us, errors, s) and the
# ratios tput_ratio (during/base ops/s) and p99_ratio (during/base p99).
cl_windows_json() { # TL B0 B1 D1 A1
  local b d a
  read -r -a b <<< "$(tl_window "$1" "$2" "$3")"
  read -r -a d <<< "$(tl_window "$1" "$3" "$4")"
  read -r -a a <<< "$(tl_window "$1" "$4" "$5")"
  local w v
  for w in base during after; do
    case $w in base) v=("${b[@]}") ;; during) v=("${d[@]}") ;; after) v=("${a[@]}") ;; esac
    printf '"%s_ops_s":%s,"%s_p50_us":%s,"%s_p99_us":%s,"%s_errors":%s,"%s_s":%s,' \
      "$w" "${v[0]}" "$w" "${v[1]}" "$w" "${v[2]}" "$w" "${v[3]}" "$w" "${v[4]}"
  done
  printf '"tput_ratio":%s,"p99_ratio":%s' "$(ratio "${d[0]}" "${b[0]}")" "$(ratio "${d[2]}" "${b[2]}")"
}

# The values of FIELD over the JSON lines of FILE (nulls left out).
cl_col() { # FILE FIELD
  local l
  while read -r l; do jnum "$2" <<< "$l"; done < "$1" | grep -v null || true
}

# Starts the global SUMMARY (the summary line) with the run's settings.
cl_summary_start() { # BENCH RF
  SUMMARY="{\"summary\":true,\"bench\":\"$1\",\"keys\":$keys,\"value_size\":$vsize,\"rf\":$2"
  SUMMARY+=",\"rounds\":$rounds,\"workload\":\"$workload\",\"dist\":\"$dist\",\"threads\":$threads"
  SUMMARY+=",\"concurrency\":$conc,\"stream_mbps\":$([ "$mbps" -gt 0 ] && echo "$mbps" || echo '"default"')"
  SUMMARY+=",\"load_s\":$LOAD_S,\"data_mb\":$DATA_MB"
}

# The client errors of the base, during and after windows of every round.
cl_client_errors() { # FILE
  local w v n=0
  for w in base during after; do
    for v in $(cl_col "$1" "${w}_errors"); do n=$((n + ${v%.*})); done
  done
  echo "$n"
}

# Appends ,"F":median,"F_min":..,"F_max":.. for each FIELD over the lines of
# FILE to the global SUMMARY and keeps the medians in MED[F].
declare -A MED
cl_summarize() { # FILE FIELD...
  local file=$1 f m lo hi
  shift
  for f in "$@"; do
    # shellcheck disable=SC2046 # one number per word
    read -r m lo hi <<< "$(stats3 $(cl_col "$file" "$f"))"
    MED[$f]=$m
    SUMMARY+=",\"$f\":$m,\"${f}_min\":$lo,\"${f}_max\":$hi"
  done
}

# A table on stderr: one row per JSON line of FILE with the FIELDs, then the
# medians (MED, from cl_summarize).
cl_table() { # FILE FIELD...
  local file=$1 f l
  shift
  {
    echo
    for f in round "$@"; do printf '%*s ' $((${#f} > 9 ? ${#f} : 9)) "$f"; done
    echo
    while read -r l; do
      for f in round "$@"; do printf '%*s ' $((${#f} > 9 ? ${#f} : 9)) "$(jnum "$f" <<< "$l")"; done
      echo
    done < "$file"
    printf '%9s ' median
    for f in "$@"; do printf '%*s ' $((${#f} > 9 ? ${#f} : 9)) "${MED[$f]:-}"; done
    echo
  } >&2
}

# "true" when X OP T (OP ge or le), "null" when X is null.
cl_met() { # X T OP
  awk -v x="$1" -v t="$2" -v op="$3" 'BEGIN { if (x == "null" || x == "") print "null"
    else if (op == "ge") print (x >= t ? "true" : "false"); else print (x <= t ? "true" : "false") }'
}

# The first number called NAME in a one-line JSON object on stdin (the first
# occurrence: top-level fields come before the nested "detail" arrays).
jnum() { # NAME
  awk -v k="\"$1\":" '{ i = index($0, k); if (i) { s = substr($0, i + length(k));
    match(s, /^-?[0-9.eE+]+/); if (RLENGTH > 0) { print substr(s, 1, RLENGTH); exit } } }'
}

# The string field NAME of a one-line JSON object on stdin (first occurrence).
jstr() { # NAME
  awk -v k="\"$1\":\"" '{ i = index($0, k); if (i) { s = substr($0, i + length(k));
    print substr(s, 1, index(s, "\"") - 1); exit } }'
}

# Figures of the kvbench --timeline intervals that lie wholly in
# [LO_MS, HI_MS) (wall clock): "ops_per_s p50_us p99_us errors seconds ops"
# with the quantiles over all their ops (their histograms added up).
tl_window() { # FILE LO_MS HI_MS
  awk -v lo="$2" -v hi="$3" '
    function num(k,   i, s) {
      i = index($0, "\"" k "\":"); s = substr($0, i + length(k) + 3)
      match(s, /^-?[0-9.eE+]+/); return substr(s, 1, RLENGTH) + 0
    }
    function quant(q,   rank, seen, i) {
      rank = int(ops * q); if (rank < ops * q) rank++; if (rank < 1) rank = 1
      seen = 0
      for (i = 1; i <= nv; i++) { seen += cnt[v[i]]; if (seen >= rank) return v[i] }
      return v[nv]
    }
    {
      t = num("unix_ms"); ms = num("ms")
      if (t < lo || t + ms > hi) next
      ops += num("ops"); err += num("errors"); dur += ms
      h = $0; sub(/.*"hist":\[\[?/, "", h); sub(/\]?\]\}.*/, "", h)
      n = split(h, a, /\],\[/)
      for (i = 1; i <= n; i++) if (split(a[i], p, ",") == 2) {
        if (!((p[1] + 0) in cnt)) { nv++; v[nv] = p[1] + 0 }
        cnt[p[1] + 0] += p[2]
      }
    }
    END {
      for (i = 2; i <= nv; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      if (ops == 0) { printf "0 0 0 %d %.3f 0\n", err, dur / 1000; exit }
      printf "%.1f %.1f %.1f %d %.3f %d\n", ops / (dur / 1000), quant(0.5), quant(0.99), err, dur / 1000, ops
    }' "$1"
}

# Median, smallest and largest of the numbers given: "median min max".
stats3() { # NUMBER...
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "null null null"; exit }
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%s %s %s\n", f(m), f(v[1]), f(v[NR]) }
    function f(x) { return (x >= 100 || x <= -100) ? sprintf("%.0f", x) : sprintf("%.4g", x) }'
}

# a / b with 3 decimals, "null" when b is 0.
ratio() { # A B
  awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0) print "null"; else printf "%.3f\n", a / b }'
}
