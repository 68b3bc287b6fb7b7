#!/usr/bin/env bash
# The GPU machine's check: build forge with the CUDA backend and run its tests.
#
#   scripts/gpu-check.sh            # from anywhere inside the repository
#   BUILD_DIR=build-gpu JOBS=16 BUILD_TYPE=Release scripts/gpu-check.sh
#   SKIP_ALL=1 CUDA_JOBS=8 scripts/gpu-check.sh   # only the CUDA-labelled tests, 8 at a time
#   BUILD_ONLY=1 scripts/gpu-check.sh             # configure and build (e.g. before benchmarks)
#
# Steps: configure (-DFORGE_CUDA=ON) into build-gpu, build, `ctest -L cuda` (the CUDA
# backend against the CPU backend), then the full ctest. The CUDA tests skip themselves
# when no GPU is visible; here that counts as a failure (only the two-GPU peer-copy test
# may skip on a one-GPU machine). Ends with a short summary; exits non-zero on any failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
JOBS="${JOBS:-$(nproc)}"
cd "$ROOT" || exit 2

LOG_DIR="$BUILD_DIR/gpu-check-logs"
declare -a SUMMARY=()
STATUS=0
step() { echo; echo "==== $* ===="; }
record() {  # record NAME RC [detail]
  if [[ "$2" -eq 0 ]]; then SUMMARY+=("PASS  $1${3:+  ($3)}"); else SUMMARY+=("FAIL  $1${3:+  ($3)}"); STATUS=1; fi
}
finish() {
  # On the device tool's machine, $OUT comes back: leave the logs there.
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp -r "$LOG_DIR" "$OUT/" 2>/dev/null || true; fi
  echo
  echo "==== gpu-check summary ===="
  for line in "${SUMMARY[@]}"; do echo "  $line"; done
  [[ "$STATUS" -eq 0 ]] && echo "  RESULT: OK" || echo "  RESULT: FAILED (logs in $LOG_DIR)"
  exit "$STATUS"
}

step "machine"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found: the CUDA tests will skip, which this script counts as a failure"
fi
command -v nvcc >/dev/null 2>&1 && nvcc --version | tail -1
cmake --version | sed -n 1p

CONFIG_ARGS=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" -DFORGE_CUDA=ON)
# Packages the GPU machine lacks travel as .deb files in .deps/ (ignored by git; fetched by
# scripts/fetch-gpu-deps.sh and carried with the run): the demo corpus here.
if compgen -G ".deps/*.deb" >/dev/null && ! [ -d /usr/share/games/fortunes ]; then
  mkdir -p .deps/root
  for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
fi
# xxHash (checkpoint checksums, used header-only), when the machine lacks it.
if compgen -G ".deps/*.deb" >/dev/null && ! [ -f /usr/include/xxhash.h ]; then
  mkdir -p .deps/root
  for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
  CONFIG_ARGS+=(-DXXHASH_INCLUDE_DIR="$ROOT/.deps/root/usr/include")
fi
# The tokenizer libraries, when the machine lacks their headers and .deps carries them.
if compgen -G ".deps/*.deb" >/dev/null && { ! [ -f /usr/include/pcre2.h ] || ! [ -f /usr/include/sentencepiece_processor.h ]; }; then
  mkdir -p .deps/root
  for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
  DEPLIB="$ROOT/.deps/root/usr/lib/x86_64-linux-gnu"
  [ -f /usr/include/pcre2.h ] || ! [ -e "$DEPLIB/libpcre2-8.so" ] || CONFIG_ARGS+=(-DPCRE2_INCLUDE_DIR="$ROOT/.deps/root/usr/include" -DPCRE2_LIBRARY="$DEPLIB/libpcre2-8.so")
  [ -f /usr/include/utf8proc.h ] || ! [ -e "$DEPLIB/libutf8proc.so" ] || CONFIG_ARGS+=(-DUTF8PROC_INCLUDE_DIR="$ROOT/.deps/root/usr/include" -DUTF8PROC_LIBRARY="$DEPLIB/libutf8proc.so")
  [ -f /usr/include/sentencepiece_processor.h ] || ! [ -e "$DEPLIB/libsentencepiece.so" ] || CONFIG_ARGS+=(-DSENTENCEPIECE_INCLUDE_DIR="$ROOT/.deps/root/usr/include" -DSENTENCEPIECE_LIBRARY="$DEPLIB/libsentencepiece.so")
  export LD_LIBRARY_PATH="$DEPLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if ! [ -d /usr/share/games/fortunes ] && [ -d .deps/root/usr/share/games/fortunes ]; then
  export FORGE_FORTUNES_DIR="$ROOT/.deps/root/usr/share/games/fortunes"
fi
# Many tests run at once below: keep each one's OpenMP team small so they do not
# oversubscribe the cores (the CPU tests' numbers do not depend on the thread count).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
command -v ninja >/dev/null 2>&1 && CONFIG_ARGS+=(-G Ninja)
[[ -x /usr/local/cuda/bin/nvcc ]] && CONFIG_ARGS+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
mkdir -p "$LOG_DIR"

step "configure: cmake ${CONFIG_ARGS[*]}"
cmake "${CONFIG_ARGS[@]}" 2>&1 | tee "$LOG_DIR/configure.log"
rc=${PIPESTATUS[0]}
record "configure" "$rc"
[[ "$rc" -eq 0 ]] || finish

step "build (-j $JOBS)"
start=$SECONDS
# BUILD_TARGETS (e.g. "forge"): only those, for a short check on a fresh machine.
TARGET_ARGS=(); [[ -n "${BUILD_TARGETS:-}" ]] && TARGET_ARGS=(--target ${BUILD_TARGETS})
cmake --build "$BUILD_DIR" -j "$JOBS" "${TARGET_ARGS[@]}" 2>&1 | tee "$LOG_DIR/build.log"
rc=${PIPESTATUS[0]}
warnings=$(grep -c -i "warning" "$LOG_DIR/build.log" || true)
record "build" "$rc" "$((SECONDS - start)) s, $warnings warning line(s)"
[[ "$rc" -eq 0 ]] || finish

if [[ "${BUILD_ONLY:-0}" == 1 ]]; then finish; fi
step "ctest -L cuda"
(cd "$BUILD_DIR" && ctest --output-on-failure -L cuda -j "${CUDA_JOBS:-8}") 2>&1 | tee "$LOG_DIR/ctest-cuda.log"
rc=${PIPESTATUS[0]}
cuda_line=$(grep -E "tests passed|tests failed" "$LOG_DIR/ctest-cuda.log" | tail -1)
# Skipped CUDA tests mean the GPU was not visible, except the two-GPU tests on one GPU and
# CudaGemmTuning.FallbacksAreReportedOnceAndCounted, which skips where this cuBLASLt has the
# f64 bias epilogue it needs to miss (as on the H100/H200 machines' CUDA 13).
skipped=$(grep -E "\*\*\*Skipped" "$LOG_DIR/ctest-cuda.log" |
  grep -v -E "PeerCopyBetweenGpus|TwoRanksTwoGpus|OnTwoGpus|OverTwoGpus|FallbacksAreReportedOnceAndCounted" | wc -l)
if [[ "$skipped" -gt 0 ]]; then
  echo "$skipped CUDA test(s) skipped: is the GPU visible to this process (CUDA_VISIBLE_DEVICES, driver)?"
  rc=1
fi
total_cuda=$(grep -cE "Test +#[0-9]+:" "$LOG_DIR/ctest-cuda.log" || true)
if [[ "$total_cuda" -eq 0 ]]; then
  echo "no CUDA tests found: was the CUDA backend enabled?"
  rc=1
fi
record "ctest -L cuda" "$rc" "${cuda_line:-no result}; $skipped unexpected skip(s)"

if [[ "${SKIP_ALL:-0}" == 1 ]]; then finish; fi
step "ctest (all)"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS") 2>&1 | tee "$LOG_DIR/ctest-all.log"
rc=${PIPESTATUS[0]}
all_line=$(grep -E "tests passed|tests failed" "$LOG_DIR/ctest-all.log" | tail -1)
record "ctest (all)" "$rc" "${all_line:-no result}"

finish
