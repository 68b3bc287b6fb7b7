#!/usr/bin/env bash
# Data parallel and ZeRO on a machine with (at least) two GPUs: NCCL checks, equivalence with
# the single-GPU run, GPT-2 124M scaling, the ZeRO memory table, collectives, and NCCL's
# network transport. Results: benchmarks/results/raw/dist/ (logs, metrics, JSON), from which
# benchmarks/results/dist_<gpu>.md is written (each table names the phase and variables it came from).
#
#   PHASES="check scale memory" benchmarks/dist/run_dist.sh     # after scripts/gpu-check.sh BUILD_ONLY=1
#
# Phases (each writes its own files; run them in one call or several):
#   check    NCCL tests (2 GPUs); every layout (DDP, ZeRO-1/2/3, offload; SGD and AdamW) on 2 GPUs
#            against one GPU (EQ_LAYOUTS: "stage:offload" words); forge bench collectives on 2
#            GPUs, also with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (the network transport, standing
#            in for two hosts) unless SKIP_COLLECTIVES=1
#   scale    GPT-2 124M: 1 GPU (batch 16) vs DDP on 2 GPUs (16 per GPU) in SCALE_ROUNDS
#            alternating rounds of SCALE_VARIANTS (the diagnostics that split the loss: see the
#            phase), medians in raw/dist/scale_summary.txt; DDP on the network transport
#            (unless SKIP_NET=1)
#   memory   a 1.3B GPT on 2 GPUs: peak memory per GPU for MEMORY_LAYOUTS ("stage:offload" words; default DDP, ZeRO-1,
#            ZeRO-2, ZeRO-2 + offload, ZeRO-3, ZeRO-3 + offload)
#   faults   a stuck peer on NCCL ends the job (FORGE_DIST_TIMEOUT); a run under torchrun
#   largest  the largest LLaMA that trains on the 2 GPUs (LARGEST_LAYERS/LARGEST_DIM/LARGEST_STAGE/
#            LARGEST_OFFLOAD)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run_dist.sh
PHASES="${PHASES:-check scale memory}"
RAW="benchmarks/results/raw/dist"
RUNS="${RUNS_DIR:-/tmp/forge_dist_runs}"
mkdir -p "$RAW" "$RUNS"
NGPU=$(nvidia-smi -L | wc -l)
[[ "$NGPU" -ge 2 ]] || { echo "run_dist.sh: needs 2 GPUs, found $NGPU"; exit 2; }
echo "run_dist: $GPU x $NGPU, phases: $PHASES"
nvidia-smi topo -m > "$RAW/topology.txt" 2>&1 || true

train1() { "$FORGE" train "$@"; }
train2() { "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "$@"; }
summary() {  # RUN_DIR -> the figures of the last SUMMARY_INTERVALS (default 2) progress records
  "$PY" - "$1" "${SUMMARY_INTERVALS:-2}" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")]
k = int(sys.argv[2])
last = prog[-k:] if len(prog) >= k else prog   # the last k intervals (after warm-up)
out = {"tokens_per_s": sum(r["tokens_per_s"] for r in last) / len(last),
       "ms_per_step": sum(r["ms_per_step"] for r in last) / len(last),
       "mem_bytes": max(r["mem_bytes"] for r in prog), "mfu": last[-1].get("mfu"), "loss": last[-1]["loss"]}
print(json.dumps(out))
PYEOF
}

if [[ " $PHASES " == *" check "* ]]; then
  echo "== NCCL tests"
  (cd "$BUILD_DIR" && ctest --output-on-failure -R "NcclGroup|LaunchGpu|Numa\." ) > "$RAW/nccl_tests.log" 2>&1 || echo "NCCL tests FAILED (see $RAW/nccl_tests.log)"
  grep -E "tests passed|tests failed" "$RAW/nccl_tests.log" || true
  echo "== equivalence: 2 GPUs vs 1 GPU, f32"
  TINY=(configs/gpt2-124m.toml --run.dir="$RUNS" --run.device=cuda --run.dtype=f32 --run.overwrite=true --model.type=gpt
        --model.vocab_size=256 --model.block_size=16 --model.n_layer=2 --model.n_head=2 --model.n_embd=32
        --model.bias=false --data.source=random --train.steps=20 --train.batch_size=8 --train.seq_len=16
        --train.log_every=1 --optim.lr=3e-4 --optim.momentum=0.9 --optim.grad_clip=0.5 --schedule.warmup_steps=3
        --schedule.decay_steps=20 --eval.every=0 --dist.bucket_mb=0.004)
  : > "$RAW/equivalence.jsonl"
  for o in sgd adamw; do
    train1 "${TINY[@]}" --optim.name=$o --run.name=ref_$o > "$RAW/eq_ref_$o.log" 2>&1
    for layout in ${EQ_LAYOUTS:-0:false 1:false 2:false 3:false 1:true 2:true 3:true}; do
      set -- ${layout/:/ }
      name="eq_${o}_z$1_off$2"
      if train2 "${TINY[@]}" --optim.name=$o --run.name=$name --dist.zero_stage=$1 --dist.offload_optimizer=$2 > "$RAW/$name.log" 2>&1; then
        r=$("$PY" benchmarks/dist/compare_runs.py "$RUNS/$name" "$RUNS/ref_$o")
      else
        r='{"error": "run failed"}'
      fi
      echo "{\"optim\": \"$o\", \"zero_stage\": $1, \"offload\": $2, \"ranks\": 2, \"result\": $r}" | tee -a "$RAW/equivalence.jsonl"
    done
  done
  if [[ "${SKIP_COLLECTIVES:-0}" != 1 ]]; then
  echo "== collectives on 2 GPUs"
  "$FORGE" launch --no-prefix --nproc-per-node 2 -- "$FORGE" bench collectives --sizes 8..1G --json > "$RAW/collectives_nvlink.json" 2> "$RAW/collectives_nvlink.log" || echo "collectives FAILED"
  echo "== collectives on NCCL's network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)"
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "$FORGE" launch --no-prefix --nproc-per-node 2 -- "$FORGE" bench collectives \
    --ops all_reduce,all_gather,reduce_scatter --sizes 1K..1G --json > "$RAW/collectives_net.json" 2> "$RAW/collectives_net.log" || echo "collectives (net) FAILED"
  fi
fi

if [[ " $PHASES " == *" scale "* ]]; then
  # SCALE_ROUNDS rounds, each running every variant once in turn, so all of them see the same
  # thermal history; scale_summary.py takes the median of each (one run varies by ~1-3%).
  # Variants (SCALE_VARIANTS):
  #   1gpu, 2gpu          the product: 1 GPU at batch 16; DDP on 2 GPUs at 16 per GPU
  #   1gpu_sync, 2gpu_sync  FORGE_TRAIN_SYNC_EACH_STEP=1: the host reads each step at once
  #   2gpu_copy           FORGE_NO_GRAD_BUFFER_CLAIM=1: gradients copied into the bucket views
  #   2gpu_before         both diagnostics: what this repository did before either change
  #   2gpu_noreduce       --debug.skip_reductions=true: no communication in the step at all (the
  #                       gradient reductions and the loss all-reduce skipped)
  #   2gpu_hp             FORGE_NCCL_HIGH_PRIORITY=1
  #   1gpu_dev1           1 GPU on the second device (CUDA_VISIBLE_DEVICES=1)
  #   2gpu_b<MB>          DDP with dist.bucket_mb = MB
  #   1gpu_launch         1 GPU started by forge launch --nproc-per-node 1 (its binding, its environment)
  #   <variant>_phases    with FORGE_TRAIN_PHASES=1: every rank logs its step's device time by phase
  #   <variant>@V=X,W=Y   with those environment variables (e.g. 2gpu@NCCL_ALGO=Ring)
  #   1gpu_pair           two independent 1-GPU runs at once, one per device (rank 0's figure):
  #                       what sharing the host and the power budget costs without any DDP
  # 60 steps; the figures are those of steps 21-60 (four logging intervals).
  G2=(configs/gpt2-124m.toml --run.dir="$RUNS" --train.steps=60 --train.log_every=10 --checkpoint.at_end=false)
  export SUMMARY_INTERVALS=4
  scale_one() {  # VARIANT ROUND
    local v=$1 r=$2 name="gpt2_$1" world=2 envs=() args=()
    # <variant>@VAR=VAL[,VAR=VAL...]: the same with those environment variables (NCCL's, say)
    if [[ $v == *@* ]]; then
      local extra=${v#*@}
      IFS=, read -r -a envs <<< "$extra"
      v=${v%%@*}
      name="gpt2_${1//[^A-Za-z0-9_]/_}"
    fi
    # <variant>_phases: the same with FORGE_TRAIN_PHASES=1 (each rank logs where its device time goes)
    if [[ $v == *_phases ]]; then v=${v%_phases}; envs+=(FORGE_TRAIN_PHASES=1); fi
    case "$v" in
      1gpu) world=1 ;;
      2gpu) ;;
      1gpu_sync) world=1; envs+=(FORGE_TRAIN_SYNC_EACH_STEP=1) ;;
      2gpu_sync) envs+=(FORGE_TRAIN_SYNC_EACH_STEP=1) ;;
      2gpu_copy) envs+=(FORGE_NO_GRAD_BUFFER_CLAIM=1) ;;
      2gpu_before) envs+=(FORGE_TRAIN_SYNC_EACH_STEP=1 FORGE_NO_GRAD_BUFFER_CLAIM=1) ;;
      2gpu_noreduce) args=(--debug.skip_reductions=true) ;;
      2gpu_hp) envs+=(FORGE_NCCL_HIGH_PRIORITY=1) ;;
      2gpu_b[0-9]*) args=(--dist.bucket_mb=${v#2gpu_b}) ;;
      1gpu_dev1) world=1; envs+=(CUDA_VISIBLE_DEVICES=1) ;;
      1gpu_launch) world=launch1 ;;
      1gpu_pair)
        CUDA_VISIBLE_DEVICES=0 "$FORGE" train "${G2[@]}" --run.name=${name}_a --train.batch_size=16 > "$RAW/${name}_a_r$r.log" 2>&1 &
        local pa=$!
        CUDA_VISIBLE_DEVICES=1 "$FORGE" train "${G2[@]}" --run.name=${name}_b --train.batch_size=16 > "$RAW/${name}_b_r$r.log" 2>&1 &
        local pb=$!
        wait $pa && wait $pb && summary "$RUNS/${name}_a" > "$RAW/${name}_r$r.json" && summary "$RUNS/${name}_b" > "$RAW/${name}_b_r$r.json"
        return ;;
      *) echo "run_dist.sh: unknown scale variant '$v'"; return 2 ;;
    esac
    if [[ $world == 1 ]]; then
      env "${envs[@]}" "$FORGE" train "${G2[@]}" --run.name=$name --train.batch_size=16 > "$RAW/${name}_r$r.log" 2>&1
    elif [[ $world == launch1 ]]; then
      env "${envs[@]}" "$FORGE" launch --nproc-per-node 1 -- "$FORGE" train "${G2[@]}" --run.name=$name --train.batch_size=16 \
        > "$RAW/${name}_r$r.log" 2>&1
    else
      env "${envs[@]}" "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "${G2[@]}" "${args[@]}" --run.name=$name --train.batch_size=32 \
        > "$RAW/${name}_r$r.log" 2>&1
    fi && summary "$RUNS/$name" > "$RAW/${name}_r$r.json"
  }
  for r in $(seq 1 "${SCALE_ROUNDS:-1}"); do
    for v in ${SCALE_VARIANTS:-1gpu 2gpu 2gpu_noreduce}; do
      scale_one "$v" "$r" && rc=0 || rc=$?
      local_name="gpt2_${v//[^A-Za-z0-9_]/_}"
      echo "round $r $v: $( [[ $rc == 0 ]] && cat "$RAW/${local_name}_r$r.json" || echo "FAILED ($rc), see $RAW/${local_name}_r$r.log")"
      grep -h "phases (FORGE_TRAIN_PHASES" "$RAW/${local_name}_r$r.log" 2>/dev/null || true
    done
  done
  "$PY" benchmarks/dist/scale_summary.py "$RAW" | tee "$RAW/scale_summary.txt"
  if [[ "${SKIP_NET:-0}" != 1 ]]; then
  echo "== GPT-2 124M, DDP on 2 GPUs over NCCL's network transport"
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 train2 "${G2[@]}" --run.name=gpt2_2gpu_net --train.batch_size=32 > "$RAW/gpt2_2gpu_net.log" 2>&1 \
    && summary "$RUNS/gpt2_2gpu_net" | tee "$RAW/gpt2_2gpu_net.json"
  fi
  unset SUMMARY_INTERVALS
fi

if [[ " $PHASES " == *" buckets "* ]]; then
  # GPT-2 124M DDP on 2 GPUs at other bucket sizes (the default is 25 MB).
  G2=(configs/gpt2-124m.toml --run.dir="$RUNS" --train.steps=30 --train.log_every=10 --checkpoint.at_end=false)
  for mb in ${BUCKET_SIZES:-5 50 100}; do
    echo "== GPT-2 124M, DDP on 2 GPUs, dist.bucket_mb=$mb"
    train2 "${G2[@]}" --run.name=gpt2_2gpu_b$mb --train.batch_size=32 --dist.bucket_mb=$mb > "$RAW/gpt2_2gpu_b$mb.log" 2>&1 \
      && summary "$RUNS/gpt2_2gpu_b$mb" | tee "$RAW/gpt2_2gpu_b$mb.json"
  done
fi

if [[ " $PHASES " == *" memory "* ]]; then
  # 24 x 2048, 16 heads, vocabulary 50304, context 1024: 1.31 B parameters.
  B1=(configs/gpt2-124m.toml --run.dir="$RUNS" --model.n_layer=24 --model.n_embd=2048 --model.n_head=16
      --model.checkpoint_activations=true --train.batch_size=8 --train.steps=6 --train.log_every=2
      --checkpoint.at_end=false)
  for layout in ${MEMORY_LAYOUTS:-0:false 1:false 2:false 2:true 3:false 3:true}; do
    set -- ${layout/:/ }
    name="gpt1b3_z$1_off$2"
    echo "== 1.3B GPT on 2 GPUs, zero_stage=$1 offload=$2"
    train2 "${B1[@]}" --run.name=$name --dist.zero_stage=$1 --dist.offload_optimizer=$2 > "$RAW/$name.log" 2>&1 \
      && summary "$RUNS/$name" | tee "$RAW/$name.json" || echo "   FAILED (see $RAW/$name.log)"
  done
fi

if [[ " $PHASES " == *" largest "* ]]; then
  L="${LARGEST_LAYERS:-32}"; D="${LARGEST_DIM:-4096}"; STAGE="${LARGEST_STAGE:-2}"; OFF="${LARGEST_OFFLOAD:-false}"
  name="llama_${L}x${D}_z${STAGE}_off${OFF}"
  echo "== LLaMA ${L} x ${D} on 2 GPUs, ZeRO-$STAGE, offload $OFF, activation checkpointing"
  train2 configs/gpt2-124m.toml --run.dir="$RUNS" --run.name=$name --model.type=llama --model.vocab_size=32000 \
    --model.n_layer=$L --model.dim=$D --model.n_head=$((D / 128)) --model.block_size=2048 --train.seq_len=2048 \
    --model.checkpoint_activations=true --train.batch_size=4 --train.steps=${LARGEST_STEPS:-6} --train.log_every=2 \
    --dist.zero_stage=$STAGE --dist.offload_optimizer=$OFF --checkpoint.at_end=false > "$RAW/$name.log" 2>&1 \
    && summary "$RUNS/$name" | tee "$RAW/$name.json" || { echo "   FAILED"; tail -5 "$RAW/$name.log"; }
fi
if [[ " $PHASES " == *" faults "* ]]; then
  # A stuck peer on NCCL (rank 1 stops calling collectives at step 4): rank 0's wait must time
  # out (FORGE_DIST_TIMEOUT) and the launcher end the job; then the same tiny run under torchrun
  # (no MPI: the NCCL id comes from rank 0 over TCP, dist/rendezvous.h).
  FT=(configs/gpt2-124m.toml --run.dir="$RUNS" --run.overwrite=true --model.n_layer=2 --model.n_embd=64 --model.n_head=2
      --model.block_size=64 --train.seq_len=64 --train.batch_size=4 --train.steps=200 --train.log_every=1
      --checkpoint.at_end=false)
  echo "== stuck peer on NCCL: --debug.hang_at=1:4 FORGE_DIST_TIMEOUT=5"
  t0=$(date +%s)
  FORGE_DIST_TIMEOUT=5 timeout 180 "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "${FT[@]}" \
    --debug.hang_at=1:4 --run.name=hang > "$RAW/fault_hang.log" 2>&1 && rc=0 || rc=$?
  echo "   exit $rc after $(( $(date +%s) - t0 )) s (124 would be the test's own timeout: a hang)" | tee -a "$RAW/fault_hang.log"
  grep -E "did not complete|exited with|stopping" "$RAW/fault_hang.log" | head -4
  echo "== torchrun --no-python --nproc-per-node 2 (TCP bootstrap of the NCCL id)"
  FORGE_RDZV_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n') timeout 180 torchrun --no-python --nproc-per-node 2 "$FORGE" train "${FT[@]}" --train.steps=20 --run.name=torchrun \
    > "$RAW/torchrun.log" 2>&1 && rc=0 || rc=$?
  echo "   exit $rc" | tee -a "$RAW/torchrun.log"
  grep -E "data parallel|done:" "$RAW/torchrun.log" | head -3
fi
echo "run_dist: done -> $RAW"
