#!/usr/bin/env bash
# forge sample's decoding speed (issue 18): tokens/s with and without the KV cache, for one prompt
# and for a batch of 8 prompts of one length, greedy, on the device given (default: the CPU).
#
#   benchmarks/sample/run.sh                      # CPU, GPT-2 124M shape, 64 new tokens
#   DEVICE=cuda TOKENS=256 benchmarks/sample/run.sh
#
# The model is GPT-2 124M's shape after one training step (random-like weights: the speed does not
# depend on them) on Debian's fortunes with GPT-2's own tokenizer.json (.fixtures/tokenizers,
# scripts/fetch-tokenizer-fixtures.sh): a sampled checkpoint needs its run's tokenizer. Writes
# benchmarks/results/sample_<device>.md (RESULT overrides) with the exact commands.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
FORGE="${FORGE:-$ROOT/build/forge}"
DEVICE="${DEVICE:-cpu}"
TOKENS="${TOKENS:-64}"
FORTUNES="${FORGE_FORTUNES_DIR:-/usr/share/games/fortunes}"
WORK="$(mktemp -d /tmp/forge_sample_bench.XXXXXX)"
TOK=.fixtures/tokenizers/gpt2/tokenizer.json
[[ -f "$TOK" ]] || { echo "run.sh: $TOK missing: scripts/fetch-tokenizer-fixtures.sh"; exit 2; }
TRAIN=("$FORGE" train configs/gpt2-124m.toml --run.dir="$WORK" --run.name=s --run.device="$DEVICE" --train.steps=1
       --train.batch_size=1 --train.seq_len=64 --eval.every=0 --data.source=files --data.files="$FORTUNES"
       '--data.exclude=["*.dat","*.u8"]' --data.tokenizer="$TOK")
"${TRAIN[@]}" > "$WORK/train.log" 2>&1 || { tail -5 "$WORK/train.log"; exit 1; }
if [[ "$DEVICE" == cpu ]]; then
  NAME="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | sed -n 1p), $(nproc) threads"
else
  NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | sed -n 1p)"
fi
SLUG="$(echo "$NAME" | sed 's/,.*//; s/[^A-Za-z0-9]\+/_/g; s/_$//')"
RESULT="${RESULT:-benchmarks/results/sample_${SLUG}.md}"
# The peer, where Python has transformers (the GPU machine): generate() on forge's export of the
# same checkpoint, the same prompts and greedy decoding, tuned as transformers documents it (issue
# 41): bf16, a static KV cache and torch.compile (reduce-overhead) on a GPU (PEER_ARGS, PEER_DTYPE
# change it: PEER_DTYPE=f32 PEER_ARGS="--dtype f32 --cache dynamic --no-compile" is the plain one).
PY="${PY:-python3}"
PEER=""
if [[ "${HF_PEER:-1}" == 1 ]] && "$PY" -c "import transformers, torch" 2>/dev/null; then
  "$FORGE" export --checkpoint "$WORK/s" --out "$WORK/hf" --dtype "${PEER_DTYPE:-bf16}" > "$WORK/export.log" 2>&1 && PEER=1
fi
rows=()
for cache in "" --no-kv-cache; do
  for n in 1 8; do
    P=(); for ((k = 0; k < n; ++k)); do P+=(--prompt "The"); done
    CMD=("$FORGE" sample --checkpoint "$WORK/s" --device "$DEVICE" "${P[@]}" --tokens "$TOKENS" --temperature 0 --json $cache)
    "${CMD[@]}" 2> "$WORK/err.log" > "$WORK/out.json" || { tail -3 "$WORK/err.log"; exit 1; }
    rate=$(python3 -c "import json; print(round(json.load(open('$WORK/out.json'))['tokens_per_s'], 1))")
    steady=$(python3 -c "import json; print(round(json.load(open('$WORK/out.json'))['decode_tokens_per_s'], 1))")
    first=$(python3 -c "import json; print(round(json.load(open('$WORK/out.json'))['first_token_seconds'], 3))")
    label="KV cache"; [[ -n "$cache" ]] && label="whole window (--no-kv-cache)"
    peer="not run"
    if [[ -n "$PEER" ]]; then
      tuned=(--dtype "${PEER_DTYPE:-bf16}"); [[ "$DEVICE" == cpu ]] && tuned+=(--cache dynamic --no-compile)
      # shellcheck disable=SC2206  # PEER_ARGS: words to add
      tuned+=(${PEER_ARGS:-})
      if "$PY" benchmarks/sample/hf_generate.py "$WORK/hf" --prompts $n --tokens "$TOKENS" --device "$DEVICE" $cache \
           "${tuned[@]}" > "$WORK/peer.json" 2> "$WORK/peer.log"; then
        peer=$(python3 -c "import json; print(round(json.load(open('$WORK/peer.json'))['decode_tokens_per_s'], 1))")
        same=$(python3 -c "import json; f=json.load(open('$WORK/out.json')); p=json.load(open('$WORK/peer.json'))
print('same' if f['samples'][0]['completion'] == p['completion'] else 'different')" 2>/dev/null || echo "?")
        peer="$peer ($same tokens, $(python3 -c "print(round($steady / $peer, 2))")x)"
      else
        peer="failed: $(tail -1 "$WORK/peer.log")"
      fi
    fi
    rows+=("| $label | $n | $TOKENS | $rate | $first | $steady | $peer |")
    echo "kv_cache=${cache:-on} prompts=$n: $rate tok/s (first token $first s, then $steady tok/s); transformers generate: $peer"
  done
done
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
{
  echo "# forge sample: tokens/s with and without the KV cache ($NAME)"
  echo
  echo "- Device: $DEVICE ($NAME); forge commit $commit; $(date -u +%Y-%m-%d\ %H:%M) UTC"
  echo "- Command: \`DEVICE=$DEVICE TOKENS=$TOKENS benchmarks/sample/run.sh\`"
  echo "- Model: GPT-2 124M's shape (configs/gpt2-124m.toml) after one step, GPT-2's tokenizer.json;"
  echo "  greedy (temperature 0), prompt \"The\" (1 token), $TOKENS new tokens per prompt; tokens/s counts every"
  echo "  row's new tokens over the decode time (forge sample's own figure)"
  echo
  tv=$("$PY" -c "import transformers; print(transformers.__version__)" 2>/dev/null || echo "(absent here)")
  echo "- Peer: transformers $tv \`generate()\` on \`forge export\` of the same"
  echo "  checkpoint (${PEER_DTYPE:-bf16}; on a GPU a static KV cache and torch.compile, mode reduce-overhead, unless"
  echo "  PEER_ARGS says otherwise: ${PEER_ARGS:-none}; greedy, use_cache as the row says;"
  echo "  benchmarks/sample/hf_generate.py), untimed warm-up calls; 'same' compares the first row's new text with"
  echo "  forge's; both sides' figure is the rate after the first token (the peer's: a generate() of one token"
  echo "  timed apart and subtracted), forge / it their ratio"
  echo
  echo "| decoding | prompts | new tokens each | forge tokens/s | forge first token (s) | forge tokens/s after it | transformers tokens/s (forge / it) |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
} > "$RESULT"
echo "wrote $RESULT"
rm -rf "$WORK"
