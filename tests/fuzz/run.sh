#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the libFuzzer harnesses in build-fuzz/ (clang, KV_FUZZ=ON) and runs
# each for SECONDS from its committed seeds (tests/fuzz/corpus/NAME, read
# only; what a run adds goes to build-fuzz/fuzz-corpus/NAME). Prints one line
# per harness with its executions; exits 1 when any harness found a crash, a
# leak, an OOM or a hang, after printing where the reproducer is and the
# command that replays it. A crash matching tests/fuzz/known.txt (an open
# defect of another module, reproducer in tests/fuzz/crashes/) is reported
# as known and fuzzing goes on. Called by ./test.sh --fuzz SECONDS (which
# installs clang first). FUZZ_STRICT=0 turns the strict (UTF-8) checks off
# (README.md); FUZZ_ONLY=NAME runs one harness;
# FUZZ_KNOWN_MAX (20) known crashes end a harness's run early.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs="${1:?usage: tests/fuzz/run.sh SECONDS}"
dir=build-fuzz
werror=()
[ -n "${CI:-}" ] && werror=(-DKV_WERROR=ON)
CC=clang CXX=clang++ cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DKV_FUZZ=ON \
  -DKV_BUILD_TESTS=OFF -DKV_BUILD_BENCH=OFF ${werror[@]+"${werror[@]}"} >/dev/null
cmake --build "$dir" --target fuzz -j"$(nproc)"
# Scratch files of the storage harnesses: memory is much faster than disk here.
if [ -w /dev/shm ]; then
  export TMPDIR=/dev/shm
fi
export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/tests/fuzz/lsan.supp:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
mkdir -p "$dir/fuzz-crashes/known" "$dir/fuzz-logs"

# The known.txt line whose pattern the report in $2 matches for harness $1.
known_match() {
  local name=$1 log=$2 h re
  while read -r h re; do
    re=${re%%  #*}
    [ "$h" = "$name" ] && grep -Eq -- "$re" "$log" && { echo "$h $re"; return 0; }
  done < <(grep -v '^#' tests/fuzz/known.txt | grep -v '^[[:space:]]*$')
  return 1
}

# Runs harness $1 for the seconds left until $2, restarting after known
# crashes; prints its line, leaves its execution count in
# fuzz-logs/NAME.runs; returns 1 on a new finding.
run_one() {
  local name=$1 deadline=$2 short=${1#fuzz_} runs=0 known=0 rc left log artifact n=0 m
  local work="$dir/fuzz-corpus/$short"
  mkdir -p "$work"
  while left=$((deadline - $(date +%s))); [ "$left" -gt 0 ]; do
    n=$((n + 1))
    log="$dir/fuzz-logs/$name.$n.log"
    rc=0
    "$dir/tests/fuzz/$name" -max_total_time="$left" -timeout=30 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="$dir/fuzz-crashes/$name-" \
      "$work" "tests/fuzz/corpus/$short" >"$log" 2>&1 || rc=$?
    m=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    runs=$((runs + ${m:-0}))
    [ "$rc" -eq 0 ] && break
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if m=$(known_match "$name" "$log"); then
      known=$((known + 1))
      [ -n "$artifact" ] && mv "$artifact" "$dir/fuzz-crashes/known/"
      echo "fuzz: $name: known crash ($m), going on" >&2
      [ "$known" -ge "${FUZZ_KNOWN_MAX:-20}" ] && break # enough of those
      continue
    fi
    echo "fuzz: $name FAILED (exit $rc) after $runs executions; log $log" >&2
    grep -E "^==[0-9]+==ERROR|^==FUZZ==|runtime error|^SUMMARY|^    #[0-9] " "$log" | head -30 >&2 || true
    if [ -n "$artifact" ]; then
      echo "fuzz: reproducer $artifact; replay: $dir/tests/fuzz/$name $artifact" >&2
    fi
    echo "$runs" >"$dir/fuzz-logs/$name.runs"
    return 1
  done
  echo "$runs" >"$dir/fuzz-logs/$name.runs"
  local note=""
  [ "$known" -gt 0 ] && note=" ($known known, reproducers in $dir/fuzz-crashes/known)"
  echo "fuzz: $name: $runs executions in $secs s, no new crash$note"
}

# The harnesses run FUZZ_JOBS at a time (default: one per core; a libFuzzer
# process is one thread), each for the full SECONDS; their lines are
# printed in order once all have ended.
jobs_max=${FUZZ_JOBS:-$(nproc)}
failed=0
names=()
for name in $(cat "$dir/tests/fuzz/harnesses.txt"); do
  [ -n "${FUZZ_ONLY:-}" ] && [ "$name" != "$FUZZ_ONLY" ] && continue
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
    wait -n || true # the outcome is in NAME.rc
  done
  names+=("$name")
  rm -f "$dir/fuzz-logs/$name.runs" "$dir/fuzz-logs/$name.rc"
  (
    rc=0
    run_one "$name" $(($(date +%s) + secs)) || rc=$?
    echo "$rc" >"$dir/fuzz-logs/$name.rc"
  ) >"$dir/fuzz-logs/$name.out" 2>&1 &
done
wait
total_runs=0
for name in ${names[@]+"${names[@]}"}; do
  cat "$dir/fuzz-logs/$name.out"
  if [ "$(cat "$dir/fuzz-logs/$name.rc" 2>/dev/null)" != 0 ]; then
    failed=1
    [ -s "$dir/fuzz-logs/$name.rc" ] || echo "fuzz: $name ended without its result (killed?)" >&2
  fi
  total_runs=$((total_runs + $(cat "$dir/fuzz-logs/$name.runs" 2>/dev/null || echo 0)))
done
echo "fuzz: $total_runs executions in all"
exit "$failed"
