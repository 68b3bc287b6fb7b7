#!/usr/bin/env bash
# Pipeline parallelism on a machine with (at least) two GPUs (issue 17): equivalence of `forge
# train` at pp = 2 (NCCL send/recv) with the one-GPU run for every schedule, and the measured
# bubble against theory. Results: benchmarks/results/raw/pp_<gpu>/ (logs, metrics, JSON lines).
#
#   BUILD_ONLY=1 scripts/gpu-check.sh && benchmarks/pp/run_pp.sh
#   PHASES=check benchmarks/pp/run_pp.sh
#
# Phases:
#   check   tiny GPT and LLaMA, f32 without TF32, SGD and AdamW, grad_accum 4: pp = 2 on 2 GPUs with
#           1f1b, gpipe, zb-h1 and interleaved (2 chunks) against one GPU (benchmarks/dist/compare_runs.py)
#   bubble  LLaMA 0.85B (configs/llama-0.85b.toml), bf16, pp = 2, micro-batch MICRO (2) sequences,
#           K = grad_accum in KS ("4 8 16"), each schedule: ms/step. A step of K micro-batches takes
#           a K + b (a: one micro-batch's forward and backward on the slower stage; b: the fill and
#           drain); the fitted bubble b / (a K + b) is set beside the theory (P - 1) / (K + P - 1)
#           (1F1B, GPipe), about a third of it (ZB-H1), half of it (interleaved, 2 chunks). Peak memory
#           per stage beside each.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run_pp.sh
export NCCL_NVLS_ENABLE=0
PHASES="${PHASES:-check bubble}"
RAW="benchmarks/results/raw/pp_$GPU"
RUNS="${RUNS_DIR:-/tmp/forge_pp_runs}"
mkdir -p "$RAW" "$RUNS"
NGPU=$(nvidia-smi -L | wc -l)
[[ "$NGPU" -ge 2 ]] || { echo "run_pp.sh: needs 2 GPUs, found $NGPU"; exit 2; }
{ [[ -n "${FORGE_COMMIT:-}" ]] && echo "$FORGE_COMMIT" || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; } > "$RAW/commit.txt"
echo "run_pp: $GPU x $NGPU, phases: $PHASES, commit $(cat "$RAW/commit.txt")"

if [[ " $PHASES " == *" check "* ]]; then
  echo "== equivalence: pp = 2 on 2 GPUs vs 1 GPU, f32"
  COMMON=(--run.dir="$RUNS" --run.device=cuda --run.dtype=f32 --run.allow_tf32=false --run.overwrite=true
          --model.vocab_size=256 --model.block_size=16 --model.n_layer=4 --model.n_head=4 --data.source=random
          --train.steps=20 --train.batch_size=8 --train.grad_accum=4 --train.seq_len=16 --train.log_every=1
          --optim.lr=3e-3 --optim.momentum=0.9 --optim.grad_clip=0.5 --schedule.warmup_steps=3
          --schedule.decay_steps=20 --eval.every=0 --dist.bucket_mb=0.004)
  : > "$RAW/equivalence.jsonl"
  for model in gpt llama; do
    case $model in
      gpt) M=(--model.type=gpt --model.n_embd=32 --model.bias=false) ;;
      llama) M=(--model.type=llama --model.dim=32 --model.n_kv_head=2) ;;
    esac
    for o in sgd adamw; do
      "$FORGE" train configs/tiny.toml "${COMMON[@]}" "${M[@]}" --optim.name=$o --run.name=ref_${model}_$o > "$RAW/eq_ref_${model}_$o.log" 2>&1
      for sched in 1f1b gpipe zb-h1 interleaved; do
        name="eq_${model}_${o}_pp2_$sched"
        VS=(); [[ $sched == interleaved ]] && VS=(--dist.pp_virtual_stages=2)
        if timeout 120 "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train configs/tiny.toml "${COMMON[@]}" "${M[@]}" \
             --optim.name=$o --run.name=$name --dist.pp=2 --dist.pp_schedule=$sched "${VS[@]}" > "$RAW/$name.log" 2>&1; then
          r=$("$PY" benchmarks/dist/compare_runs.py "$RUNS/$name" "$RUNS/ref_${model}_$o")
        else
          r='{"error": "run failed"}'
        fi
        echo "{\"model\": \"$model\", \"optim\": \"$o\", \"pp\": 2, \"schedule\": \"$sched\", \"result\": $r}" | tee -a "$RAW/equivalence.jsonl"
      done
    done
  done
fi

if [[ " $PHASES " == *" bubble "* ]]; then
  MICRO="${MICRO:-2}"
  : > "$RAW/bubble.jsonl"
  for sched in 1f1b gpipe zb-h1 interleaved; do
    VS=(); [[ $sched == interleaved ]] && VS=(--dist.pp_virtual_stages=2)
    for K in ${KS:-4 8 16}; do
      name="bubble_${sched}_k$K"
      if OMP_NUM_THREADS=8 timeout ${RUN_TIMEOUT:-200} "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train \
           configs/llama-0.85b.toml --run.dir="$RUNS" --run.overwrite=true --run.name=$name \
           --train.batch_size=$((MICRO * K)) --train.grad_accum=$K --train.steps=${STEPS:-12} --train.log_every=4 \
           --schedule.warmup_steps=2 --eval.every=0 --checkpoint.at_end=false --dist.pp=2 --dist.pp_schedule=$sched "${VS[@]}" \
           > "$RAW/$name.log" 2>&1; then
        r=$("$PY" - "$RUNS/$name" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")]
last = prog[-2:]
print(json.dumps({"ms_per_step": sum(r["ms_per_step"] for r in last) / len(last),
                  "tokens_per_s": sum(r["tokens_per_s"] for r in last) / len(last),
                  "mem_bytes": max(r["mem_bytes"] for r in prog)}))
PYEOF
)
      else
        r='{"error": "run failed"}'
      fi
      echo "{\"schedule\": \"$sched\", \"K\": $K, \"micro\": $MICRO, \"result\": $r}" | tee -a "$RAW/bubble.jsonl"
    done
  done
  # The fit per schedule: ms = a K + b; bubble(K) = b / (a K + b) beside theory.
  "$PY" - "$RAW/bubble.jsonl" <<'PYEOF' | tee "$RAW/bubble_fit.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
P = 2
for sched in ("1f1b", "gpipe", "zb-h1", "interleaved"):
    pts = [(r["K"], r["result"]["ms_per_step"]) for r in rows if r["schedule"] == sched and "ms_per_step" in r["result"]]
    if len(pts) < 2:
        print(sched, "not enough runs"); continue
    n = len(pts); sx = sum(k for k, _ in pts); sy = sum(t for _, t in pts)
    sxx = sum(k * k for k, _ in pts); sxy = sum(k * t for k, t in pts)
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx); b = (sy - a * sx) / n
    for k, t in pts:
        theory = (P - 1) / (k + P - 1) * {"zb-h1": 1 / 3, "interleaved": 1 / 2}.get(sched, 1)
        print(f"{sched} K={k}: {t:.1f} ms/step, fitted bubble {b / (a * k + b):.3f}, theory {theory:.3f} (a={a:.2f} ms per micro-batch, b={b:.1f} ms)")
PYEOF
fi
echo "run_pp: done; raw results in $RAW"
