#!/usr/bin/env bash
# The GPU session of issue 38 (parallelism as one composition, context parallelism): one device
# call per phase on one warm machine (benchmarks/ab/run_ab.sh keeps its builds in build-ab/).
#
#   here:  BASE=<commit before the refactor> benchmarks/ab/run_ab.sh prepare    # .ab/base, .deps
#   PHASE=build  (carry .ab and .deps) both trees' forge and the head's tests; the CUDA tests of
#                the device runtime (events, StepGraph), the attention blocks on every back-end and
#                the CUDA graphs; a GPT-2 run with FORGE_TRAIN_PHASES=1, and one with
#                telemetry.profile_steps (the step trace's GPU track and CUPTI kernels)
#   PHASE=ab     GPT-2 124M and LLaMA 0.85B tokens/s, base against head, ROUNDS alternating rounds
#   PHASE=long   benchmarks/long/run_long.sh on the head's forge (LLaMA 0.85B at 16k and 32k tokens
#                with activation checkpointing beside torch.compile)
# Results in $OUT (the device tool brings them back) and RESULTS (default /tmp/forge_composition).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
R=${RESULTS:-/tmp/forge_composition}
OUT=${OUT:-$R/out}
mkdir -p "$R" "$OUT"
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] &&
  export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
H=build-ab/head
for phase in ${PHASE:?PHASE=build, ab or long}; do
case $phase in
  build)
    HEAD_TARGETS=${HEAD_TARGETS:-"forge forge_cuda_tests"} JOBS=${JOBS:-8} benchmarks/ab/run_ab.sh build 2>&1 | tail -4
    ls -la build-ab/*/forge
    timeout 300 "$H/tests/forge_cuda_tests" \
      --gtest_filter="${CUDA_FILTER:-CudaDeviceRuntime*:CudaAttentionBlocks*:CudaGraph*}" > "$OUT/cuda_tests.log" 2>&1
    echo "cuda tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/cuda_tests.log"
    G=(configs/gpt2-124m.toml --run.dir="$R/runs" --run.overwrite=true --train.steps=12 --train.log_every=4
       --checkpoint.at_end=false --eval.every=0)
    FORGE_TRAIN_PHASES=1 timeout 120 "$H/forge" train "${G[@]}" --run.name=phases > "$OUT/phases.log" 2>&1
    echo "phases run rc=$?"; grep -E "phases|cuda graph" "$OUT/phases.log" | head -8
    timeout 120 "$H/forge" train "${G[@]}" --run.name=trace --telemetry.profile_steps=6:7 > "$OUT/trace.log" 2>&1
    echo "trace run rc=$?"; grep -E "^trace:|cuda graph|gemm:" "$OUT/trace.log"
    python3 - "$R/runs/trace" <<'PY'
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/**/*.json", recursive=True):
    if "trace" not in f: continue
    t = json.load(open(f))
    ev = t.get("traceEvents", [])
    tracks = {e.get("tid") for e in ev if e.get("ph") == "X"}
    print(f, "events", len(ev), "tracks", sorted(tracks), "kernels", t.get("otherData", {}).get("kernels"))
PY
    ;;
  ab)
    # (straight into $OUT: a call cut off by its time limit still brings back the rows so far)
    ROUNDS=${ROUNDS:-3} ROWS=${ROWS:-"gpt2_1gpu llama_1gpu"} AB_OUT="$OUT/ab" OUT= benchmarks/ab/run_ab.sh runs 2>&1 | tail -14 ;;
  long)
    FORGE="$H/forge" RESULTS="$R/long" OUT="$OUT" benchmarks/long/run_long.sh ;;
  *) echo "gpu-composition-check.sh: PHASE=$phase: use build, ab or long" >&2; exit 2 ;;
esac
done
