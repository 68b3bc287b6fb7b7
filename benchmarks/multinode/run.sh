#!/usr/bin/env bash
# Several machines simulated on one host (issue 42; docs/dist.md "Several machines"): NODES nodes of
# PER_NODE ranks, the traffic between nodes through NCCL's socket transport (GPUs:
# scripts/simulate-nodes.sh) held to LINKS Gb/s by forge's paced link (dist.link_gbps), and the
# layouts the seeds' lab weighs measured against each other on each link, with forge plan's
# prediction beside each GPU row:
#   flat        DDP, one ring over every rank
#   hier        DDP reduced within each node first (dist.dp_reduce = "hierarchical")
#   hier_acc4   the same at 4x the micro-batches per step (gradient accumulation: a quarter of the
#               reductions per token)
#   zero1_hier  ZeRO-1, hierarchical
#   pp_nodes    one pipeline stage per node (pp = NODES, 1F1B), data parallel within the node
#   psgd4       DDP with PowerSGD rank 4 (dist.grad_compression = "powersgd")
#   fp8         DDP, flat, its gradient reductions sent in FP8 (dist.grad_compression = "fp8")
#   hier_fp8    DDP, hierarchical, the stage between nodes in FP8
#   local       DDP without the simulated network (every rank on one host): the ceiling
# and, per link, forge bench collectives' all-reduce over the simulated nodes (flat and
# hierarchical): the rate the link delivered, measured.
#
#   DEVICE=cuda NODES=2 PER_NODE=2 benchmarks/multinode/run.sh          # 4 GPUs (nvidia-h100-x4)
#   DEVICE=cpu NODES=2 PER_NODE=2 LINKS="0.5 2" MODELS=tiny benchmarks/multinode/run.sh   # CPU ranks
#
# Results: $RAW (benchmarks/results/raw/multinode_<device>/) as JSON lines, then
# benchmarks/multinode/report.py writes benchmarks/results/multinode_<device>.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DEVICE="${DEVICE:-cuda}"
NODES="${NODES:-2}"
PER_NODE="${PER_NODE:-2}"
W=$((NODES * PER_NODE))
STEPS="${STEPS:-30}"
if [[ "$DEVICE" == cuda ]]; then
  source benchmarks/common.sh
  bench_setup multinode/run.sh
  export NCCL_NVLS_ENABLE=0
  NGPU=$(nvidia-smi -L | wc -l)
  [[ "$NGPU" -ge "$W" ]] || { echo "multinode/run.sh: $NODES x $PER_NODE = $W GPUs needed, this machine has $NGPU"; exit 2; }
  LINKS="${LINKS:-10 25 100}"
  MODELS="${MODELS:-gpt2 llama}"
  NAME="${GPU}"
  PLAN_GPU=h100; [[ "$GPU" == *H200* ]] && PLAN_GPU=h200
else
  FORGE="${FORGE:-build/forge}"
  PY="${PYTHON:-python3}"
  LINKS="${LINKS:-0.5 2}"
  MODELS="${MODELS:-tiny}"
  NAME=cpu
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
fi
RAW="${RAW_DIR:-benchmarks/results/raw/multinode_${NAME}}"
RUNS="${RUNS_DIR:-/tmp/forge_multinode_runs}"
mkdir -p "$RAW" "$RUNS"
# (the tiny CPU model is given whole on the command line; its empty config is this script's own)
EMPTY_TOML=$(mktemp "$RUNS/empty.XXXXXX.toml")
trap 'rm -f "$EMPTY_TOML"' EXIT
: > "$RAW/rows.jsonl"
{ git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; } > "$RAW/commit.txt"
echo "multinode: $DEVICE, $NODES nodes x $PER_NODE, links: $LINKS Gb/s, models: $MODELS, commit $(cat "$RAW/commit.txt")"

# One rank's command line prefix: GPUs through forge launch + the node wrapper, CPU ranks through mpirun.
launch() {  # WORLD NODE_SIZE
  if [[ "$DEVICE" == cuda ]]; then
    echo "$FORGE launch --nproc-per-node $1 -- scripts/simulate-nodes.sh $2 --"
  else
    echo "mpirun --oversubscribe --bind-to none --mca btl self,vader -np $1"
  fi
}

model_args() {  # MODEL -> forge train arguments
  case "$1" in
    gpt2) echo "configs/gpt2-124m.toml --data.source=random --train.seq_len=1024" ;;
    llama) echo "configs/llama-0.85b.toml --data.source=random --train.seq_len=2048" ;;
    tiny) echo "$EMPTY_TOML --run.device=cpu --run.dtype=f32 --model.type=gpt --model.n_layer=4 --model.n_head=4 --model.n_embd=256 \
--model.vocab_size=4096 --model.block_size=128 --model.bias=false --data.source=random --train.seq_len=128 --optim.name=adamw" ;;
  esac
}
micro_batch() {  # MODEL -> sequences per micro-batch per rank
  case "$1" in gpt2) echo 16 ;; llama) echo 4 ;; *) echo 4 ;; esac
}

summary() {  # RUN_DIR -> {"tokens_per_s", "ms_per_step"}: the median of the progress records after the first
  "$PY" - "$1" <<'PYEOF'
import json, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")][1:]
print(json.dumps({"tokens_per_s": statistics.median(r["tokens_per_s"] for r in prog),
                  "ms_per_step": statistics.median(r["ms_per_step"] for r in prog), "records": len(prog)}))
PYEOF
}

row() {  # MODEL LINK LAYOUT -> one JSON line in rows.jsonl
  local model=$1 link=$2 layout=$3 args world=$W node=$PER_NODE accum=1 extra=() plan=()
  args=$(model_args "$model")
  local MB; MB=$(micro_batch "$model")
  case "$layout" in
    flat) extra=(--dist.dp_reduce=flat) ;;
    hier) extra=(--dist.dp_reduce=hierarchical) ;;
    hier_acc4) extra=(--dist.dp_reduce=hierarchical); accum=4 ;;
    zero1_hier) extra=(--dist.dp_reduce=hierarchical --dist.zero_stage=1); plan=(--zero 1) ;;
    pp_nodes) extra=(--dist.pp="$NODES" --dist.pp_schedule=1f1b); accum=$((2 * NODES)); plan=(--pp "$NODES") ;;
    psgd4) extra=(--dist.grad_compression=powersgd --dist.powersgd_rank=4); plan=(--grad-compression powersgd --powersgd-rank 4) ;;
    fp8) extra=(--dist.dp_reduce=flat --dist.grad_compression=fp8); plan=(--grad-compression fp8) ;;
    hier_fp8) extra=(--dist.dp_reduce=hierarchical --dist.grad_compression=fp8); plan=(--grad-compression fp8) ;;
    local) extra=() ;;
  esac
  local dp=$W; [[ "$layout" == pp_nodes ]] && dp=$PER_NODE
  local batch=$((MB * dp * accum)) k=$accum
  [[ "$layout" == pp_nodes ]] && batch=$((MB / 2 * dp * accum))  # micro-batches of MB/2 in flight
  local linkargs=(--dist.node_size="$node" --dist.link_gbps="$link")
  [[ "$layout" == local ]] && linkargs=()
  local name="${model}_${layout}_${link}"
  # shellcheck disable=SC2086
  if timeout "${RUN_TIMEOUT:-600}" $(launch "$world" "$node") "$FORGE" train $args --train.steps="$STEPS" \
       --train.batch_size="$batch" --train.grad_accum="$k" "${extra[@]}" "${linkargs[@]}" --train.log_every=5 \
       --run.dir="$RUNS" --run.name="$name" --run.overwrite=true --eval.every=0 --checkpoint.at_end=false \
       > "$RAW/$name.log" 2>&1; then
    local s; s=$(summary "$RUNS/$name")
    local p='null'
    if [[ "$DEVICE" == cuda && "$layout" != local ]]; then
      local reduce=flat; [[ "$layout" == *hier* ]] && reduce=hierarchical
      local ib; ib=$("$PY" -c "print($link / 8 / $node)")
      # shellcheck disable=SC2086
      p=$("$FORGE" plan --config ${args%% *} --gpu "$PLAN_GPU" --gpus "$world" --gpus-per-node "$node" --ib "$ib" \
            --link-efficiency 1 --dp "$dp" --micro-batch $([[ "$layout" == pp_nodes ]] && echo $((MB / 2)) || echo "$MB") \
            --batch "$batch" --dp-reduce "$reduce" "${plan[@]}" --json 2>/dev/null |
          "$PY" -c "import json,sys; t=json.load(sys.stdin)['time']; print(json.dumps({'tokens_per_s': t['tokens_per_s'], 'step_s': t['step'], 'dp_comm': t['dp_comm'], 'dp_exposed': t['dp_exposed'], 'pp_p2p': t['pp_p2p']}))" || echo null)
    fi
    echo "{\"model\": \"$model\", \"link_gbps\": $link, \"layout\": \"$layout\", \"world\": $world, \"node_size\": $node, \"batch\": $batch, \"grad_accum\": $k, \"measured\": $s, \"plan\": $p}" >> "$RAW/rows.jsonl"
  else
    echo "{\"model\": \"$model\", \"link_gbps\": $link, \"layout\": \"$layout\", \"error\": \"$(tail -1 "$RAW/$name.log" | tr -d '"\\' | cut -c1-200)\"}" >> "$RAW/rows.jsonl"
  fi
  tail -1 "$RAW/rows.jsonl"
}

for link in $LINKS; do
  # The link as measured: an all-reduce over the simulated nodes, flat and hierarchical, and each
  # with the gradients in FP8 (its bandwidth counted over the uncompressed bytes).
  for reduce in flat hierarchical flat-fp8 hierarchical-fp8; do
    gc=none; [[ "$reduce" == *-fp8 ]] && gc=fp8
    # shellcheck disable=SC2046
    timeout 300 $(launch "$W" "$PER_NODE") "$FORGE" bench collectives --device "$DEVICE" --ops all_reduce \
      --sizes "${COLL_SIZES:-16M,256M}" --iters 5 --warmup 2 --node-size "$PER_NODE" --dp-reduce "${reduce%-fp8}" \
      --grad-compression "$gc" --link-gbps "$link" --json > "$RAW/coll_${reduce}_${link}.json" 2> "$RAW/coll_${reduce}_${link}.log" || true
  done
  for model in $MODELS; do
    for layout in ${LAYOUTS:-flat hier hier_acc4 zero1_hier pp_nodes psgd4 fp8 hier_fp8}; do row "$model" "$link" "$layout"; done
  done
done
for model in $MODELS; do row "$model" 0 local; done
"$PY" benchmarks/multinode/report.py "$RAW" > "$RAW/report.md.tmp"  # (moved into place only when complete)
mv "$RAW/report.md.tmp" "benchmarks/results/multinode_${NAME}.md"
echo "multinode: benchmarks/results/multinode_${NAME}.md"
