#!/usr/bin/env bash
# Long sequences on one GPU (issue 38, item 4): LLaMA 0.85B (configs/llama-0.85b.toml) at T = 16k
# and 32k tokens, batch 1, activation checkpointing of every block, forge beside PyTorch
# (benchmarks/step/torch_peer.py --mode compile --checkpoint: torch.compile, SDPA with GQA,
# torch.utils.checkpoint per block, fused AdamW) in the same session: tokens/s and peak memory.
#
#   benchmarks/long/run_long.sh                  # SEQS="16384 32768", FORGE=build-gpu/forge
#   SEQS=16384 STEPS=10 benchmarks/long/run_long.sh
#
# forge: random tokens, run.dtype auto (bf16), its defaults otherwise (CUDA graph, attention auto);
# its figures are the mean ms/step after WARMUP steps (benchmarks/step/report.py --line-forge).
# PyTorch: the mean of its timed steps after its warm-up. Peak memory: forge's live tensors
# (metrics.jsonl mem_bytes), PyTorch's max_memory_allocated (both without the allocator's reserve).
# Output: RESULTS (default /tmp/forge_long): a line per run in figures.txt, logs, runs/.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
FORGE=${FORGE:-build-gpu/forge}
SEQS=${SEQS:-"16384 32768"}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
R=${RESULTS:-/tmp/forge_long}
PY=${PYTHON:-python3}
mkdir -p "$R/runs"
: > "$R/figures.txt"
for T in $SEQS; do
  name="llama_T$T"
  timeout "${RUN_TIMEOUT:-300}" "$FORGE" train configs/llama-0.85b.toml --run.dir="$R/runs" --run.name="$name" \
    --run.overwrite=true --train.seq_len="$T" --model.block_size="$T" --train.batch_size=1 \
    --model.checkpoint_activations=true --train.steps="$STEPS" --train.log_every=1 --eval.every=0 \
    --checkpoint.at_end=false --checkpoint.interval_minutes=0 > "$R/$name.forge.log" 2>&1
  rc=$?
  fig=$("$PY" benchmarks/step/report.py --line-forge "$R/runs/$name/metrics.jsonl" --warmup "$WARMUP" --tokens-per-step "$T")
  echo "T=$T forge (rc $rc): $fig" | tee -a "$R/figures.txt"
  [ $rc -eq 0 ] || tail -5 "$R/$name.forge.log"
  timeout "${RUN_TIMEOUT:-300}" "$PY" benchmarks/step/torch_peer.py --config configs/llama-0.85b.toml --mode compile \
    --batch 1 --seq "$T" --block_size "$T" --checkpoint --steps "$((STEPS - WARMUP))" --warmup "$WARMUP" \
    --json "$R/$name.torch.json" > "$R/$name.torch.log" 2>&1
  rc=$?
  fig=$("$PY" benchmarks/step/report.py --line-peer "$R/$name.torch.json")
  echo "T=$T torch.compile (rc $rc): $fig" | tee -a "$R/figures.txt"
  [ $rc -eq 0 ] || tail -5 "$R/$name.torch.log"
done
if [ -n "${OUT:-}" ]; then cp "$R/figures.txt" "$OUT/long_figures.txt"; tar -czf "$OUT/long_logs.tgz" -C "$R" --exclude=runs . ; fi
