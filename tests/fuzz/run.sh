#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the libFuzzer harnesses in build-fuzz/ (clang, KV_FUZZ=ON) and runs
# each for SECONDS from its committed seeds (tests/fuzz/corpus/NAME, read
# only; what a run adds goes to build-fuzz/fuzz-corpus/NAME). Prints one line
# per harness with its executions; exits 1 when any harness found a crash, a
# leak, an OOM or a hang, after printing where the reproducer is and the
# command that replays it. Called by ./test.sh --fuzz SECONDS (which installs
# clang first). FUZZ_STRICT=1 also checks the invariants of defects filed
# for other modules (tests/fuzz/README.md); FUZZ_ONLY=NAME runs one harness.
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
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
mkdir -p "$dir/fuzz-crashes" "$dir/fuzz-logs"
failed=0
total_runs=0
for name in $(cat "$dir/tests/fuzz/harnesses.txt"); do
  [ -n "${FUZZ_ONLY:-}" ] && [ "$name" != "$FUZZ_ONLY" ] && continue
  short=${name#fuzz_}
  work="$dir/fuzz-corpus/$short"
  log="$dir/fuzz-logs/$name.log"
  mkdir -p "$work"
  start=$(date +%s)
  rc=0
  "$dir/tests/fuzz/$name" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$dir/fuzz-crashes/$name-" \
    "$work" "tests/fuzz/corpus/$short" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  runs=${runs:-0}
  total_runs=$((total_runs + runs))
  if [ "$rc" -eq 0 ]; then
    echo "fuzz: $name: $runs executions in $(( $(date +%s) - start )) s, nothing found"
    continue
  fi
  failed=1
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
  echo "fuzz: $name FAILED (exit $rc) after $runs executions; log $log" >&2
  grep -E "^==[0-9]+==ERROR|^==FUZZ==|^SUMMARY|^    #[0-9] " "$log" | head -30 >&2 || true
  if [ -n "$artifact" ]; then
    echo "fuzz: reproducer $artifact; replay: $dir/tests/fuzz/$name $artifact" >&2
  fi
done
echo "fuzz: $total_runs executions in all"
exit "$failed"
