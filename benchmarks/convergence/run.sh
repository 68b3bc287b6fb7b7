#!/usr/bin/env bash
# forge beside PyTorch on a real corpus, for thousands of steps (issue 37; README.md here).
#
#   CORPUS=/data/corpus benchmarks/convergence/run.sh            # GPT-2 124M, 5000 steps
#   MODEL=llama CORPUS=... benchmarks/convergence/run.sh         # LLaMA 0.85B, 2000 steps
#
# CORPUS holds the token shards of scripts/corpus/ (CORPUS/<tokenizer>/{train,val}/shard_*.bin).
# Steps: the initial weights (init_weights.py: the PyTorch peer's model, seeded, saved for both
# sides), forge train from them (model.init_from) with data.order = sequential and data.val_files,
# the PyTorch reference (reference.py, torch.compile) on the same shards in the same order, then
# report.py: the curves side by side, the bounds, time to the reference's final validation loss.
# Raw files go to RAW (default /tmp/convergence-<model>); the section and the plot to
# benchmarks/results/ (and $OUT when set: the GPU tool brings those back).
#
# Variables: FORGE_EXTRA (more forge overrides), STAGES (default "init forge ref report": a GPU call of at most 10 minutes can run them
# apart, the later ones reading RAW), MODEL (gpt2 | llama), STEPS, BATCH, SEQ, WARMUP, EVAL_EVERY, EVAL_BATCHES, FORGE
# (default build-gpu/forge), RAW, PEERS ("compile", or "eager compile"; MODE:PARAMS passes
# reference.py --params, e.g. "compile compile:bf16 compile:bf16-grid"), SMOKE=1 (a tiny model on
# the CPU: the scripts' own check, no figures).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-gpt2}
: "${CORPUS:?CORPUS=<dir of scripts/corpus/ token shards> is required}"
FORGE=${FORGE:-build-gpu/forge}
[ -x "$FORGE" ] || FORGE=build/forge
SMOKE=${SMOKE:-0}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
case $MODEL in
  gpt2)  CONFIG=configs/gpt2-124m.toml;  TOK=gpt2;   STEPS=${STEPS:-5000}; BATCH=${BATCH:-16}; SEQ=${SEQ:-1024}
         TITLE="GPT-2 124M" ;;
  llama) CONFIG=configs/llama-0.85b.toml; TOK=${LLAMA_TOK:-llama3}; STEPS=${STEPS:-2000}; BATCH=${BATCH:-4}
         SEQ=${SEQ:-2048}; TITLE="LLaMA 0.85B" ;;
  *) echo "convergence/run.sh: MODEL=$MODEL: use gpt2 or llama" >&2; exit 2 ;;
esac
if [ "$SMOKE" = 1 ]; then STEPS=${SMOKE_STEPS:-20}; BATCH=4; SEQ=32; WARMUP=${WARMUP:-5}; EVAL_EVERY=${EVAL_EVERY:-10}; fi
WARMUP=${WARMUP:-250}
EVAL_EVERY=${EVAL_EVERY:-250}
EVAL_BATCHES=${EVAL_BATCHES:-40}
PEERS=${PEERS:-compile}
[ "$SMOKE" = 1 ] && PEERS=${SMOKE_PEERS:-eager}  # (old CPU PyTorch builds have no torch.compile)
RAW=${RAW:-/tmp/convergence-$MODEL}
TRAIN_GLOB="$CORPUS/$TOK/train/shard_*.bin"
VAL_GLOB="$CORPUS/$TOK/val/shard_*.bin"
TOKFILE=${TOKFILE:-.fixtures/tokenizers/$TOK/tokenizer.json}
compgen -G "$TRAIN_GLOB" >/dev/null || { echo "convergence/run.sh: no shards at $TRAIN_GLOB (scripts/corpus/)" >&2; exit 1; }
compgen -G "$VAL_GLOB" >/dev/null || { echo "convergence/run.sh: no shards at $VAL_GLOB (scripts/corpus/)" >&2; exit 1; }
mkdir -p "$RAW"

# The vocabulary: the tokenizer's, padded to a multiple of 64 for GPT-2 (the tuned configs' 50304).
VOCAB=$("$PY" -c "
import json,sys
t=json.load(open('$TOKFILE'))
ids=[v for v in t['model']['vocab'].values()]+[a['id'] for a in t.get('added_tokens',[])]
n=max(ids)+1
print((n+63)//64*64 if '$MODEL'=='gpt2' else n)")
SIZE=()
DEVICE_ARGS=()
if [ "$SMOKE" = 1 ]; then  # a tiny model on the CPU: the pipeline's check, not a measurement
  SIZE=(--tiny)
  DEVICE_ARGS=(--device cpu)
  EVAL_BATCHES=4
fi

STAGES=${STAGES:-init forge ref report}
has_stage() { [[ " $STAGES " == *" $1 "* ]]; }
for s in $STAGES; do
  case $s in init|forge|ref|report) ;; *) echo "convergence/run.sh: STAGES: unknown stage '$s' (init forge ref report)" >&2; exit 2 ;; esac
done

if has_stage init; then
echo "== initial weights ($TITLE, vocabulary $VOCAB)"
"$PY" benchmarks/convergence/init_weights.py --config "$CONFIG" --out "$RAW/init" --tokenizer "$TOKFILE" \
  --vocab_size "$VOCAB" "${SIZE[@]}"
fi
[ -d "$RAW/init" ] || { echo "convergence/run.sh: no initial weights at $RAW/init: run the init stage first" >&2; exit 1; }

has_stage forge && echo "== forge"
FORGE_ARGS=(--model.init_from="$RAW/init" --model.vocab_size="$VOCAB" --data.source=files --data.files="$TRAIN_GLOB" --data.val_files="$VAL_GLOB"
  --data.order=sequential --train.steps="$STEPS" --train.batch_size="$BATCH" --train.seq_len="$SEQ"
  --train.log_every=1 --schedule.warmup_steps="$WARMUP" --eval.every="$EVAL_EVERY" --eval.batches="$EVAL_BATCHES"
  --eval.bigram_baseline=false --checkpoint.every=0 --checkpoint.interval_minutes=0 --checkpoint.at_end=false
  --run.dir="$RAW" --run.name=forge --run.overwrite=true)
if [ "$SMOKE" = 1 ]; then  # init_weights.py --tiny's shape
  FORGE_ARGS+=(--run.device=cpu --model.n_layer=2 --model.n_head=4 --model.block_size=64)
  if [ "$MODEL" = gpt2 ]; then FORGE_ARGS+=(--model.n_embd=64); else
    FORGE_ARGS+=(--model.dim=64 --model.n_kv_head=2 --model.ffn_hidden=160); fi
fi
# FORGE_EXTRA: more overrides (e.g. --debug.masters_from_rounded=true for an A/B run in another RAW).
read -r -a EXTRA_ARGS <<< "${FORGE_EXTRA:-}"
FORGE_ARGS+=("${EXTRA_ARGS[@]}")
if has_stage forge; then
"$FORGE" train "$CONFIG" "${FORGE_ARGS[@]}" 2>&1 | tee "$RAW/forge.log" | grep -E "^(step|eval|val|done|forge)" | \
  awk 'NR % 20 == 1 || /eval|done|error/'
fi

tag_of() { echo "${1/:/_}"; }  # compile:bf16 -> compile_bf16 (file names)
has_stage ref && for peer in $PEERS; do
  mode=${peer%%:*}; params=f32; [[ $peer == *:* ]] && params=${peer#*:}
  echo "== PyTorch ($mode, $params parameters)"
  "$PY" benchmarks/convergence/reference.py --config "$CONFIG" --init "$RAW/init" --train "$TRAIN_GLOB" \
    --val "$VAL_GLOB" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --warmup "$WARMUP" --eval-every "$EVAL_EVERY" \
    --eval-batches "$EVAL_BATCHES" --mode "$mode" --params "$params" --out "$RAW/ref_$(tag_of "$peer").jsonl" \
    "${DEVICE_ARGS[@]}"
done

has_stage report || exit 0
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '_' || true)
GPU=${GPU:-cpu}
SECTION="$RAW/convergence_${MODEL}.md"
for peer in $PEERS; do
  tag=$(tag_of "$peer")
  "$PY" benchmarks/convergence/report.py --forge "$RAW/forge/metrics.jsonl" --ref "$RAW/ref_$tag.jsonl" \
    --title "$TITLE, $STEPS steps of $BATCH x $SEQ (PyTorch: $peer)" --out "$RAW/section_$tag.md" \
    --svg "$RAW/convergence_${MODEL}_${tag}.svg" --json "$RAW/summary_$tag.json"
done
cat "$RAW"/section_*.md > "$SECTION"
if [ "$SMOKE" != 1 ]; then
  mkdir -p benchmarks/results
  cp "$RAW"/convergence_"${MODEL}"_*.svg benchmarks/results/ 2>/dev/null || true
  if [ -n "${OUT:-}" ]; then
    cp "$SECTION" "$RAW"/convergence_"${MODEL}"_*.svg "$RAW"/summary_*.json "$OUT"/ 2>/dev/null || true
    tar -czf "$OUT/convergence_${MODEL}_raw.tar.gz" -C "$RAW" forge/metrics.jsonl forge.log $(cd "$RAW" && ls ref_*.jsonl)
  fi
fi
echo "== $SECTION ($GPU)"
cat "$SECTION"
