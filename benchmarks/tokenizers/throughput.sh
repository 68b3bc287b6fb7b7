#!/usr/bin/env bash
# Encoding throughput of `forge tokenize encode` per tokenizer file (issue 18), end to end (reading
# JSON Lines, encoding, writing shards), on THREADS cores (default 1: MB/s per core), over Debian's
# fortunes as JSON Lines (one fortune per line, three times: ~8.5 MB, ~7.6 MB of text). The load
# time is measured on a one-line file and subtracted. Writes benchmarks/results/tokenize_<cpu>.md.
#
#   benchmarks/tokenizers/throughput.sh            # needs .fixtures/tokenizers (scripts/fetch-tokenizer-fixtures.sh)
#   THREADS=2 benchmarks/tokenizers/throughput.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
FORGE="${FORGE:-$ROOT/build/forge}"
THREADS="${THREADS:-1}"
FX=.fixtures/tokenizers
FORTUNES="${FORGE_FORTUNES_DIR:-/usr/share/games/fortunes}"
WORK="$(mktemp -d /tmp/forge_tok_bench.XXXXXX)"
python3 - "$FORTUNES" "$WORK/corpus.jsonl" "$WORK/one.jsonl" <<'PY'
import json, os, sys
src, out, one = sys.argv[1:4]
texts = []
for name in sorted(os.listdir(src)):
    p = os.path.join(src, name)
    if name.endswith((".dat", ".u8")) or not os.path.isfile(p):
        continue
    texts += [t.strip() for t in open(p, encoding="utf-8", errors="replace").read().split("\n%\n") if t.strip()]
with open(out, "w") as f:
    for _ in range(3):
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
open(one, "w").write(json.dumps({"text": "hello"}) + "\n")
PY
bytes=$(python3 -c "import json; print(sum(len(json.loads(l)['text'].encode()) for l in open('$WORK/corpus.jsonl')))")
size=$(stat -c %s "$WORK/corpus.jsonl")
NAME="$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | sed -n 1p)"
SLUG="$(echo "$NAME" | sed 's/[^A-Za-z0-9]\+/_/g; s/_$//')"
RESULT="${RESULT:-benchmarks/results/tokenize_${SLUG}.md}"
secs() { local t0 t1; t0=$(date +%s.%N); OMP_NUM_THREADS=$THREADS "$FORGE" tokenize encode --tokenizer "$1" --out "$WORK/out" "$2" > /dev/null 2>&1; t1=$(date +%s.%N); rm -rf "$WORK/out"; python3 -c "print($t1 - $t0)"; }
rows=()
for tok in gpt2/tokenizer.json llama2/tokenizer.json llama3/tokenizer.json qwen2_5/tokenizer.json \
           cl100k_base.tiktoken o200k_base.tiktoken llama2-model/tokenizer.model; do
  [[ -f "$FX/$tok" ]] || { echo "missing $FX/$tok"; continue; }
  load=$(secs "$FX/$tok" "$WORK/one.jsonl")
  all=$(secs "$FX/$tok" "$WORK/corpus.jsonl")
  rate=$(python3 -c "print(f'{$bytes / max($all - $load, 1e-9) / 1e6:.1f}')")
  rows+=("| \`$tok\` | $(printf %.2f "$load") s | $(printf %.2f "$all") s | $rate MB/s |")
  echo "$tok: load $load s, total $all s, $rate MB/s"
done
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
{
  echo "# forge tokenize encode: throughput per tokenizer file ($NAME, $THREADS thread(s))"
  echo
  echo "- Command: \`THREADS=$THREADS benchmarks/tokenizers/throughput.sh\`; forge commit $commit; $(date -u +%Y-%m-%d\ %H:%M) UTC"
  echo "- Input: Debian's fortunes as JSON Lines, three times over: $size bytes of JSON Lines, $bytes bytes of text;"
  echo "  end to end (read, encode, write shards); MB/s = text bytes / (total - load), load measured on a one-line file"
  echo "- Machine: $(nproc) cores available, shared (timings vary by about 20%)"
  echo
  echo "| tokenizer file | load | total | encoding |"
  echo "|---|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} > "$RESULT"
echo "wrote $RESULT"
rm -rf "$WORK"
