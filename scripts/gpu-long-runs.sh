#!/usr/bin/env bash
# The GPU checks of issue 35 (long runs), in phases that each fit one device call (10 minutes) on
# one GPU (docs/train.md, "Long runs"):
#   PHASE=1  build; the CUDA tests of what changed (attention's NaN on every back-end, the graphed
#            step, optimizers, checkpoints); SIGTERM and kill -9 of a GPU run, which continues bit
#            for bit with run.deterministic (scripts/simulate-preemption.sh --device cuda); the
#            checkpoint stall of LLaMA 0.85B, forge sync/async and DCP (benchmarks/checkpoint)
#   PHASE=2  the checkpoint stall of the 3.6B LLaMA, forge sync and async
#   PHASE=3  DCP on the 3.6B LLaMA's state; the results file (benchmarks/checkpoint/report.py)
#   PHASE=tests  the whole CUDA suite
# Results go to $OUT as they come (a call cut short returns what it finished).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="${OUT:-/tmp/forge_long}"
mkdir -p "$R"
LOG="$R/long_runs.log"
t() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FORGE=$ROOT/build-gpu/forge
PHASE=${PHASE:-1}
t "phase $PHASE; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed -n 1p); $(df -h /tmp | tail -1 | awk '{print $4}') free; $(free -g | awk '/Mem/ {print $2}') GB RAM"
case $PHASE in
  1)
    if [[ ! -x $FORGE || ${BUILD:-1} == 1 ]]; then
      BUILD_ONLY=1 JOBS="${JOBS:-16}" scripts/gpu-check.sh > "$R/build.log" 2>&1
      rc=$?; t "build rc=$rc"; [[ $rc == 0 ]] || { tail -40 "$R/build.log" | tee -a "$LOG"; exit 1; }
    fi
    (cd build-gpu && timeout 200 ctest -R "CudaAttention|Graphed|CudaOptim|CudaAdamW|Checkpoint|LongRuns|CudaOpTable" -j 6 \
       > "$R/ctest.log" 2>&1; echo "rc=$?" >> "$R/ctest.log")
    t "ctest: $(grep -E "tests passed|tests failed" "$R/ctest.log")"; grep -E "\(Failed\)|\(SEGFAULT\)|Timeout" "$R/ctest.log" | head -20 | tee -a "$LOG"
    # SIGTERM, SIGUSR1 and kill -9 of a GPU run (GPT-2 small enough to take a few seconds), bit for bit.
    timeout 240 scripts/simulate-preemption.sh --forge "$FORGE" --device cuda --steps 300 --preemptions 3 --seed 11 \
      --args "--model.block_size=256 --train.seq_len=256 --model.n_layer=6 --model.n_embd=384 --model.n_head=6 --model.vocab_size=4096 --train.batch_size=16 --checkpoint.every=40" \
      > "$R/simulate_gpu.log" 2>&1
    t "simulate-preemption (cuda) rc=$?"; grep simulate "$R/simulate_gpu.log" | tee -a "$LOG"
    MODELS=0.85b REPEATS=3 OUT="$R" timeout 300 benchmarks/checkpoint/run.sh > "$R/ckpt_085.log" 2>&1
    t "checkpoint 0.85b rc=$?"; tail -12 "$R/checkpoint/run.log" | tee -a "$LOG"
    ;;
  2)
    MODELS=3.6b REPEATS=${REPEATS:-3} EVERY_36=${EVERY_36:-60} DCP=0 OUT="$R" timeout 560 benchmarks/checkpoint/run.sh \
      > "$R/ckpt_36.log" 2>&1
    t "checkpoint 3.6b forge rc=$?"; tail -8 "$R/checkpoint/run.log" | tee -a "$LOG"
    ;;
  3)
    mkdir -p "$R/checkpoint"
    python3 benchmarks/checkpoint/dcp_peer.py --dim 3072 --layers 28 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 \
      --dir /tmp/forge_ckpt_runs/dcp --repeats "${REPEATS:-3}" --json "$R/checkpoint/3.6b_dcp.json" \
      > "$R/checkpoint/3.6b_dcp.log" 2>&1
    t "dcp 3.6b rc=$?"; tail -8 "$R/checkpoint/3.6b_dcp.log" | tee -a "$LOG"
    rm -rf /tmp/forge_ckpt_runs/dcp
    ;;
  tests)
    (cd build-gpu && timeout 560 ctest -L cuda -j "${CUDA_JOBS:-8}" > "$R/ctest_cuda.log" 2>&1)
    t "ctest -L cuda: $(grep -E "tests passed|tests failed" "$R/ctest_cuda.log")"
    grep -E "\(Failed\)|\(SEGFAULT\)|Timeout" "$R/ctest_cuda.log" | head -20 | tee -a "$LOG"
    ;;
esac
t DONE
