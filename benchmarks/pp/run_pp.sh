#!/usr/bin/env bash
# Pipeline parallelism on a machine with (at least) two GPUs (issue 17): equivalence of `forge
# train` at pp = 2 (NCCL send/recv) with the one-GPU run for every schedule, the measured bubble
# against theory and forge plan, forge against PyTorch's own pipelining, and a slow link
# simulated. Results: $RAW_DIR (default benchmarks/results/raw/pp_<gpu>/: logs and JSON lines);
# benchmarks/pp/report_pp.py turns them into benchmarks/results/pp_<gpu>.md.
#
#   BUILD_ONLY=1 scripts/gpu-check.sh && benchmarks/pp/run_pp.sh
#   PHASES=check benchmarks/pp/run_pp.sh
#
# Phases:
#   check   tiny GPT and LLaMA, f32 without TF32, SGD and AdamW, grad_accum 4: pp = CHECK_PP (2) on as many
#           GPUs with 1f1b, gpipe, zb-h1 and interleaved (2 chunks) against one GPU
#           (benchmarks/dist/compare_runs.py)
#   bubble  LLaMA 0.85B (configs/llama-0.85b.toml), bf16, pp = 2, micro-batch MICRO (2) sequences,
#           K = grad_accum in KS ("4 8 16"), each schedule in SCHEDS: ms/step. A step of K micro-batches
#           takes a K + b (a: one micro-batch's forward and backward on the slower stage; b: the fill and
#           drain); the fitted bubble b / (a K + b) is set beside the theory (P - 1) / (K + P - 1)
#           (1F1B, GPipe), about a third of it (ZB-H1), half of it (interleaved, 2 chunks), and beside
#           forge plan's step, bubble and memory of every stage (the trainer's mem_bytes_per_stage).
#   peer    PyTorch's torch.distributed.pipelining at pp = 2 (benchmarks/pp/torch_pp_peer.py), the
#           same model, K = PEER_K (8) micro-batches, schedule (PEER_SCHEDS) and forge plan's split;
#           blocks compiled (PEER_MODE=eager: not)
#   socket  NCCL on its socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) and on NVLink: the
#           link's bus bandwidth (forge bench collectives), pp = 2 (1F1B) against dp = 2 at the same
#           batch, and forge plan given that bandwidth
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run_pp.sh
export NCCL_NVLS_ENABLE=0
PHASES="${PHASES:-check bubble peer socket}"
RAW="${RAW_DIR:-benchmarks/results/raw/pp_$GPU}"
RUNS="${RUNS_DIR:-/tmp/forge_pp_runs}"
mkdir -p "$RAW" "$RUNS"
NGPU=$(nvidia-smi -L | wc -l)
[[ "$NGPU" -ge 2 ]] || { echo "run_pp.sh: needs 2 GPUs, found $NGPU"; exit 2; }
{ [[ -n "${FORGE_COMMIT:-}" ]] && echo "$FORGE_COMMIT" || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; } > "$RAW/commit.txt"
echo "run_pp: $GPU x $NGPU, phases: $PHASES, commit $(cat "$RAW/commit.txt")"

if [[ " $PHASES " == *" check "* ]]; then
  PC="${CHECK_PP:-2}"
  [[ "$PC" -le "$NGPU" ]] || { echo "run_pp.sh: CHECK_PP=$PC needs $PC GPUs, found $NGPU"; exit 2; }
  echo "== equivalence: pp = $PC on $PC GPUs vs 1 GPU, f32"
  COMMON=(--run.dir="$RUNS" --run.device=cuda --run.dtype=f32 --run.allow_tf32=false --run.overwrite=true
          --model.vocab_size=256 --model.block_size=16 --model.n_layer=$((PC > 2 ? 2 * PC : 4)) --model.n_head=4 --data.source=random
          --train.steps=20 --train.batch_size=8 --train.grad_accum=4 --train.seq_len=16 --train.log_every=1
          --optim.lr=3e-3 --optim.momentum=0.9 --optim.grad_clip=0.5 --schedule.warmup_steps=3
          --schedule.decay_steps=20 --eval.every=0 --dist.bucket_mb=0.004)
  [[ "${APPEND:-0}" == 1 ]] || : > "$RAW/equivalence.jsonl"
  for model in ${CHECK_MODELS:-gpt llama}; do
    case $model in
      gpt) M=(--model.type=gpt --model.n_embd=32 --model.bias=false) ;;
      llama) M=(--model.type=llama --model.dim=32 --model.n_kv_head=2) ;;
    esac
    for o in sgd adamw; do
      "$FORGE" train configs/tiny.toml "${COMMON[@]}" "${M[@]}" --optim.name=$o --run.name=ref_${model}_$o > "$RAW/eq_ref_${model}_$o.log" 2>&1
      for sched in 1f1b gpipe zb-h1 interleaved; do
        name="eq_${model}_${o}_pp${PC}_$sched"
        VS=(); [[ $sched == interleaved ]] && VS=(--dist.pp_virtual_stages=2)
        if timeout 120 "$FORGE" launch --nproc-per-node "$PC" -- "$FORGE" train configs/tiny.toml "${COMMON[@]}" "${M[@]}" \
             --optim.name=$o --run.name=$name --dist.pp="$PC" --dist.pp_schedule=$sched "${VS[@]}" > "$RAW/$name.log" 2>&1; then
          r=$("$PY" benchmarks/dist/compare_runs.py "$RUNS/$name" "$RUNS/ref_${model}_$o")
        else
          r='{"error": "run failed"}'
        fi
        echo "{\"model\": \"$model\", \"optim\": \"$o\", \"pp\": $PC, \"schedule\": \"$sched\", \"result\": $r}" | tee -a "$RAW/equivalence.jsonl"
      done
    done
  done
fi

PLAN_GPU=h100; [[ "$GPU" == *H200* ]] && PLAN_GPU=h200
MICRO="${MICRO:-2}"
# forge plan of the 0.85B LLaMA at pp = 2 (dp 1) with K micro-batches of MICRO under a schedule:
# step time, bubble, the balanced split and the memory of every stage (JSON on one line).
plan_pp() {  # SCHED K
  local VS=(); [[ $1 == interleaved ]] && VS=(--virtual-stages 2)
  "$FORGE" plan --config configs/llama-0.85b.toml --gpu $PLAN_GPU --gpus 2 --pp 2 --dp 1 --micro-batch $MICRO \
      --grad-accum $2 --batch $((MICRO * $2)) --schedule $1 "${VS[@]}" --json 2>/dev/null | "$PY" -c "
import json, sys
j = json.load(sys.stdin)
print(json.dumps({'step_s': j['time']['step'], 'bubble_s': j['time']['bubble'], 'tokens_per_s': j['time']['tokens_per_s'],
                  'stage_layers': j['layout']['virtual_stage_layers'],
                  'mem_subtotal_per_stage': [s['subtotal'] for s in j['memory']['per_stage']],
                  'mem_total_per_stage': [s['total'] for s in j['memory']['per_stage']]}))" || echo '{"error": "plan failed"}'
}
# The last two progress intervals of a forge run, its peak memory per stage and the split it logged.
forge_summary() {  # RUN_DIR LOG
  "$PY" - "$1" "$2" <<'PYEOF'
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")]
fin = [r for r in recs if r.get("final")]
last = prog[-2:]
out = {"ms_per_step": sum(r["ms_per_step"] for r in last) / len(last),
       "tokens_per_s": sum(r["tokens_per_s"] for r in last) / len(last),
       "mfu": last[-1].get("mfu"), "loss": last[-1].get("loss"),
       "mem_bytes_max": fin[-1].get("mem_bytes_max") if fin else None,
       "mem_bytes_per_stage": fin[-1].get("mem_bytes_per_stage") if fin else None}
m = re.findall(r"stage 0 runs blocks (\[[^;]*?)(?: and|;)", open(sys.argv[2]).read())
out["stage0_blocks"] = m[0] if m else None
print(json.dumps(out))
PYEOF
}
forge_pp() {  # NAME SCHED K [extra forge args...]: forge train of the 0.85B LLaMA at pp = 2, MICRO x K per step
  local name=$1 sched=$2 K=$3; shift 3
  local VS=(); [[ $sched == interleaved ]] && VS=(--dist.pp_virtual_stages=2)
  if OMP_NUM_THREADS=8 timeout ${RUN_TIMEOUT:-150} "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train \
       configs/llama-0.85b.toml --run.dir="$RUNS" --run.overwrite=true --run.name=$name \
       --train.batch_size=$((MICRO * K)) --train.grad_accum=$K --train.steps=${STEPS:-12} --train.log_every=4 \
       --schedule.warmup_steps=2 --eval.every=0 --checkpoint.at_end=false --dist.pp=2 --dist.pp_schedule=$sched \
       "${VS[@]}" "$@" > "$RAW/$name.log" 2>&1; then
    forge_summary "$RUNS/$name" "$RAW/$name.log" || echo '{"error": "no summary"}'
  else
    echo '{"error": "run failed"}'
  fi
}

if [[ " $PHASES " == *" bubble "* ]]; then
  : > "$RAW/bubble.jsonl"
  for sched in ${SCHEDS:-1f1b gpipe zb-h1 interleaved}; do
    for K in ${KS:-4 8 16}; do
      r=$(forge_pp "bubble_${sched}_k$K" $sched $K)
      echo "{\"schedule\": \"$sched\", \"K\": $K, \"micro\": $MICRO, \"result\": $r, \"plan\": $(plan_pp $sched $K)}" | tee -a "$RAW/bubble.jsonl"
    done
  done
  # The fit per schedule: ms = a K + b; bubble(K) = b / (a K + b) beside theory and forge plan.
  "$PY" - "$RAW/bubble.jsonl" <<'PYEOF' | tee "$RAW/bubble_fit.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
P = 2
for sched in ("1f1b", "gpipe", "zb-h1", "interleaved"):
    pts = [(r["K"], r["result"]["ms_per_step"], r) for r in rows if r["schedule"] == sched and "ms_per_step" in r["result"]]
    if len(pts) < 2:
        print(sched, "not enough runs"); continue
    n = len(pts); sx = sum(k for k, _, _ in pts); sy = sum(t for _, t, _ in pts)
    sxx = sum(k * k for k, _, _ in pts); sxy = sum(k * t for k, t, _ in pts)
    a = (n * sxy - sx * sy) / (n * sxx - sx * sx); b = (sy - a * sx) / n
    for k, t, r in pts:
        theory = (P - 1) / (k + P - 1) * {"zb-h1": 1 / 3, "interleaved": 1 / 2}.get(sched, 1)
        pl = r.get("plan", {})
        mem = r["result"].get("mem_bytes_per_stage") or []
        pmem = pl.get("mem_subtotal_per_stage") or []
        print(f"{sched} K={k}: {t:.1f} ms/step (plan {1e3 * pl.get('step_s', float('nan')):.1f}), fitted bubble "
              f"{b / (a * k + b):.3f}, theory {theory:.3f} (a={a:.2f} ms per micro-batch, b={b:.1f} ms); "
              f"mem/stage GB measured {[round(x / 1e9, 1) for x in mem]} plan {[round(x / 1e9, 1) for x in pmem]}; "
              f"split {r['result'].get('stage0_blocks')} plan {pl.get('stage_layers')}")
PYEOF
fi

if [[ " $PHASES " == *" peer "* ]]; then
  # PyTorch's own pipelining at pp = 2, the same model, micro-batches, schedule and split
  # (forge plan's balanced split, which forge train uses), K = PEER_K.
  K="${PEER_K:-8}"
  : > "$RAW/peer.jsonl"
  for sched in ${PEER_SCHEDS:-1f1b gpipe interleaved zb}; do
    fs=$sched; [[ $sched == zb ]] && fs=zb-h1
    layers=$(plan_pp $fs $K | "$PY" -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['stage_layers'])))" || echo "")
    name="peer_${sched}_k$K"
    VS=(); [[ $sched == interleaved ]] && VS=(--virtual-stages 2)
    if timeout ${PEER_TIMEOUT:-240} "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/pp/torch_pp_peer.py \
         --config configs/llama-0.85b.toml --mode "${PEER_MODE:-compile}" --schedule $sched "${VS[@]}" --micro $MICRO \
         --grad-accum $K --layers "$layers" --steps ${PEER_STEPS:-8} --warmup ${PEER_WARMUP:-4} --json "$RAW/$name.json" > "$RAW/$name.log" 2>&1; then
      r=$("$PY" -c "import json, sys; d = json.load(open(sys.argv[1])); d.pop('per_rank', None); print(json.dumps(d))" "$RAW/$name.json")
    else
      r="{\"error\": \"run failed: $(grep -E 'Error|error' "$RAW/$name.log" | tail -1 | tr -d '"\\' | cut -c1-200)\"}"
    fi
    echo "{\"schedule\": \"$fs\", \"K\": $K, \"who\": \"pytorch\", \"layers\": \"$layers\", \"result\": $r}" | tee -a "$RAW/peer.jsonl"
  done
fi

if [[ " $PHASES " == *" socket "* ]]; then
  # A slow link simulated: NCCL on its socket transport (no NVLink/P2P, no shared memory), pp = 2
  # (1F1B, K = 8 micro-batches of MICRO) against dp = 2 (DDP, each rank 4 micro-batches of MICRO),
  # the same global batch; and over NVLink for reference. forge plan is given the link's measured
  # bus bandwidth (forge bench collectives, all_reduce of 64 MiB) as the GPU-GPU link, at
  # efficiency 1, and predicts both layouts.
  : > "$RAW/socket.jsonl"
  K=8
  for link in socket nvlink; do
    (
      [[ $link == socket ]] && export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
      bw=$(timeout 120 "$FORGE" launch --no-prefix --nproc-per-node 2 -- "$FORGE" bench collectives --device cuda \
             --ops all_reduce,send_recv --sizes 64M --dtype bf16 --iters 10 --json 2>/dev/null | "$PY" -c "
import json, sys
j = json.loads(sys.stdin.read())
print(json.dumps({r['op']: r['busbw_gbs'] for r in j['results']}))" || echo '{}')
      echo "{\"link\": \"$link\", \"busbw_gbs\": $bw}" | tee -a "$RAW/socket.jsonl"
      gbs=$(echo "$bw" | "$PY" -c "import json,sys; print(json.load(sys.stdin).get('all_reduce', 0))")
      for layout in pp2 dp2; do
        if [[ $layout == pp2 ]]; then
          r=$(forge_pp ${link}_pp2 1f1b $K)
          P=(--pp 2 --dp 1 --grad-accum $K)
        else
          name="${link}_dp2"
          if OMP_NUM_THREADS=8 timeout ${RUN_TIMEOUT:-150} "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train \
               configs/llama-0.85b.toml --run.dir="$RUNS" --run.overwrite=true --run.name=$name \
               --train.batch_size=$((MICRO * K)) --train.grad_accum=$((K / 2)) --train.steps=${STEPS:-12} \
               --train.log_every=4 --schedule.warmup_steps=2 --eval.every=0 --checkpoint.at_end=false > "$RAW/$name.log" 2>&1; then
            r=$(forge_summary "$RUNS/$name" "$RAW/$name.log" || echo '{"error": "no summary"}')
          else
            r='{"error": "run failed"}'
          fi
          P=(--pp 1 --dp 2 --grad-accum $((K / 2)))
        fi
        LINK=(); [[ "$gbs" != 0 ]] && LINK=(--nvlink "$gbs" --link-efficiency 1)
        p=$("$FORGE" plan --config configs/llama-0.85b.toml --gpu $PLAN_GPU --gpus 2 --micro-batch $MICRO \
              --batch $((MICRO * K)) "${P[@]}" "${LINK[@]}" --json 2>/dev/null | "$PY" -c "
import json, sys
j = json.load(sys.stdin)
t = j['time']
print(json.dumps({'step_s': t['step'], 'tokens_per_s': t['tokens_per_s'], 'dp_exposed_s': t['dp_exposed'],
                  'pp_p2p_s': t['pp_p2p'], 'bubble_s': t['bubble']}))" || echo '{"error": "plan failed"}')
        echo "{\"link\": \"$link\", \"layout\": \"$layout\", \"result\": $r, \"plan\": $p}" | tee -a "$RAW/socket.jsonl"
      done
    )
  done
fi
echo "run_pp: done; raw results in $RAW"
