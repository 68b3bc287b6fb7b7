#!/usr/bin/env bash
# Attention: forge's back-ends (`forge bench attention`: cuDNN, cuDNN deterministic, forge's
# flash kernels) beside PyTorch's scaled_dot_product_attention (cuDNN and flash back-ends) on
# the same shapes, same GPU, same run. Writes benchmarks/results/attention_<gpu>.md and the
# raw JSON beside it (benchmarks/results/raw/attention_<gpu>/).
#
#   benchmarks/attention/run.sh                          # after scripts/gpu-check.sh BUILD_ONLY=1
#   SHAPES="16x12x12x1024x64 4x32x8x2048x128" REPEATS=30 benchmarks/attention/run.sh
#   LAYOUT=bshd SHAPES=4x32x8x2048x64 benchmarks/attention/run.sh   # (B, T, H, D)-ordered tensors, as
#                                       # forge's models hand them to attention -> attention_<gpu>_bshd.md
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run.sh
REPEATS="${REPEATS:-20}"
WARMUP="${WARMUP:-3}"
BACKENDS="${BACKENDS:-cudnn,cudnn-det,flash}"
LAYOUT="${LAYOUT:-bhsd}"  # bhsd | bshd (Note [attention layouts] in src/forge/bench/attention.cpp)
[[ "$LAYOUT" == bhsd || "$LAYOUT" == bshd ]] || { echo "run.sh: LAYOUT is bhsd or bshd, got '$LAYOUT'"; exit 2; }
SUFFIX=$([[ "$LAYOUT" == bshd ]] && echo _bshd || true)
# Default shapes: those of `forge bench attention` (causal, 16k tokens per call).
SHAPES="${SHAPES:-$(for T in 1024 2048 4096 8192; do B=$((16384 / T)); echo "${B}x12x12x${T}x64 ${B}x16x4x${T}x64 ${B}x32x8x${T}x128"; done)}"
RAW="benchmarks/results/raw/attention_${GPU}${SUFFIX}"
mkdir -p "$RAW"
shape_args=()
for s in $SHAPES; do shape_args+=(--shape "$s"); done
shape_args+=(--layout "$LAYOUT")
echo "== forge bench attention ($BACKENDS, layout $LAYOUT)"
"$FORGE" bench attention "${shape_args[@]}" --backends "$BACKENDS" --repeats "$REPEATS" --warmup "$WARMUP"
"$FORGE" bench attention "${shape_args[@]}" --backends "$BACKENDS" --repeats "$REPEATS" --warmup "$WARMUP" --json \
  > "$RAW/forge.json"
echo "== PyTorch scaled_dot_product_attention (cudnn, flash; layout $LAYOUT)"
# GRAPH=N (default 10): PyTorch's calls timed N to a CUDA graph replay (no Python dispatch inside
# the timing, issue 41); GRAPH=0: CUDA events around each call.
"$PY" benchmarks/attention/torch_sdpa.py "${shape_args[@]}" --repeats "$REPEATS" --warmup "$WARMUP" \
  --graph "${GRAPH:-10}" --json "$RAW/torch.json"
OUTFILE="benchmarks/results/attention_${GPU}${SUFFIX}.md"
"$PY" benchmarks/attention/report.py --forge "$RAW/forge.json" --torch "$RAW/torch.json" \
  --command "benchmarks/attention/run.sh (REPEATS=$REPEATS WARMUP=$WARMUP BACKENDS=$BACKENDS LAYOUT=$LAYOUT)" \
  --commit "${FORGE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" > "$OUTFILE"
echo "wrote $OUTFILE"
cat "$OUTFILE"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then cp "$OUTFILE" "$OUT/"; tar -czf "$OUT/attention_raw.tgz" "$RAW"; fi
