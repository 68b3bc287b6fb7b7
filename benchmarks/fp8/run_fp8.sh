#!/usr/bin/env bash
# FP8 training speed (issue 39): forge's bf16 step beside each FP8 recipe, and a PyTorch FP8 peer
# (torch._scaled_mm tensorwise / rowwise linears with torch.compile: benchmarks/step/torch_peer.py
# --fp8, what torchao's float8 training does), on one GPU, in one session.
#
#   FORGE=build-gpu/forge benchmarks/fp8/run_fp8.sh       # MODELS="0.85b 3.6b" STEPS=20 WARMUP=6
#
# Models: configs/llama-0.85b.toml at batch 4 x 2048 and configs/llama-3.6b.toml at 2 x 2048, random
# tokens, AdamW, bf16 (forge: run.dtype auto; the peer: f32 parameters under bf16 autocast, fused
# AdamW). forge runs RECIPES ("off tensorwise rowwise blockwise"; run.fp8_select = measured, the
# default: each linear shape timed both ways at its first use, the log lists the choices), the peer
# PEERS ("bf16 tensorwise rowwise", each under torch.compile). Figures: ms/step (mean of the timed
# steps after WARMUP) and tokens/s, benchmarks/step/report.py's lines; REPEATS alternating rounds.
# Output: RESULTS (default /tmp/forge_fp8): figures.txt and the logs; $OUT gets both.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
FORGE=${FORGE:-build-gpu/forge}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-6}
REPEATS=${REPEATS:-1}
MODELS=${MODELS:-0.85b 3.6b}
RECIPES=${RECIPES:-off tensorwise rowwise blockwise}
PEERS=${PEERS-bf16 tensorwise rowwise}
R=${RESULTS:-/tmp/forge_fp8}
PY=${PYTHON:-python3}
mkdir -p "$R/runs"
: > "$R/figures.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a "$R/figures.txt"
for rep in $(seq 1 "$REPEATS"); do
  for model in $MODELS; do
    case $model in
      0.85b) CONFIG=configs/llama-0.85b.toml; BATCH=4 ;;
      3.6b) CONFIG=configs/llama-3.6b.toml; BATCH=2 ;;
      *) echo "run_fp8.sh: MODELS: 0.85b or 3.6b, not $model" >&2; exit 2 ;;
    esac
    T=2048
    for recipe in $RECIPES; do
      name="llama${model}_${recipe}_r$rep"
      rm -rf "$R/runs/$name"
      OMP_NUM_THREADS=8 timeout "${RUN_TIMEOUT:-300}" "$FORGE" train "$CONFIG" --run.dir="$R/runs" --run.name="$name" \
        --run.overwrite=true --run.fp8="$recipe" --train.batch_size="$BATCH" --train.seq_len="$T" \
        --train.steps="$((STEPS + WARMUP))" --train.log_every=1 --schedule.warmup_steps="$WARMUP" --eval.every=0 \
        --checkpoint.at_end=false ${FORGE_ARGS:-} > "$R/$name.log" 2>&1
      rc=$?
      fig=$("$PY" benchmarks/step/report.py --line-forge "$R/runs/$name/metrics.jsonl" --warmup "$WARMUP" \
        --tokens-per-step "$((BATCH * T))" 2>/dev/null)
      echo "forge llama-$model fp8=$recipe (rc $rc): $fig" | tee -a "$R/figures.txt"
      grep -A40 "linear shapes in FP8" "$R/$name.log" | grep -E "^(fp8|  [0-9])" | head -12 >> "$R/figures.txt"
      [ $rc -eq 0 ] || tail -5 "$R/$name.log"
    done
    for peer in $PEERS; do
      name="llama${model}_peer_${peer}_r$rep"
      fp8=(); [ "$peer" != bf16 ] && fp8=(--fp8 "$peer")
      timeout "${RUN_TIMEOUT:-300}" "$PY" benchmarks/step/torch_peer.py --config "$CONFIG" --mode compile \
        --batch "$BATCH" --seq "$T" --steps "$STEPS" --warmup "$WARMUP" "${fp8[@]}" --json "$R/$name.json" \
        > "$R/$name.log" 2>&1
      rc=$?
      fig=$("$PY" benchmarks/step/report.py --line-peer "$R/$name.json" 2>/dev/null)
      echo "PyTorch compile llama-$model $peer (rc $rc): $fig" | tee -a "$R/figures.txt"
      [ $rc -eq 0 ] || tail -5 "$R/$name.log"
    done
  done
done
if [ -n "${OUT:-}" ]; then cp "$R/figures.txt" "$OUT/fp8_figures.txt"; tar -czf "$OUT/fp8_logs.tgz" -C "$R" --exclude=runs . ; fi
