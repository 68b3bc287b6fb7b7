#!/usr/bin/env bash
# The training stall of a checkpoint, forge synchronous against asynchronous (checkpoint.async),
# beside PyTorch DCP's save and async_save on the same state, on one GPU (issue 35; docs/train.md,
# "Long runs"). For each model: the GPU's pinned device-to-host bandwidth (forge bench memory),
# then a forge training run that checkpoints every EVERY steps, synchronously and asynchronously,
# then benchmarks/checkpoint/dcp_peer.py on the state forge holds for that model. Raw logs and
# metrics go to $OUT/checkpoint; benchmarks/checkpoint/report.py writes the results file.
#
#   MODELS="0.85b 3.6b" GPU=0 benchmarks/checkpoint/run.sh        # after BUILD_ONLY=1 scripts/gpu-check.sh
#
# Disk: a checkpoint of the 3.6B model is 50 GB, and one being replaced (keep_last = 1) needs room
# for two. Where CK_DIR has less than 2.2 checkpoints free, a watcher removes each checkpoint as
# soon as it is complete (nothing reads them), so the disk holds one at a time; the log says so.
# The stall figures: `stall_s` (what training waited) and, apart, `wait_previous_s` (a previous
# write still going: checkpoints here are a minute apart, a real run's half an hour).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
FORGE=${FORGE:-$ROOT/build-gpu/forge}
R=${OUT:-/tmp/forge_ckpt_out}/checkpoint
CK=${CK_DIR:-/tmp/forge_ckpt_runs}
MODELS=${MODELS:-"0.85b 3.6b"}
REPEATS=${REPEATS:-3}
export CUDA_VISIBLE_DEVICES=${GPU:-0} NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] && export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$R" "$CK"
say() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$R/run.log"; }
say "start: $(nvidia-smi --query-gpu=name --format=csv,noheader -i "${GPU:-0}"), $(df -h "$CK" | tail -1 | awk '{print $4}') free in $CK"
"$FORGE" bench memory --device cuda:0 --no-peer --json > "$R/bench_memory.json" 2> "$R/bench_memory.err"
say "bench memory rc=$?"

for m in $MODELS; do
  case $m in
    0.85b) CFG=(configs/llama-0.85b.toml --train.batch_size=4); SHAPE=(--dim 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 5632 --vocab 32000); EVERY=${EVERY_085:-60} ;;
    3.6b) CFG=(configs/llama-3.6b.toml --train.batch_size=2); SHAPE=(--dim 3072 --layers 28 --heads 24 --kv-heads 8 --ffn 8192 --vocab 128256); EVERY=${EVERY_36:-120} ;;
    *) say "unknown model $m"; continue ;;
  esac
  STEPS=$((EVERY * REPEATS + 5))
  case $m in 0.85b) STATE_GB=12 ;; 3.6b) STATE_GB=51 ;; esac
  FREE_GB=$(df -BG --output=avail "$CK" | tail -1 | tr -dc 0-9)
  for mode in ${FORGE_MODES:-async sync}; do
    rm -rf "${CK:?}"/*
    WATCH=""
    if (( FREE_GB * 10 < STATE_GB * 22 )); then
      # Each complete checkpoint removed at once (manifest.json is written last), so one fits.
      ( while :; do for d in "$CK/$m"/checkpoints/step_*; do [[ -f $d/manifest.json ]] && rm -rf "$d"; done; sleep 0.2; done ) &
      WATCH=$!
      say "$m: $FREE_GB GB free for ${STATE_GB} GB checkpoints: each is removed once complete"
    fi
    say "$m forge $mode: $STEPS steps, a checkpoint every $EVERY"
    timeout "${RUN_TIMEOUT:-560}" "$FORGE" train "${CFG[@]}" --run.dir="$CK" --run.name="$m" --train.steps="$STEPS" \
      --train.log_every=10 --eval.every=0 --checkpoint.every="$EVERY" --checkpoint.keep_last=1 \
      --checkpoint.at_end=false --checkpoint.async=$([[ $mode == async ]] && echo true || echo false) \
      > "$R/${m}_forge_$mode.log" 2>&1
    say "$m forge $mode rc=$?; $(grep -c '"stall_s"' "$CK/$m/metrics.jsonl" 2>/dev/null) checkpoints"
    [[ -n $WATCH ]] && kill "$WATCH" 2>/dev/null
    cp "$CK/$m/metrics.jsonl" "$R/${m}_forge_$mode.metrics.jsonl" 2>/dev/null
  done
  rm -rf "${CK:?}"/*
  [[ ${DCP:-1} == 1 ]] || continue
  say "$m dcp"
  timeout "${RUN_TIMEOUT:-560}" python3 benchmarks/checkpoint/dcp_peer.py "${SHAPE[@]}" --dir "$CK/dcp" --repeats "$REPEATS" \
    --json "$R/${m}_dcp.json" > "$R/${m}_dcp.log" 2>&1
  say "$m dcp rc=$?"
  rm -rf "${CK:?}"/*
done
say ALL_DONE
