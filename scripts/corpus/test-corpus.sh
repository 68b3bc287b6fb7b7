#!/usr/bin/env bash
# The corpus script on a small slice (a ctest, tests/CMakeLists.txt: corpus_slice; docs/corpus.md):
# every step of a build (apt-get download, extract, convert, deduplicate, split, shuffle, jsonl,
# forge tokenize with GPT-2's and LLaMA-3's tokenizers, manifest, check) on about 4 MB of
# manpages and libc6-dev; then a second build from the same .debs must give identical files
# (reproducible), pack -> unpack -> re-tokenize must give them again, and a corrupted shard or
# text file must fail the check. Needs the network (Debian's mirror) and the tokenizer fixtures
# (scripts/fetch-tokenizer-fixtures.sh, which `make test` runs). With TORCH_PYTHON (a Python with
# torch), the convergence benchmark's scripts then run on the slice (benchmarks/convergence/run.sh
# SMOKE=1, a tiny model on the CPU, in two calls of its stages): forge and PyTorch in f32 must meet
# every bound of the report.
#   [TORCH_PYTHON=python3] scripts/corpus/test-corpus.sh FORGE_BINARY [SLICE_MB]
set -euo pipefail
FORGE=${1:?usage: test-corpus.sh FORGE_BINARY [SLICE_MB]}
SLICE=${2:-4}
B="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/build-corpus.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "test-corpus: FAILED: $*" >&2; exit 1; }
t0=$(date +%s)

bash "$B" --slice "$SLICE" --out "$T/a" --forge "$FORGE"
bash "$B" --slice "$SLICE" --out "$T/b" --forge "$FORGE" --cache "$T/a/debs"
bash "$B" --check "$T/b" --compare "$T/a"
cmp "$T/a/manifest.json" "$T/b/manifest.json" || fail "two builds of the same packages wrote different manifests"

# Transport: parts of 1 MiB (several), verified, reassembled and re-tokenized: the same shards.
bash "$B" --pack "$T/a" --pack-dir "$T/pack" --part-size 1M
[ "$(ls "$T/pack"/corpus.tar.xz.part-* | wc -l)" -ge 2 ] || fail "expected several pack parts"
bash "$B" --unpack "$T/pack" --out "$T/c" --forge "$FORGE"
cmp "$T/a/manifest.json" "$T/c/manifest.json" || fail "the unpacked corpus's manifest differs"

# The check must catch damage (and say what): one byte of a shard, then one of the text.
expect_failure() {  # expect_failure MESSAGE COMMAND...: the command must fail, printing MESSAGE
  local msg=$1; shift
  if "$@" > "$T/out.txt" 2>&1; then fail "passed, but should have failed: $*"; fi
  grep -qF -- "$msg" "$T/out.txt" || { cat "$T/out.txt" >&2; fail "failed without saying '$msg': $*"; }
}
cp -r "$T/c" "$T/d"
printf 'x' | dd of="$T/d/gpt2/train/shard_00000.bin" bs=1 seek=1000 conv=notrunc status=none
expect_failure "gpt2/train/shard_00000.bin: size or SHA-256 differs" bash "$B" --check "$T/d"
printf 'x' | dd of="$T/c/text/val.jsonl" bs=1 seek=100 conv=notrunc status=none
expect_failure "text/val.jsonl: size or SHA-256 differs" bash "$B" --check "$T/c"
# A damaged part must be refused before anything is unpacked.
printf 'x' | dd of="$T/pack/corpus.tar.xz.part-000" bs=1 seek=10 conv=notrunc status=none
expect_failure "missing or corrupt" bash "$B" --unpack "$T/pack" --out "$T/e" --forge "$FORGE"
[ ! -e "$T/e" ] || fail "a corrupt pack was unpacked into $T/e"

if [ -n "${TORCH_PYTHON:-}" ]; then
  R="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/benchmarks/convergence/run.sh"
  for model in gpt2 llama; do
    for stages in "init forge" "ref report"; do
      SMOKE=1 MODEL=$model STAGES=$stages CORPUS="$T/a" FORGE="$FORGE" PYTHON="$TORCH_PYTHON" RAW="$T/conv_$model" \
        OUT="" bash "$R" > "$T/conv.log" 2>&1 ||
        { cat "$T/conv.log" >&2; fail "benchmarks/convergence/run.sh (MODEL=$model STAGES=$stages) failed"; }
    done
    "$TORCH_PYTHON" - "$T/conv_$model/summary_eager.json" "$model" <<'PY' || fail "the convergence report's bounds ($model)"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["bounds_met"] and abs(s["final_rel"]) < 1e-4, s
print(f"test-corpus: convergence smoke ({sys.argv[2]}): final validation loss {s['final_rel']:+.2e} relative, bounds met")
PY
    # The A/B table (benchmarks/convergence/ab_windows.py): the same f32 run on both sides parts by
    # nothing in any window.
    "$TORCH_PYTHON" "$(dirname "$R")/ab_windows.py" --run "forge=$T/conv_$model/forge/metrics.jsonl" \
      --ref "PyTorch=$T/conv_$model/ref_eager.jsonl" --window 5 --after 5 > "$T/ab.md" ||
      fail "ab_windows.py on the smoke runs ($model)"
    grep -Eq '^\| mean after step 5 \| \*\*[+-]0\.00[0-9]\*\*' "$T/ab.md" ||
      { cat "$T/ab.md" >&2; fail "ab_windows.py: forge and PyTorch in f32 differ by 0.01% or more ($model)"; }
  done
fi

echo "test-corpus: passed in $(( $(date +%s) - t0 )) s"
