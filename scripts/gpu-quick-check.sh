#!/usr/bin/env bash
# A short GPU check for a session with little device time left (about 6 minutes on 2 GPUs): build,
# the CUDA tests of the kernels changed, tensor parallelism with and without sequence parallelism
# (equivalence with one GPU, phase timers), the LLaMA 0.85B step (forge alone), and the telemetry of a GPT-2 run (GPM in the
# progress line, a step trace, an out-of-memory snapshot). Every result goes to $OUT as it comes, so
# a run cut short still returns what it finished.
#
#   scripts/gpu-quick-check.sh            # (the device tool: carry .deps)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R="${OUT:-/tmp/forge_quick}"
mkdir -p "$R"
LOG="$R/quick.log"
t() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
t "start; $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
BUILD_ONLY=1 JOBS="${JOBS:-32}" scripts/gpu-check.sh > "$R/build.log" 2>&1
rc=$?; t "build rc=$rc"
[[ $rc == 0 ]] || { tail -30 "$R/build.log" >> "$LOG"; exit 1; }
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FORGE=$ROOT/build-gpu/forge
NGPU=$(nvidia-smi -L | wc -l)
# The CUDA tests of the kernels changed (rope, norms, KV cache), on the last GPU, in the background.
(cd build-gpu && CUDA_VISIBLE_DEVICES=$((NGPU - 1)) timeout 150 ctest -R "CudaRope|CudaNorm|CudaKvCache|OpTable" -j8 \
   > "$R/ctest.log" 2>&1; t "ctest rc=$?"; grep -E "tests passed|\(Failed\)" "$R/ctest.log" | tee -a "$LOG") &
CT=$!
# LLaMA 0.85B, batch 4 x 2048, one GPU (row 3 of the step benchmark, forge alone).
CUDA_VISIBLE_DEVICES=0 timeout 120 "$FORGE" train configs/llama-0.85b.toml --run.dir=/tmp/q --run.name=llama \
  --train.batch_size=4 --train.steps=40 --train.log_every=10 --eval.every=0 --checkpoint.at_end=false \
  > "$R/llama.log" 2>&1
t "llama rc=$?"; grep -E "^step|cuda graph" "$R/llama.log" | tail -4 | tee -a "$LOG"
wait "$CT"
if [[ $NGPU -ge 2 ]]; then
  # Tensor parallelism against one GPU (losses and parameters), with and without sequence parallelism.
  FORGE_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) RAW_DIR="$R/tp" PHASES=check \
    CHECK_MODELS="${CHECK_MODELS:-gpt llama_kv2}" CHECK_OPTIMS="${CHECK_OPTIMS:-adamw}" timeout 240 benchmarks/tp/run_tp.sh \
    > "$R/tp_check.log" 2>&1
  t "tp check rc=$?"; grep -h '"result"' "$R/tp/equivalence.jsonl" 2>/dev/null | cut -c1-220 | tee -a "$LOG"
  for v in tp2 tp2_sp; do
    V=(--dist.tp=2); [[ $v == tp2_sp ]] && V+=(--dist.sequence_parallel=true)
    FORGE_TRAIN_PHASES=1 OMP_NUM_THREADS=8 timeout 100 "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train \
      configs/llama-0.85b.toml --run.dir=/tmp/q --run.overwrite=true --train.batch_size=8 --schedule.warmup_steps=2 \
      --eval.every=0 --checkpoint.at_end=false "${V[@]}" --run.name=$v --train.steps=10 --train.log_every=5 \
      > "$R/phases_$v.log" 2>&1
    t "phases $v rc=$?"; grep -E "rank 0\] (phases|step)" "$R/phases_$v.log" | cut -c1-330 | tee -a "$LOG"
  done
fi
# GPT-2: the progress line's GPU activity (GPM), a step trace of two steps, then an oversized batch.
CUDA_VISIBLE_DEVICES=0 timeout 60 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/q --run.name=gpt --train.steps=40 \
  --train.log_every=10 --eval.every=0 --checkpoint.at_end=false --telemetry.profile_steps=20:21 > "$R/gpt.log" 2>&1
t "gpt2 rc=$?"; grep -E "^step|cuda graph|trace" "$R/gpt.log" | tail -6 | tee -a "$LOG"
cp /tmp/q/gpt/trace.rank0.json "$R/" 2>/dev/null
python3 -c "import json,collections; j=json.load(open('$R/trace.rank0.json')); print('trace events', collections.Counter((e.get('tid'), 'kernel' if e.get('tid') == 3 else e['name'].split(':')[0]) for e in j['traceEvents'] if e['ph']=='X'), j['otherData'].get('kernels'))" 2>&1 | tee -a "$LOG"
grep -h '"gpu_sm_active_pct"' /tmp/q/gpt/metrics.jsonl | tail -1 | cut -c1-700 | tee -a "$LOG"
CUDA_VISIBLE_DEVICES=0 timeout 60 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/q --run.name=oom --train.batch_size=512 \
  --train.steps=2 --eval.every=0 --checkpoint.at_end=false > "$R/oom.log" 2>&1
t "oom rc=$? (non-zero expected)"; grep -E "out of memory|oom_snapshot" "$R/oom.log" | cut -c1-500 | tee -a "$LOG"
cp /tmp/q/oom/oom_snapshot.rank0.json "$R/" 2>/dev/null
t ALL_DONE
