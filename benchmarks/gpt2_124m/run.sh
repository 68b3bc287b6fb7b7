#!/usr/bin/env bash
# GPT-2 124M training throughput: forge against PyTorch (eager and torch.compile), same GPU, same run.
#
#   benchmarks/gpt2_124m/run.sh                 # after scripts/gpu-check.sh built build-gpu/
#   BUILD_DIR=build-gpu STEPS=40 BATCHES="16 32" benchmarks/gpt2_124m/run.sh
#
# For each batch size (x 1024 tokens): `forge train configs/gpt2-124m.toml` (bf16, random tokens)
# and benchmarks/gpt2_124m/pytorch_gpt2.py in eager and compile mode, each for STEPS timed steps
# after WARMUP steps. Then, with Nsight Compute (ncu), a per-kernel breakdown of two forge steps.
# Writes benchmarks/results/gpt2_124m_<gpu>.md (tokens/s, ms/step, MFU, peak memory, ratios) and
# the raw JSON beside it. Method: benchmarks/gpt2_124m/README.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STEPS="${STEPS:-40}"
WARMUP="${WARMUP:-10}"
BATCHES="${BATCHES:-16 32}"
source benchmarks/common.sh
bench_setup run.sh
WORK="$(mktemp -d)"
RAW="$WORK/raw"
mkdir -p "$RAW"
echo "gpt2_124m: $GPU, forge $FORGE, python $PY, steps $STEPS (+$WARMUP warm-up), batches $BATCHES"

for B in $BATCHES; do
  echo "== forge, batch $B"
  OMP_NUM_THREADS=8 "$FORGE" train configs/gpt2-124m.toml --run.dir="$WORK/runs" --run.name="forge-b$B" \
    --train.batch_size="$B" --train.steps=$((STEPS + WARMUP)) --train.log_every="$WARMUP" \
    --schedule.warmup_steps="$WARMUP" 2>&1 | tee "$RAW/forge-b$B.log" | grep -E "step|device|model" || true
  cp "$WORK/runs/forge-b$B/metrics.jsonl" "$RAW/forge-b$B.jsonl" 2>/dev/null || true
  for MODE in eager compile; do
    echo "== pytorch $MODE, batch $B"
    "$PY" benchmarks/gpt2_124m/pytorch_gpt2.py --mode "$MODE" --batch "$B" --steps "$STEPS" --warmup "$WARMUP" \
      --json "$RAW/pytorch-$MODE-b$B.json" 2>&1 | tail -2 || true
  done
done

# Per-kernel breakdown: Nsight Compute times every kernel of a window of launches (steps 3-4 of
# a short forge run: past the first step's cuBLASLt heuristics and allocator growth). Each
# kernel is timed alone (ncu serialises; clocks left as they are, --clock-control none), so the
# sum is GPU busy time without overlap.
if command -v ncu >/dev/null 2>&1; then
  echo "== ncu: per-kernel breakdown of forge, batch 16"
  PER_STEP="${KERNELS_PER_STEP:-0}"
  if [[ "$PER_STEP" == 0 ]]; then  # count one step's launches first
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --launch-skip 0 --launch-count 100000 \
      "$FORGE" train configs/gpt2-124m.toml --run.dir="$WORK/runs" --run.name=forge-count --train.batch_size=16 \
      --train.steps=2 --train.log_every=2 > "$WORK/count.csv" 2>/dev/null || true
    N=$(grep -c '"gpu__time_duration.sum"' "$WORK/count.csv" || true); PER_STEP=$(( ${N:-0} / 2 ))
  fi
  if [[ "$PER_STEP" -gt 0 ]]; then
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --launch-skip $((2 * PER_STEP)) --launch-count $((2 * PER_STEP)) \
      "$FORGE" train configs/gpt2-124m.toml --run.dir="$WORK/runs" --run.name=forge-prof --train.batch_size=16 \
      --train.steps=5 --train.log_every=5 > "$RAW/forge-ncu.csv" 2>/dev/null || true
    echo "$PER_STEP kernels per step" > "$RAW/forge-ncu.steps"
  fi
fi

mkdir -p benchmarks/results
OUT="benchmarks/results/gpt2_124m_${GPU}.md"
"$PY" benchmarks/gpt2_124m/report.py --raw "$RAW" --warmup "$WARMUP" --command "$0 (STEPS=$STEPS WARMUP=$WARMUP BATCHES=\"$BATCHES\")" > "$OUT"
mkdir -p "benchmarks/results/raw"
cp -r "$RAW" "benchmarks/results/raw/gpt2_124m_${GPU}"
echo "wrote $OUT"
cat "$OUT"
