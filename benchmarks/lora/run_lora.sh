#!/usr/bin/env bash
# LoRA fine-tuning speed and memory (issue 40): forge against PEFT + transformers (eager and
# torch.compile) on one GPU, the same LLaMA-3.2-1B-shaped model (untied head on both sides: forge's
# LLaMA has its own), batch BATCH x T tokens, LoRA r 16 / alpha 32 on q, k, v, o, gate, up, down, the
# base frozen in bf16, AdamW over the adapters; random tokens.
#
#   FORGE=build-gpu/forge benchmarks/lora/run_lora.sh          # BATCH=4 T=2048 STEPS=20 WARMUP=5
#   (FORGE_ARGS: more forge train arguments; PEERS="": forge alone, PEERS=compile: that peer only)
#
# forge: configs/llama-0.85b.toml reshaped (ffn 8192, vocabulary 128256, rope theta 500000), run.dtype
# auto (bf16), its defaults otherwise; figures: the mean ms/step after WARMUP (benchmarks/step/
# report.py --line-forge), peak = live tensors (metrics.jsonl mem_bytes). PEFT: benchmarks/lora/
# peft_peer.py, max_memory_allocated. Output: RESULTS (default /tmp/forge_lora): figures.txt, logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
FORGE=${FORGE:-build-gpu/forge}
BATCH=${BATCH:-4}
T=${T:-2048}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
R=${RESULTS:-/tmp/forge_lora}
PY=${PYTHON:-python3}
rm -rf "$R/runs/lora"  # (a run that fails to start must not report an earlier run's metrics)
mkdir -p "$R/runs"
: > "$R/figures.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee -a "$R/figures.txt"
timeout "${RUN_TIMEOUT:-300}" "$FORGE" train configs/llama-0.85b.toml --run.dir="$R/runs" --run.name=lora \
  --run.overwrite=true --model.ffn_hidden=8192 --model.vocab_size=128256 --model.rope_theta=500000 \
  --lora.targets=q,k,v,o,gate,up,down --lora.rank=16 --lora.alpha=32 --optim.lr=1e-4 --optim.weight_decay=0 \
  --train.batch_size="$BATCH" --train.seq_len="$T" --train.steps="$((STEPS + WARMUP))" --train.log_every=1 \
  --eval.every=0 --checkpoint.at_end=false ${FORGE_ARGS:-} > "$R/lora.forge.log" 2>&1
rc=$?
fig=$("$PY" benchmarks/step/report.py --line-forge "$R/runs/lora/metrics.jsonl" --warmup "$WARMUP" --tokens-per-step "$((BATCH * T))")
echo "forge LoRA (rc $rc): $fig; $(grep -m1 '^lora:' "$R/lora.forge.log")" | tee -a "$R/figures.txt"
[ $rc -eq 0 ] || tail -5 "$R/lora.forge.log"
for mode in ${PEERS-eager compile}; do
  timeout "${RUN_TIMEOUT:-300}" "$PY" benchmarks/lora/peft_peer.py --mode $mode --batch "$BATCH" --seq "$T" \
    --steps "$STEPS" --warmup "$WARMUP" --json "$R/peft_$mode.json" > "$R/peft_$mode.log" 2>&1
  rc=$?
  fig=$("$PY" benchmarks/step/report.py --line-peer "$R/peft_$mode.json")
  echo "PEFT $mode (rc $rc): $fig" | tee -a "$R/figures.txt"
  [ $rc -eq 0 ] || tail -5 "$R/peft_$mode.log"
done
if [ -n "${OUT:-}" ]; then cp "$R/figures.txt" "$OUT/lora_figures.txt"; tar -czf "$OUT/lora_logs.tgz" -C "$R" --exclude=runs . ; fi
