#!/usr/bin/env bash
# The GPU checks of issue 35 (long runs) on one GPU, in phases that each fit one device call (10
# minutes), meant to follow each other on one warm machine (each builds first if it finds no build):
#   PHASE=1  build; the CUDA tests of what changed (attention's NaN on every back-end, the graphed
#            step, optimizers, checkpoints); SIGTERM, SIGUSR1 and kill -9 of a GPU run continued
#            bit for bit with run.deterministic (scripts/simulate-preemption.sh --device cuda); the
#            checkpoint stall of LLaMA 0.85B, forge synchronous and asynchronous
#   PHASE=2  the same for the 3.6B LLaMA
#   PHASE=3  PyTorch DCP (save, async_save) on both models' state, and the results file
#   PHASE=tests  the whole CUDA suite
# Everything goes to /tmp/forge_long (kept across the calls of a warm machine); each phase ends by
# packing it into $OUT/long_runs.tgz with the phase's log beside it (a device call returns 8 files).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R=/tmp/forge_long
mkdir -p "$R"
PHASE=${PHASE:-1}
LOG="$R/phase$PHASE.log"
t() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
pack() {
  if [[ -n ${OUT:-} ]]; then tar czf "$OUT/long_runs.tgz" -C /tmp forge_long 2>/dev/null; cp "$LOG" "$OUT/"; fi
}
trap pack EXIT
# A carried .deps replaces the one unpacked by an earlier call: unpack it again (the build links them).
if compgen -G ".deps/*.deb" >/dev/null && [[ ! -d .deps/root ]]; then
  mkdir -p .deps/root; for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
fi
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FORGE=$ROOT/build-gpu/forge
t "phase $PHASE at $(git rev-parse --short HEAD 2>/dev/null); $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | sed -n 1p); $(df -h /tmp | tail -1 | awk '{print $4}') free on /tmp; $(free -g | awk '/Mem/ {print $2}') GB RAM; $(nproc) cores"
if [[ ! -x $FORGE && $PHASE != 3 ]]; then  # (phase 3 runs PyTorch alone, the report reads files)
  BUILD_ONLY=1 JOBS="${JOBS:-16}" scripts/gpu-check.sh > "$R/build$PHASE.log" 2>&1
  rc=$?; t "build rc=$rc"; [[ $rc == 0 ]] || { tail -40 "$R/build$PHASE.log" | tee -a "$LOG"; exit 1; }
  # The .deps libraries' path, now that gpu-check.sh has unpacked them.
  [[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
case $PHASE in
  1)
    (cd build-gpu && timeout 180 ctest --output-on-failure -R "CudaAttention|Graphed|CudaOptim|CudaAdamW|Checkpoint|LongRuns" -j 6 \
       > "$R/ctest1.log" 2>&1)
    t "ctest: $(grep -E "tests passed|tests failed" "$R/ctest1.log")"
    grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)" "$R/ctest1.log" | head -20 | tee -a "$LOG"
    # SIGTERM, SIGUSR1 and kill -9 of a GPU run, continued by the same command, bit for bit.
    timeout 200 scripts/simulate-preemption.sh --forge "$FORGE" --device cuda --steps 400 --preemptions 3 --seed 11 \
      --args "--model.block_size=256 --train.seq_len=256 --model.n_layer=6 --model.n_embd=384 --model.n_head=6 --model.vocab_size=4096 --train.batch_size=16 --checkpoint.every=40" \
      > "$R/simulate_gpu.log" 2>&1
    t "simulate-preemption (cuda) rc=$?"; grep simulate "$R/simulate_gpu.log" | tee -a "$LOG"
    MODELS=0.85b REPEATS=3 DCP=0 OUT=$R timeout 240 benchmarks/checkpoint/run.sh > "$R/ckpt_085.log" 2>&1
    t "checkpoint 0.85b rc=$?"; tail -6 "$R/checkpoint/run.log" | tee -a "$LOG"
    ;;
  2)
    MODELS=3.6b REPEATS=3 EVERY_36=${EVERY_36:-60} DCP=0 FORGE_MODES=async OUT=$R timeout 300 benchmarks/checkpoint/run.sh \
      > "$R/ckpt_36a.log" 2>&1
    t "checkpoint 3.6b async rc=$?"; tail -4 "$R/checkpoint/run.log" | tee -a "$LOG"
    MODELS=3.6b REPEATS=2 EVERY_36=${EVERY_36:-60} DCP=0 FORGE_MODES=sync OUT=$R timeout 260 benchmarks/checkpoint/run.sh \
      > "$R/ckpt_36s.log" 2>&1
    t "checkpoint 3.6b sync rc=$?"; tail -4 "$R/checkpoint/run.log" | tee -a "$LOG"
    ;;
  3)
    mkdir -p "$R/checkpoint" /tmp/forge_ckpt_runs
    timeout 150 python3 benchmarks/checkpoint/dcp_peer.py --dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000 \
      --dir /tmp/forge_ckpt_runs/dcp --repeats 3 --json "$R/checkpoint/0.85b_dcp.json" > "$R/checkpoint/0.85b_dcp.log" 2>&1
    t "dcp 0.85b rc=$?"; tail -7 "$R/checkpoint/0.85b_dcp.log" | tee -a "$LOG"
    rm -rf /tmp/forge_ckpt_runs/dcp
    timeout 400 python3 benchmarks/checkpoint/dcp_peer.py --dim 3072 --layers 28 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256 \
      --dir /tmp/forge_ckpt_runs/dcp --repeats 3 --sync-repeats 2 --json "$R/checkpoint/3.6b_dcp.json" \
      > "$R/checkpoint/3.6b_dcp.log" 2>&1
    t "dcp 3.6b rc=$?"; tail -6 "$R/checkpoint/3.6b_dcp.log" | tee -a "$LOG"
    rm -rf /tmp/forge_ckpt_runs/dcp
    python3 benchmarks/checkpoint/report.py "$R/checkpoint" --commit "$(git rev-parse --short HEAD 2>/dev/null)" \
      --command "PHASE=1 then 2 then 3 scripts/gpu-long-runs.sh" > "$R/checkpoint_report.md" 2>&1
    t "report rc=$?"; cat "$R/checkpoint_report.md" | tee -a "$LOG"
    ;;
  tests)
    (cd build-gpu && timeout 560 ctest --output-on-failure -L cuda -j "${CUDA_JOBS:-8}" > "$R/ctest_cuda.log" 2>&1)
    t "ctest -L cuda: $(grep -E "tests passed|tests failed" "$R/ctest_cuda.log")"
    grep -E "\(Failed\)|\(SEGFAULT\)|\(Timeout\)" "$R/ctest_cuda.log" | head -20 | tee -a "$LOG"
    ;;
esac
t DONE
