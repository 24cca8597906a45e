# SPDX-License-Identifier: MIT
# Shell helpers of the cluster benchmarks (elastic_bench.sh, repair_bench.sh),
# sourced, not run: loopback kvnode/kvrouter processes under one temp dir,
# each tracked and stopped on exit; numbers from the tools' one-line JSON
# objects with awk (no jq: these scripts need only what ./test.sh installs);
# windows of a kvbench --timeline; medians.
#
# The caller sets BUILD (build dir) and TMP (its temp dir, removed by
# cl_cleanup unless CL_KEEP is set) and installs `trap cl_cleanup EXIT`.

declare -A CL_PID # process name (n1, router, ...) -> pid
CL_KVCTL_TIMEOUT=10000

cl_log() { echo "${CL_NAME:-bench}: $*" >&2; }
cl_load1() { cut -d' ' -f1 /proc/loadavg; }
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
  cl_wait_ping "$(cl_url "$port")"
}

# Starts the router on PORT with the given seeds; waits until it has the map.
cl_router() { # PORT SEEDS [FLAGS...]
  local port=$1 seeds=$2
  shift 2
  "$BUILD/shard/kvrouter" --listen "$(cl_url "$port")" --seeds "$seeds" "$@" \
    >> "$TMP/logs/router.log" 2>&1 &
  CL_PID[router]=$!
  cl_wait_ping "$(cl_url "$port")" || return 1
  for _ in $(seq 100); do
    cl_kvctl --router "$(cl_url "$port")" status > /dev/null 2>&1 && return 0
    sleep 0.1
  done
  cl_log "the router on port $port has no map; logs in $TMP/logs"
  return 1
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
