#!/usr/bin/env bash
# The data path at scale (issue 37, item 6): a memory-mapped corpus of at least 1B tokens, built
# from the real one (scripts/corpus/) by copying its training shards COPIES times, each copy its own
# files (the page cache holds each once, as a real corpus of that size would need). Then:
#
#   1. wait: GPT-2 124M trains STEPS steps of 16 x 1024 on it with data.order = "sequential", the
#      files' pages dropped from the page cache first (posix_fadvise DONTNEED after fsync), so the
#      first pass reads from the disk; data_wait_ms per record against ms_per_step, summed.
#   2. resume: scripts/simulate-preemption.sh on the same files (SIGTERM, SIGUSR1, kill -9, in the
#      middle of the corpus's first epoch): every step's loss equals the uninterrupted run's, bit
#      for bit (run.deterministic on a GPU), so the resumed runs read the same windows in the same
#      order.
#
#   CORPUS=.corpus benchmarks/convergence/data_path.sh      # BIG (default $CORPUS/big), COPIES (7),
#                                                           # STEPS (300), FORGE, DEVICE (cuda|cpu),
#                                                           # ARGS (more overrides of the wait run)
# Writes $OUT/data_path.md (when OUT is set) and prints it.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${CORPUS:?CORPUS=<dir of scripts/corpus/ token shards> is required}"
FORGE=${FORGE:-build-gpu/forge}
[ -x "$FORGE" ] || FORGE=build/forge
BIG=${BIG:-$CORPUS/big}
COPIES=${COPIES:-7}
STEPS=${STEPS:-300}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
RAW=${RAW:-/tmp/data-path}
export NCCL_NVLS_ENABLE=0
# BIG is this script's own directory: made here with a marker; one without it (and not empty) is
# refused, so nothing that another tool wrote is overwritten or trained on.
if [ -d "$BIG" ] && [ -n "$(ls -A "$BIG")" ] && [ ! -f "$BIG/.forge-data-path" ]; then
  echo "data_path.sh: $BIG is not empty and was not made by data_path.sh; give BIG=<a new directory>" >&2
  exit 2
fi
mkdir -p "$BIG" "$RAW"
touch "$BIG/.forge-data-path"

# The corpus: COPIES copies of each training shard, written, synced and dropped from the cache.
"$PY" - "$CORPUS/gpt2/train" "$BIG" "$COPIES" <<'PY'
import glob, os, shutil, sys
src, dst, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
shards = sorted(glob.glob(os.path.join(src, "shard_*.bin")))
if not shards:
    sys.exit(f"data_path.sh: no shards in {src} (scripts/corpus/)")
total = 0
for c in range(copies):
    for s in shards:
        out = os.path.join(dst, f"shard_c{c}_{os.path.basename(s)[6:]}")
        if not os.path.exists(out) or os.path.getsize(out) != os.path.getsize(s):
            shutil.copyfile(s, out + ".tmp")  # whole or not at all: a killed copy leaves only a .tmp
            os.replace(out + ".tmp", out)
        total += os.path.getsize(out)
for f in glob.glob(os.path.join(dst, "shard_*.bin")):
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
print(f"corpus: {copies} x {len(shards)} shards, {total / 2**30:.2f} GiB (each shard's 1 KiB header included), "
      "dropped from the page cache")
PY

echo "== wait: GPT-2 124M, $STEPS steps of 16 x 1024, data.order = sequential"
"$FORGE" train configs/gpt2-124m.toml --data.source=files --data.files="$BIG/shard_*.bin" --data.order=sequential \
  --train.steps="$STEPS" --train.log_every=10 --eval.every=0 --eval.bigram_baseline=false --checkpoint.every=0 \
  --checkpoint.interval_minutes=0 --checkpoint.at_end=false --run.dir="$RAW" --run.name=wait --run.overwrite=true \
  --run.device="$DEVICE" ${ARGS:-} 2>&1 | tee "$RAW/wait.log" | grep -E "^(forge|data|done|error)|tokens" | head -20

echo "== resume: SIGTERM, SIGUSR1 and kill -9 in the middle of the first epoch"
PREEMPT_ARGS="--data.source=files --data.files=$BIG/shard_*.bin --data.order=sequential --model.vocab_size=50304"
scripts/simulate-preemption.sh --forge "$FORGE" --device "$DEVICE" --steps 400 --preemptions 3 --seed 12 \
  --args "$PREEMPT_ARGS" 2>&1 | tee "$RAW/resume.log"

"$PY" - "$RAW" "$BIG" "$STEPS" "$COPIES" <<'PY' | tee "$RAW/data_path.md"
import glob, json, os, statistics, sys
raw, big, steps, copies = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
files = sorted(glob.glob(os.path.join(big, "shard_*.bin")))
tokens = sum((os.path.getsize(f) - 1024) // 2 for f in files)
recs = [json.loads(l) for l in open(os.path.join(raw, "wait", "metrics.jsonl"))]
train = [r for r in recs if "data_wait_ms" in r]
after = [r for r in train if r["step"] > 10]  # past the first interval (start-up, CUDA graph capture)
wait = [r["data_wait_ms"] for r in after]
step = [r["ms_per_step"] for r in after]
share = sum(wait) / sum(step)
resume = open(os.path.join(raw, "resume.log")).read()
check = [l for l in open(os.path.join(raw, "wait.log")) if l.startswith("data:")]
print(f"## The data path at scale\n")
print(f"Corpus: {len(files)} memory-mapped shards, {tokens:,} GPT-2 tokens ({copies} copies of the real corpus's "
      f"training shards, each its own files), dropped from the page cache before the run. forge reads every token "
      f"once as it starts, to check the ids against the vocabulary (untrusted input):\n")
print("```\n" + "".join(check) + "```\n")
print(f"GPT-2 124M, {steps} steps of 16 x 1024, `data.order = \"sequential\"`: data wait per step after step 10 "
      f"median {statistics.median(wait):.3f} ms, max {max(wait):.3f} ms, against a step of median "
      f"{statistics.median(step):.1f} ms: **{100 * share:.3f}% of the step time** "
      f"(first interval: {train[0]['data_wait_ms']:.3f} ms per step).\n")
print("Resume in the middle of the epoch (scripts/simulate-preemption.sh, 400 steps, 3 preemptions):\n")
print("```")
print("\n".join(l for l in resume.splitlines() if l.startswith("simulate-preemption")))
print("```")
PY
[ -n "${OUT:-}" ] && cp "$RAW/data_path.md" "$OUT/" && cp "$RAW/wait/metrics.jsonl" "$OUT/data_path_wait_metrics.jsonl"
exit 0
