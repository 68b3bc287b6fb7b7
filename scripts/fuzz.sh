#!/usr/bin/env bash
# Fuzzes forge's readers of untrusted input (tests/fuzz/fuzz_targets.h, SECURITY.md) with libFuzzer
# under AddressSanitizer + UndefinedBehaviorSanitizer (clang 19).
#
#   scripts/fuzz.sh                          # every target, 600 s each, two at a time
#   scripts/fuzz.sh --seconds 60 toml json   # some targets, shorter
#   BUILD_DIR=build-fuzz JOBS=2 scripts/fuzz.sh ...
#
# Installs clang-19, libclang-rt-19-dev and libomp-19-dev with apt-get when they are missing, builds
# forge_libfuzzer in $BUILD_DIR, and runs each target from a working copy of its corpus
# ($BUILD_DIR/corpus/<target>, seeded from tests/fuzz/corpus/<target>). Findings (crash-*, leak-*,
# timeout-*, oom-*) go to $BUILD_DIR/findings/<target>/, logs to $BUILD_DIR/logs/<target>.log, and
# the figures of every target (executions, executions/s, coverage, corpus, peak memory, findings)
# to $BUILD_DIR/summary.md. Exit 1 when a target found something.
#
# A finding is fixed in forge, then its input is kept as tests/fuzz/corpus/<target>/crash_<what>, which
# `make test` replays (with and without the sanitizers) from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=600
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}
CLANG=${CLANG:-clang++-19}

have_tools() {
  command -v "$CLANG" > /dev/null && [ -e /usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.fuzzer-x86_64.a ] &&
    [ -e /usr/lib/llvm-19/lib/clang/19/include/omp.h ]
}
if ! have_tools; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends clang-19 libclang-rt-19-dev libomp-19-dev
fi

# Every object with coverage and the sanitizers (fuzzer-no-link), forge_libfuzzer linked with libFuzzer.
CC=${CLANG/++/} CXX=$CLANG cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined,fuzzer-no-link -fno-omit-frame-pointer -O1" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined -DFORGE_CUDA=OFF -DFORGE_BUILD_TESTS=ON \
  -DFORGE_BUILD_BENCHMARKS=OFF -DFORGE_FUZZ=ON > "$BUILD_DIR.configure.log"
cmake --build "$BUILD_DIR" -j "$(nproc)" --target forge_libfuzzer
FUZZER=$BUILD_DIR/tests/forge_libfuzzer
if [ ${#TARGETS[@]} -eq 0 ]; then
  mapfile -t TARGETS < <("$BUILD_DIR/tests/forge_fuzz_replay" --list 2>/dev/null | awk '{print $1}' || true)
  if [ ${#TARGETS[@]} -eq 0 ]; then
    cmake --build "$BUILD_DIR" -j "$(nproc)" --target forge_fuzz_replay
    mapfile -t TARGETS < <("$BUILD_DIR/tests/forge_fuzz_replay" --list | awk '{print $1}')
  fi
fi

mkdir -p "$BUILD_DIR/logs" "$BUILD_DIR/findings" "$BUILD_DIR/corpus"
run_one() {  # target
  local t=$1 corpus=$BUILD_DIR/corpus/$1 findings=$BUILD_DIR/findings/$1
  mkdir -p "$corpus" "$findings"
  cp -n tests/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  # Leaks are checked (libFuzzer's default); a single allocation over 2 GiB, 4 GiB resident or
  # 10 s for one input are findings (Note [tokenizer file limits], [checked sizes]: nothing forge
  # reads may ask for that).
  FORGE_FUZZ_TARGET=$t ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-19 || command -v llvm-symbolizer || true)} \
    "$FUZZER" "$corpus" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" > "$BUILD_DIR/logs/$t.log" 2>&1 || true
}
export -f run_one
export BUILD_DIR SECONDS_EACH FUZZER
echo "fuzz.sh: ${#TARGETS[@]} targets x ${SECONDS_EACH} s, ${JOBS} at a time -> $BUILD_DIR/summary.md"
printf '%s\n' "${TARGETS[@]}" | xargs -P "$JOBS" -I{} bash -c 'run_one {}'

found=0
{
  echo "| target | executions | exec/s | seconds | coverage (edges) | features | corpus | peak RSS MB | findings |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for t in "${TARGETS[@]}"; do
    log=$BUILD_DIR/logs/$t.log
    stat() { grep -o "stat::$1: *[0-9]*" "$log" | awk '{print $2}' | tail -1; }
    last=$(grep -E "^#[0-9]+" "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<< "$last")
    n=$(find "$BUILD_DIR/findings/$t" -type f | wc -l)
    [ "$n" -gt 0 ] && found=1
    echo "| $t | $(stat number_of_executed_units) | $(stat average_exec_per_sec) | $SECONDS_EACH | ${cov:-?} | ${ft:-?} | ${corp:-?} | $(stat peak_rss_mb) | $n |"
  done
} > "$BUILD_DIR/summary.md"
cat "$BUILD_DIR/summary.md"
exit $found
