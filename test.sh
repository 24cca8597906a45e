#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs dependencies, builds and runs every test.
#   ./test.sh             Release-with-asserts build in build/, then ctest
#   ./test.sh --sanitize  ASan+UBSan build in build-asan/
#   ./test.sh --tsan      ThreadSanitizer build in build-tsan/, the tests labelled tsan
#                         (the concurrent modules; Criterion cannot start under TSan,
#                         tests/kv_testfw.h runs those without it), then cluster tests
#                         of build/ (from ./test.sh) against the TSan-built kvnode,
#                         kvrouter and kvctl: a data race there kills the process
#   ./test.sh --fuzz SECONDS  libFuzzer harnesses (tests/fuzz, clang) built in build-fuzz/,
#                         each run for SECONDS from its seed corpus; fails when one finds
#                         a crash, a leak, an OOM or a hang, printing the reproducer
# Extra arguments after `--` go to ctest (e.g. ./test.sh -- -R hotring).
set -euo pipefail
cd "$(dirname "$0")"
mode=release
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) mode=asan ;;
    --tsan) mode=tsan ;;
    --fuzz)
      mode=fuzz
      fuzz_secs="${2:-}"
      [[ "$fuzz_secs" =~ ^[0-9]+$ ]] || { echo "usage: $0 --fuzz SECONDS" >&2; exit 2; }
      shift ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "usage: $0 [--sanitize|--tsan|--fuzz SECONDS] [-- ctest args]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$mode" = fuzz ]; then
  ./deploy/deps.sh --fuzz
  exec tests/fuzz/run.sh "$fuzz_secs"
fi
./deploy/deps.sh
case "$mode" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=Debug "-DKV_SANITIZE=address,undefined") ;;
  tsan) dir=build-tsan; flags=(-DCMAKE_BUILD_TYPE=Debug -DKV_SANITIZE=thread) ;;
esac
werror=()
[ -n "${CI:-}" ] && werror=(-DKV_WERROR=ON)
cmake -S . -B "$dir" "${flags[@]}" -DKV_BUILD_TESTS=ON -DKV_BUILD_BENCH=ON ${werror[@]+"${werror[@]}"} >/dev/null
cmake --build "$dir" -j"$(nproc)"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp:${TSAN_OPTIONS:-}"
cd "$dir"
if [ "$mode" = tsan ] && [ ${#ctest_args[@]} -eq 0 ]; then
  ctest_args=(-L tsan)
fi
ctest --output-on-failure -j2 ${ctest_args[@]+"${ctest_args[@]}"}
if [ "$mode" = tsan ] && [ ${#ctest_args[@]} -eq 2 ] && [ "${ctest_args[1]}" = tsan ]; then
  # The cluster's own threads (streams, hints, the failure detector, fan-out)
  # run in processes that Criterion tests start: run a subset of those tests,
  # built normally, against the TSan binaries.
  rel="$PWD/../build"
  if [ ! -x "$rel/tests/integration/stream_test" ]; then
    echo "test.sh --tsan: build/ has no integration tests; run ./test.sh first" >&2
    exit 1
  fi
  export KV_BUILD_DIR="$PWD" KV_SOURCE_DIR="$PWD/.."
  "$rel/tests/integration/stream_test" --jobs 1
  "$rel/tests/integration/repair_test" --jobs 1 \
    --filter 'repair/@(hints_bring*|a_read_repairs*|a_wiped*)'
  "$rel/tests/integration/elastic_test" --jobs 1 --filter 'elastic/@(add_a_node*|two_admins*)'
  "$rel/tests/integration/direct_test" --jobs 1 --filter 'direct/@(writes_reach*|survives*|coordinated*|reads_the*)'
  # the router's asynchronous calls (started and completed on nng's threads)
  "$rel/tests/integration/cluster_test" --jobs 1 \
    --filter 'cluster/@(ten_thousand*|rf3_survives*|conditional*)'
fi
