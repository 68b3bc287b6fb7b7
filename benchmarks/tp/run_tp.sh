#!/usr/bin/env bash
# Tensor parallelism on a machine with (at least) two GPUs (issue 16): equivalence of `forge train`
# at tp = 2 (NCCL) with the one-GPU run, and LLaMA throughput at tp = 2 beside tp = 1 (DDP on the
# same two GPUs) and beside PyTorch's own tensor parallelism (torch.distributed.tensor.parallel,
# blocks compiled), with `forge plan`'s prediction for each forge run. Results:
# benchmarks/results/raw/tp_<gpu>/ (logs, metrics, JSON lines), summarised by report_tp.py into
# benchmarks/results/tp_<gpu>.md.
#
#   BUILD_ONLY=1 scripts/gpu-check.sh && benchmarks/tp/run_tp.sh            # both phases
#   PHASES=check benchmarks/tp/run_tp.sh                                    # equivalence only
#
# Phases:
#   check  tiny GPT and LLaMA (GQA 4/2, and 4/1: replicated kv heads), f32 without TF32, SGD and
#          AdamW, 20 steps: tp = CHECK_TP (2) with and without sequence parallelism on as many GPUs against one GPU
#          (benchmarks/dist/compare_runs.py: every loss and every final parameter)
#   perf   MODELS (default "0.85b wide"): configs/llama-0.85b.toml (16 x 2048, 32/8 heads), and
#          "wide" = LLaMA-2-7B's width (4096, 32/8 heads, FFN 11008) with WIDE_LAYERS (4) layers;
#          bf16, AdamW, global batch BATCH (8) x 2048 tokens, STEPS steps (30): forge DDP (tp 1),
#          forge tp 2 and tp 2 + sp, each with the weight gradients behind the collective and
#          without (FORGE_TP_OVERLAP=0; FORGE_VARIANTS picks), PyTorch tp 2 and tp 2 + sp (compiled
#          blocks; eager with PEER_MODE=eager; WIDE_VARIANTS: the wide model's forge variants if
#          not FORGE_VARIANTS); peak memory per GPU, tokens/s, MFU (one formula:
#          shapes.py); then report_tp.py writes benchmarks/results/tp_<gpu>.md
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run_tp.sh
export NCCL_NVLS_ENABLE=0
PHASES="${PHASES:-check perf}"
RAW="${RAW_DIR:-benchmarks/results/raw/tp_$GPU}"
RUNS="${RUNS_DIR:-/tmp/forge_tp_runs}"
mkdir -p "$RAW" "$RUNS"
NGPU=$(nvidia-smi -L | wc -l)
[[ "$NGPU" -ge 2 ]] || { echo "run_tp.sh: needs 2 GPUs, found $NGPU"; exit 2; }
{ [[ -n "${FORGE_COMMIT:-}" ]] && echo "$FORGE_COMMIT" || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; } > "$RAW/commit.txt"
echo "run_tp: $GPU x $NGPU, phases: $PHASES, commit $(cat "$RAW/commit.txt")"

train1() { "$FORGE" train "$@"; }
train2() { "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "$@"; }
TC="${CHECK_TP:-2}"
trainc() { "$FORGE" launch --nproc-per-node "$TC" -- "$FORGE" train "$@"; }

if [[ " $PHASES " == *" check "* ]]; then
  [[ "$TC" -le "$NGPU" ]] || { echo "run_tp.sh: CHECK_TP=$TC needs $TC GPUs, found $NGPU"; exit 2; }
  echo "== equivalence: tp = $TC on $TC GPUs vs 1 GPU, f32"
  COMMON=(--run.dir="$RUNS" --run.device=cuda --run.dtype=f32 --run.allow_tf32=false --run.overwrite=true
          --model.vocab_size=256 --model.block_size=16 --model.n_layer=2 --model.n_head=4 --data.source=random
          --train.steps=20 --train.batch_size=8 --train.seq_len=16 --train.log_every=1 --optim.lr=3e-3
          --optim.momentum=0.9 --optim.grad_clip=0.5 --schedule.warmup_steps=3 --schedule.decay_steps=20
          --eval.every=0 --dist.bucket_mb=0.004)
  [[ "${APPEND:-0}" == 1 ]] || : > "$RAW/equivalence.jsonl"
  for model in ${CHECK_MODELS:-gpt llama_kv2 llama_kv1}; do
    case $model in
      gpt) M=(--model.type=gpt --model.n_embd=32 --model.bias=false) ;;
      llama_kv2) M=(--model.type=llama --model.dim=32 --model.n_kv_head=2) ;;
      llama_kv1) M=(--model.type=llama --model.dim=32 --model.n_kv_head=1) ;;
    esac
    for o in ${CHECK_OPTIMS:-sgd adamw}; do
      train1 configs/tiny.toml "${COMMON[@]}" "${M[@]}" --optim.name=$o --run.name=ref_${model}_$o > "$RAW/eq_ref_${model}_$o.log" 2>&1
      for sp in false true; do
        name="eq_${model}_${o}_tp${TC}_sp$sp"
        if trainc configs/tiny.toml "${COMMON[@]}" "${M[@]}" --optim.name=$o --run.name=$name --dist.tp="$TC" \
             --dist.sequence_parallel=$sp > "$RAW/$name.log" 2>&1; then
          r=$("$PY" benchmarks/dist/compare_runs.py "$RUNS/$name" "$RUNS/ref_${model}_$o")
        else
          r='{"error": "run failed"}'
        fi
        echo "{\"model\": \"$model\", \"optim\": \"$o\", \"tp\": $TC, \"sequence_parallel\": $sp, \"result\": $r}" | tee -a "$RAW/equivalence.jsonl"
      done
    done
  done
fi

if [[ " $PHASES " == *" perf "* ]]; then
  BATCH="${BATCH:-8}"
  STEPS="${STEPS:-30}"
  : > "$RAW/perf.jsonl"
  PLAN_GPU=h100; [[ "$GPU" == *H200* ]] && PLAN_GPU=h200
  summary() {  # RUN_DIR -> the last two progress intervals (after warm-up) and the peak memory
    "$PY" - "$1" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")]
last = prog[-2:]
print(json.dumps({"tokens_per_s": sum(r["tokens_per_s"] for r in last) / len(last),
                  "ms_per_step": sum(r["ms_per_step"] for r in last) / len(last),
                  "mem_bytes": max(r["mem_bytes"] for r in prog), "mfu": last[-1].get("mfu"),
                  "loss": last[-1]["loss"]}))
PYEOF
  }
  for model in ${MODELS:-0.85b wide}; do
    PLAN_MFU=""
    case $model in
      0.85b) M=() ; PM=() ;;
      wide) M=(--model.dim=4096 --model.n_layer=${WIDE_LAYERS:-4} --model.ffn_hidden=11008)
            PM=(--dim 4096 --n_layer ${WIDE_LAYERS:-4} --ffn_hidden 11008) ;;
    esac
    RUN=(configs/llama-0.85b.toml --run.dir="$RUNS" --run.overwrite=true --train.batch_size=$BATCH
         --train.steps=$STEPS --train.log_every=$((STEPS / 3)) --schedule.warmup_steps=2 --eval.every=0
         --checkpoint.at_end=false "${M[@]}")
    VARIANTS="${FORGE_VARIANTS:-ddp tp2 tp2_nooverlap tp2_sp tp2_sp_nooverlap}"
    [[ $model == wide && -n "${WIDE_VARIANTS:-}" ]] && VARIANTS="$WIDE_VARIANTS"
    for variant in $VARIANTS; do
      name="perf_${model}_$variant"
      OVERLAP=1
      case $variant in
        ddp) V=() ; PLAN=(--tp 1 --dp 2) ;;
        tp2) V=(--dist.tp=2) ; PLAN=(--tp 2 --no-sp) ;;
        tp2_nooverlap) V=(--dist.tp=2) ; PLAN=(--tp 2 --no-sp) ; OVERLAP=0 ;;
        tp2_sp) V=(--dist.tp=2 --dist.sequence_parallel=true) ; PLAN=(--tp 2 --sp) ;;
        tp2_sp_nooverlap) V=(--dist.tp=2 --dist.sequence_parallel=true) ; PLAN=(--tp 2 --sp) ; OVERLAP=0 ;;
      esac
      # (FORGE_TP_OVERLAP: Note [weight gradients behind the collective]; off, the sequence-parallel
      # linears also keep their gathered input, as before it.)
      if FORGE_TP_OVERLAP=$OVERLAP OMP_NUM_THREADS=8 timeout ${RUN_TIMEOUT:-300} "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "${RUN[@]}" "${V[@]}" --run.name=$name > "$RAW/$name.log" 2>&1; then
        r=$(summary "$RUNS/$name")
        cp "$RUNS/$name/metrics.jsonl" "$RAW/$name.metrics.jsonl"
        # plan's compute rate comes from the tp 1 run of the same model (its measured MFU), so
        # the plan column tests what tp adds: its collectives and memory, not the GEMMs' speed.
        [[ $variant == ddp ]] && PLAN_MFU=$("$PY" -c "import json,sys; print(json.loads(sys.argv[1])['mfu'])" "$r")
      else
        r='{"error": "run failed"}'
      fi
      # forge plan of the same run: the model of the config with the same overrides, 2 H100s.
      plan_args=(--batch $BATCH --gpus 2 --gpu $PLAN_GPU --json "${PLAN[@]}")
      [[ -n "${PLAN_MFU:-}" ]] && plan_args+=(--mfu "$PLAN_MFU")
      if [[ $model == wide ]]; then
        plan_args+=(--arch llama --layers ${WIDE_LAYERS:-4} --width 4096 --heads 32 --kv-heads 8 --ffn 11008 --vocab 32000 --seq 2048)
      else
        plan_args+=(--config configs/llama-0.85b.toml)
      fi
      [[ $variant == ddp ]] && plan_args+=(--micro-batch $((BATCH / 2))) || plan_args+=(--micro-batch $BATCH)
      p=$("$FORGE" plan "${plan_args[@]}" 2>/dev/null | "$PY" -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'mem_total': j['memory']['total'], 'mem_subtotal': j['memory']['subtotal'], 'step_s': j['time']['step'], 'tokens_per_s': j['time']['tokens_per_s'], 'mfu': j['time']['mfu'], 'mfu_in': float(sys.argv[1])}))" "${PLAN_MFU:-0.4}" || echo '{"error": "plan failed"}')
      echo "{\"model\": \"$model\", \"who\": \"forge\", \"variant\": \"$variant\", \"result\": $r, \"plan\": $p}" | tee -a "$RAW/perf.jsonl"
    done
    for variant in tp2 tp2_sp; do
      [[ $variant == tp2_sp && "${SKIP_PEER_SP:-0}" == 1 ]] && continue
      name="peer_${model}_$variant"
      SPF=(); [[ $variant == tp2_sp ]] && SPF=(--sp)
      if timeout ${PEER_TIMEOUT:-400} "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/step/torch_peer.py \
           --config configs/llama-0.85b.toml --mode "${PEER_MODE:-compile}" --batch $BATCH --tp 2 "${SPF[@]}" \
           --steps ${PEER_STEPS:-20} --warmup ${PEER_WARMUP:-10} "${PM[@]}" --json "$RAW/$name.json" > "$RAW/$name.log" 2>&1; then
        r=$("$PY" -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$RAW/$name.json")
      else
        r='{"error": "run failed"}'
      fi
      echo "{\"model\": \"$model\", \"who\": \"pytorch\", \"variant\": \"$variant\", \"result\": $r}" | tee -a "$RAW/perf.jsonl"
    done
  done
fi
if [[ " $PHASES " == *" perf "* ]]; then
  "$PY" benchmarks/tp/report_tp.py "$RAW" > "${REPORT:-benchmarks/results/tp_$GPU.md}" && echo "run_tp: wrote ${REPORT:-benchmarks/results/tp_$GPU.md}"
fi
echo "run_tp: done; raw results in $RAW"
