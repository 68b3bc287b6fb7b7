#!/usr/bin/env bash
# The training-step benchmark of DESIGN.md (Performance): forge beside PyTorch eager and
# torch.compile on the four reference workloads, in one command on the GPU machine.
#
#   benchmarks/step/run.sh                               # all four rows, STEPS=90 WARMUP=10
#   ROWS="1 3" PROFILE_ROWS=3 benchmarks/step/run.sh     # some rows
#
# Rows (bf16, AdamW, random tokens, clipping at 1.0; method: benchmarks/step/README.md):
#   1  GPT-2 124M (configs/gpt2-124m.toml), batch 16 x 1024, 1 GPU
#   2  the same, batch 32
#   3  LLaMA 0.85B (configs/llama-0.85b.toml), batch 4 x 2048, 1 GPU
#   4  GPT-2 124M, DDP on 2 GPUs, 16 per GPU: `forge launch --nproc-per-node 2` beside PyTorch DDP
#      (eager, and DDP + torch.compile) under torchrun --nproc-per-node 2 (skipped, saying so, on 1 GPU)
# Each row: forge, then PyTorch eager, then PyTorch compile (benchmarks/step/torch_peer.py reading the
# same config), STEPS timed steps after WARMUP untimed ones, each run a fresh process. Then a
# per-kernel breakdown of forge's step in PROFILE_ROWS (a separate short run under a kernel tracer),
# and of torch.compile's beside it while the time budget allows.
#
# Writes benchmarks/results/step_<gpu>.md (report.py) and the raw logs, metrics and traces under
# benchmarks/results/raw/step_<gpu>/ (emptied first); with $OUT set (the GPU tool), also copies the
# results file and step_<gpu>_raw.tar.gz there. The report is rewritten after every row, so a run cut
# short still leaves the rows it finished.
#
# Variables (defaults):
#   ROWS="1 2 3 4"   STEPS=90   WARMUP=10   (90: several of the power cap's ~1 s clock swings a run)
#   REPEATS=3                runs of forge and of torch.compile per row, alternating which goes first
#                            (eager runs once); the headline is the median of the repeats' ratios
#   PROFILE_ROWS="1 3"       rows whose forge step is broken down by kernel (single-GPU rows)
#   PROFILER=auto            auto | nsys | ktrace | ncu | none (auto: nsys if on the PATH, else ktrace,
#                            a CUPTI tracer built here from benchmarks/step/ktrace.cpp, else ncu)
#   PROFILE_PEER=1           also trace torch.compile's step in PROFILE_ROWS (nsys/ktrace only)
#   TIME_BUDGET=480          seconds; past it the optional phases (profiles) are skipped
#   BUILD=auto               auto: build forge (incremental) first; 0: use build-gpu/forge as it is
#   BUILD_DIR=build-gpu  PYTHON=<python with CUDA torch>  FORGE_COMMIT=<when the tree has no .git>
#   RAW_DIR, RESULT_FILE     where the raw files and the report go (defaults above; outside the tree
#                            when a detached run outlives the GPU tool's call, scripts/gpu-dist-runs.sh)
#   PEAK_TFLOPS=<override the dense bf16 peak used for MFU>
#   SAMPLE_POWER=1           sample power, SM clock and utilisation of the row's (first) GPU every
#                            100 ms during every run (nvidia-smi): row<N>_<run>_power.csv, reported
#                            for the timed steps of each side (report.py); 0: none
#   FORGE_ARGS, PEER_ARGS    words added to every forge train / torch_peer.py command (a diagnostic
#                            or a smoke test of this script: they change the workload, so the
#                            results file names them)
# Wall time (measured 2026-11-27, H100s, forge already built): rows 1-3 with row 1 profiled, 4.4
# minutes on one GPU; row 4 alone, 1.6 minutes on two; most of it torch.compile's compilations of
# about a minute each; README.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
ROWS="${ROWS:-1 2 3 4}"
STEPS="${STEPS:-90}"
REPEATS="${REPEATS:-3}"  # runs of forge and of torch.compile per row (eager: one)
WARMUP="${WARMUP:-10}"
PROFILE_ROWS="${PROFILE_ROWS-1 3}"
PROFILER="${PROFILER:-auto}"
PROFILE_PEER="${PROFILE_PEER:-1}"
TIME_BUDGET="${TIME_BUDGET:-480}"
BUILD="${BUILD:-auto}"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
SAMPLE_POWER="${SAMPLE_POWER:-1}"
# NVLink multicast stays off for every NCCL process (forge's and torchrun's): a program that
# uses it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
COMMAND="benchmarks/step/run.sh (ROWS=\"$ROWS\" STEPS=$STEPS WARMUP=$WARMUP PROFILE_ROWS=\"$PROFILE_ROWS\" PROFILER=$PROFILER${FORGE_ARGS:+ FORGE_ARGS=\"$FORGE_ARGS\"}${PEER_ARGS:+ PEER_ARGS=\"$PEER_ARGS\"})"
SECONDS=0

say() { printf '[%2d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
[[ "$STEPS" -ge 1 && "$WARMUP" -ge 1 ]] || { echo "run.sh: STEPS and WARMUP must be >= 1"; exit 2; }
for n in $ROWS $PROFILE_ROWS; do
  [[ "$n" =~ ^[1-4]$ ]] || { echo "run.sh: rows are 1-4, got '$n' (ROWS=\"$ROWS\", PROFILE_ROWS=\"$PROFILE_ROWS\")"; exit 2; }
done

# ---- build -------------------------------------------------------------------------------------
if [[ "$BUILD" != 0 ]]; then
  if [[ -f "$BUILD_DIR/build.ninja" || -f "$BUILD_DIR/Makefile" ]]; then
    say "build: cmake --build $BUILD_DIR --target forge"
    cmake --build "$BUILD_DIR" --target forge -j "$(nproc)" > /tmp/forge_step_build.log 2>&1 \
      || { tail -20 /tmp/forge_step_build.log; echo "run.sh: the build failed"; exit 2; }
  else
    say "build: no $BUILD_DIR yet: BUILD_ONLY=1 scripts/gpu-check.sh (configures and builds everything: minutes)"
    BUILD_DIR="$BUILD_DIR" BUILD_ONLY=1 scripts/gpu-check.sh > /tmp/forge_step_build.log 2>&1 \
      || { tail -20 /tmp/forge_step_build.log; echo "run.sh: the build failed"; exit 2; }
  fi
fi
# shellcheck source=/dev/null
source benchmarks/common.sh
bench_setup run.sh  # sets FORGE, PY and GPU (the first GPU's name, for file names)
NGPU=$(nvidia-smi -L | wc -l)
# The commit, before this script touches the tree (the GPU tool's copy has no .git: FORGE_COMMIT).
commit="${FORGE_COMMIT:-}"
if [[ -z "$commit" ]] && git rev-parse --git-dir > /dev/null 2>&1; then
  commit="$(git rev-parse --short=12 HEAD)"
  [[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || commit="$commit (with uncommitted changes)"
fi
# shellcheck disable=SC2153
RAW="${RAW_DIR:-benchmarks/results/raw/step_${GPU}}"
RESULT="${RESULT_FILE:-benchmarks/results/step_${GPU}.md}"
WORK="$(mktemp -d /tmp/forge_step.XXXXXX)"
RUNS="$WORK/runs"
rm -rf "$RAW"
mkdir -p "$RAW" "$RUNS"
: > "$RAW/notes.txt"
note() { echo "$*" >> "$RAW/notes.txt"; }
say "step benchmark: $NGPU x $GPU; rows $ROWS; STEPS=$STEPS WARMUP=$WARMUP; forge $FORGE; python $PY"
say "raw -> $RAW, results -> $RESULT"

# ---- what this run is ----------------------------------------------------------------------------
clocks() {
  nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv,noheader \
    | tr '\n' ';' | sed 's/;$//'
}
nvidia-smi > "$RAW/nvidia-smi.txt" 2>&1 || true
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$RAW/nvidia-smi-clocks.txt" 2>&1 || true
timeout 60 "$FORGE" info > "$RAW/forge_info.txt" 2>&1 || true
CLOCKS_BEFORE="$(clocks)"
write_meta() {  # the figures report.py heads the results with; CLOCKS_AFTER once the runs are done
  GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | sed -n 1p)" \
  GPUS_DESC="$(nvidia-smi -L | sed 's/ (UUID.*//' | tr '\n' ';' | sed 's/;$//')" \
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | sed -n 1p)" \
  CLOCKS="index, SM MHz, max SM MHz, memory MHz, power limit, temperature: before: $CLOCKS_BEFORE${CLOCKS_AFTER:+; after: $CLOCKS_AFTER}" \
  COMMIT="${commit:-unknown (no .git here: set FORGE_COMMIT)}" CMD="$COMMAND" NGPU="$NGPU" STEPS="$STEPS" WARMUP="$WARMUP" \
  PROFILER_USED="${PROFILER_USED:-}" ROWS="$ROWS" FORGE_BUILD="$FORGE" \
  "$PY" - "$RAW/meta.json" <<'PYEOF'
import datetime, json, os, platform, sys
import torch
sys.path.insert(0, "benchmarks/step")
import shapes
e = os.environ
peak = float(e["PEAK_TFLOPS"]) if e.get("PEAK_TFLOPS") else shapes.peak_tflops(e["GPU_NAME"])
meta = {"gpu_name": e["GPU_NAME"], "gpus_desc": e["GPUS_DESC"], "driver": e["DRIVER"], "clocks": e["CLOCKS"],
        "commit": e["COMMIT"], "command": e["CMD"], "ngpu": int(e["NGPU"]), "steps": int(e["STEPS"]),
        "warmup": int(e["WARMUP"]), "rows": e["ROWS"], "profiler": e["PROFILER_USED"], "peak_tflops": peak,
        "forge_build": e["FORGE_BUILD"], "torch": torch.__version__, "torch_cuda": torch.version.cuda, "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
json.dump(meta, open(sys.argv[1], "w"), indent=1)
PYEOF
}
write_meta
finalize() {  # the results file from what is there so far; copies for the GPU tool
  if "$PY" benchmarks/step/report.py --raw "$RAW" > "$RESULT.tmp" 2> "$WORK/report.err"; then
    mv "$RESULT.tmp" "$RESULT"
  else
    rm -f "$RESULT.tmp"
    say "report.py failed: $(tail -3 "$WORK/report.err")"
  fi
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    [[ ! -f "$RESULT" || "$RESULT" -ef "$OUT/$(basename "$RESULT")" ]] || cp "$RESULT" "$OUT/"
    tar czf "$OUT/step_${GPU}_raw.tar.gz" -C "$(dirname "$RAW")" "$(basename "$RAW")" 2>/dev/null || true
  fi
}

# ---- power and clocks during each run -------------------------------------------------------------
# The GPU a run's rank 0 uses, in nvidia-smi's numbering: the first of CUDA_VISIBLE_DEVICES when it
# names GPUs by index (CUDA's and NVML's orders agree on hosts of identical GPUs, both by PCI bus),
# else 0. Both sides are sampled the same way, so their clocks under the power cap compare.
SMI_GPU="${CUDA_VISIBLE_DEVICES:-0}"
SMI_GPU="${SMI_GPU%%,*}"
[[ "$SMI_GPU" =~ ^[0-9]+$ ]] || SMI_GPU=0
POWER_PID=""
power_start() {  # TAG: samples into $RAW/TAG_power.csv until power_stop
  POWER_PID=""
  [[ "$SAMPLE_POWER" == 1 ]] && command -v nvidia-smi > /dev/null 2>&1 || return 0
  nvidia-smi -i "$SMI_GPU" --query-gpu=timestamp,power.draw,power.limit,clocks.sm,utilization.gpu \
    --format=csv,noheader,nounits -lms 100 > "$RAW/$1_power.csv" 2>&1 &
  POWER_PID=$!
}
power_stop() {
  [[ -n "$POWER_PID" ]] || return 0
  kill "$POWER_PID" 2> /dev/null || true
  wait "$POWER_PID" 2> /dev/null || true
  POWER_PID=""
}
trap power_stop EXIT

# ---- the rows ------------------------------------------------------------------------------------
row_def() {  # N -> CONFIG, BATCH (global), GPUS, SEQ
  case "$1" in
    1) CONFIG=configs/gpt2-124m.toml; BATCH=16; GPUS=1 ;;
    2) CONFIG=configs/gpt2-124m.toml; BATCH=32; GPUS=1 ;;
    3) CONFIG=configs/llama-0.85b.toml; BATCH=4; GPUS=1 ;;
    4) CONFIG=configs/gpt2-124m.toml; BATCH=32; GPUS=2 ;;
  esac
  SEQ=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["train"]["seq_len"])' "$CONFIG")
}
forge_args() {  # N STEPS -> FARGS: the forge train arguments of row N for that many steps
  FARGS=("$CONFIG" --run.dir="$RUNS" --run.name="row$1" --train.batch_size="$BATCH" --train.steps="$2"
         --train.log_every=1 --schedule.warmup_steps="$WARMUP" --checkpoint.at_end=false --eval.every=0)
  # shellcheck disable=SC2206  # FORGE_ARGS: words to add, split on spaces
  FARGS+=(${FORGE_ARGS:-})
}
run_forge() {  # N (REP: the repeat's file suffix, "" for the first)
  local n=$1 log="$RAW/row$1_forge${REP:-}.log"
  forge_args "$n" $((STEPS + WARMUP))
  say "row $n: forge ($([[ $GPUS -gt 1 ]] && echo "forge launch --nproc-per-node $GPUS, ")batch $BATCH x $SEQ)"
  local rc=0
  power_start "row${n}_forge${REP:-}"
  rm -rf "${RUNS:?}/row$n"
  if [[ "$GPUS" -gt 1 ]]; then
    timeout 300 "$FORGE" launch --nproc-per-node "$GPUS" -- "$FORGE" train "${FARGS[@]}" > "$log" 2>&1 || rc=$?
  else
    OMP_NUM_THREADS=8 timeout 300 "$FORGE" train "${FARGS[@]}" > "$log" 2>&1 || rc=$?
  fi
  power_stop
  cp "$RUNS/row$n/metrics.jsonl" "$RAW/row${n}_forge${REP:-}.jsonl" 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    say "row $n: forge${REP:-} FAILED (exit $rc): $(tail -2 "$log" | tr '\n' ' ')"
  else
    say "row $n: forge${REP:-}: $("$PY" benchmarks/step/report.py --line-forge "$RAW/row${n}_forge${REP:-}.jsonl" \
      --warmup "$WARMUP" --tokens-per-step $((BATCH * SEQ)))"
  fi
  [[ -n "${REP:-}" ]] && return 0
  "$FORGE" plan --config "$CONFIG" --batch "$BATCH" > "$RAW/row${n}_forge_plan.txt" 2>&1 || true
  say "row $n: forge's parameters (forge plan): $(awk '$1 == "parameters" { print $2; exit }' "$RAW/row${n}_forge_plan.txt")"
}
run_peer() {  # N MODE [extra torch_peer.py arguments] (REP: the repeat's file suffix)
  local n=$1 mode=$2 log="$RAW/row$1_$2${REP:-}.log" rc=0
  shift 2
  local args=(benchmarks/step/torch_peer.py --config "$CONFIG" --mode "$mode" --batch $((BATCH / GPUS))
              --steps "$STEPS" --warmup "$WARMUP" --json "$RAW/row${n}_${mode}${REP:-}.json" "$@")
  # shellcheck disable=SC2206  # PEER_ARGS: words to add, split on spaces
  args+=(${PEER_ARGS:-})
  power_start "row${n}_${mode}${REP:-}"
  if [[ "$GPUS" -gt 1 ]]; then
    say "row $n: PyTorch DDP $mode (torchrun --nproc-per-node $GPUS)"
    timeout 420 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" "${args[@]}" > "$log" 2>&1 || rc=$?
  else
    say "row $n: PyTorch $mode"
    PYTHONUNBUFFERED=1 timeout 420 "$PY" "${args[@]}" > "$log" 2>&1 || rc=$?
  fi
  power_stop
  if [[ $rc -ne 0 ]]; then
    say "row $n: PyTorch $mode${REP:-} FAILED (exit $rc): $(grep -v '^\s*$' "$log" | tail -2 | tr '\n' ' ' | cut -c1-300)"
    rm -f "$RAW/row${n}_${mode}${REP:-}.json"
  else
    say "row $n: PyTorch $mode${REP:-}: $("$PY" benchmarks/step/report.py --line-peer "$RAW/row${n}_${mode}${REP:-}.json")"
    say "row $n: $(grep -m1 'torch_peer: parameters' "$log" || true)"
  fi
}
for n in $ROWS; do
  row_def "$n"
  printf '{"row": %d, "config": "%s", "batch": %d, "gpus": %d, "seq": %d}\n' "$n" "$CONFIG" "$BATCH" "$GPUS" "$SEQ" \
    > "$RAW/row${n}_def.json"
  if [[ "$GPUS" -gt "$NGPU" ]]; then
    echo "needs $GPUS GPUs, this machine has $NGPU" > "$RAW/row${n}_skip.txt"
    rm -f "$RAW/row${n}_def.json"
    say "row $n: skipped: needs $GPUS GPUs, this machine has $NGPU"
    continue
  fi
  REP="" run_forge "$n"
  REP="" run_peer "$n" eager
  REP="" run_peer "$n" compile
  # Further repeats of forge and torch.compile, alternating which runs first, so that the card's
  # clocks and temperature fall on both alike; the summary's headline is the median ratio over
  # the repeats with their range (report.py).
  for ((r = 2; r <= REPEATS; r++)); do
    if ((r % 2 == 0)); then REP="_r$r" run_peer "$n" compile; REP="_r$r" run_forge "$n"
    else REP="_r$r" run_forge "$n"; REP="_r$r" run_peer "$n" compile; fi
  done
  finalize
done

# ---- per-kernel breakdown ------------------------------------------------------------------------
# (build_ktrace: benchmarks/common.sh)
choose_profiler() {
  case "$PROFILER" in
    none) PROFILER_USED=none ;;
    nsys) PROFILER_USED=nsys ;;
    ncu) PROFILER_USED=ncu ;;
    ktrace) if build_ktrace > "$RAW/ktrace_build.log" 2>&1; then PROFILER_USED=ktrace; else PROFILER_USED=none; fi ;;
    auto)
      if command -v nsys > /dev/null 2>&1; then PROFILER_USED=nsys
      elif build_ktrace > "$RAW/ktrace_build.log" 2>&1; then PROFILER_USED=ktrace
      elif command -v ncu > /dev/null 2>&1; then PROFILER_USED=ncu
      else PROFILER_USED=none; fi ;;
    *) echo "run.sh: PROFILER is auto, nsys, ktrace, ncu or none, got '$PROFILER'"; exit 2 ;;
  esac
}
trace_one() {  # NAME STEPS SKIP WHAT -- COMMAND...: runs COMMAND under the profiler -> kernels_NAME.{csv.gz,json}
  local name=$1 steps=$2 skip=$3 what=$4 rc=0 err=""
  shift 5
  local log="$RAW/kernels_$name.log" trace="$RAW/kernels_$name.csv.gz"
  case "$PROFILER_USED" in
    ktrace)
      rm -f "$WORK"/ktrace.*.csv
      CUDA_INJECTION64_PATH="$WORK/libktrace.so" FORGE_KTRACE_OUT="$WORK/ktrace.%p.csv" timeout 300 "$@" > "$log" 2>&1 || rc=$?
      local f
      # the largest trace: the training process's (compile workers may start CUDA too)
      f=$(find "$WORK" -maxdepth 1 -name 'ktrace.*.csv' -printf '%s %p\n' | sort -rn | sed -n 1p | cut -d' ' -f2-)
      if [[ -n "$f" ]]; then gzip -c "$f" > "$trace"; else err="ktrace wrote no trace (exit $rc)"; fi ;;
    nsys)
      timeout 400 nsys profile -t cuda --sample=none --cpuctxsw=none --export=sqlite --force-overwrite=true \
        -o "$WORK/nsys_$name" "$@" > "$log" 2>&1 || rc=$?
      "$PY" benchmarks/step/kernels.py --from-nsys "$WORK/nsys_$name.sqlite" --out "$trace" >> "$log" 2>&1 \
        || err="no Nsight Systems export (exit $rc)" ;;
    ncu)
      timeout 400 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --print-units base \
        "$@" > "$WORK/ncu_$name.csv" 2> "$log" || rc=$?
      "$PY" benchmarks/step/kernels.py --from-ncu "$WORK/ncu_$name.csv" --out "$trace" >> "$log" 2>&1 \
        || err="no Nsight Compute results (exit $rc)" ;;
  esac
  if [[ -n "$err" ]]; then
    printf '{"error": "%s"}\n' "$err" > "$RAW/kernels_$name.json"
    say "  $name: $err"
  else
    printf '{"source": "%s", "steps": %d, "skip": %d, "what": "%s"}\n' "$PROFILER_USED" "$steps" "$skip" "$what" \
      > "$RAW/kernels_$name.json"
    say "  $name: $("$PY" benchmarks/step/kernels.py "$trace" --steps "$steps" --skip "$skip" 2>&1 | sed -n 1p)"
  fi
}
PROFILED=""
for n in $PROFILE_ROWS; do
  if [[ " $ROWS " == *" $n "* ]]; then PROFILED="$PROFILED $n"; fi
done
if [[ -n "$PROFILED" ]]; then
  choose_profiler
  say "per-kernel breakdown of rows$PROFILED: profiler $PROFILER_USED"
  if [[ "$PROFILER_USED" == none ]]; then
    note "Per-kernel breakdown: no profiler (PROFILER=$PROFILER; nsys not on the PATH, ktrace not built: ktrace_build.log; no ncu)."
  fi
  if [[ "$PROFILER_USED" != none ]]; then
    # nsys/ktrace: 8 steps, the window after the first 3; ncu times every kernel alone, slowly:
    # 3 steps, the window after the first.
    if [[ "$PROFILER_USED" == ncu ]]; then PSTEPS=3; PSKIP=1; else PSTEPS=8; PSKIP=3; fi
    for n in $PROFILED; do
      row_def "$n"
      if [[ "$GPUS" -gt 1 ]]; then note "Row $n is data parallel: not profiled."; continue; fi
      if [[ $SECONDS -gt $TIME_BUDGET ]]; then
        note "Row $n: not profiled: the run had used ${SECONDS} s of its TIME_BUDGET of $TIME_BUDGET s."
        continue
      fi
      forge_args "prof$n" "$PSTEPS"
      OMP_NUM_THREADS=8 trace_one "row${n}_forge" "$PSTEPS" "$PSKIP" " of forge train" -- "$FORGE" train "${FARGS[@]}"
      finalize
    done
    if [[ "$PROFILE_PEER" == 1 && "$PROFILER_USED" != ncu ]]; then
      for n in $PROFILED; do
        row_def "$n"
        [[ "$GPUS" -eq 1 ]] || continue
        if [[ ! -f "$RAW/row${n}_compile.json" ]]; then
          note "Row $n: torch.compile's step not traced: its timed run failed."
          continue
        fi
        # torch.compile again, from the caches the timed run left: about 20-40 s.
        if [[ $((SECONDS + 60)) -gt $TIME_BUDGET ]]; then
          note "Row $n: torch.compile's step not traced: the run had used ${SECONDS} s of its TIME_BUDGET of $TIME_BUDGET s."
          continue
        fi
        # shellcheck disable=SC2206
        PARGS=(benchmarks/step/torch_peer.py --config "$CONFIG" --mode compile --batch "$BATCH" --steps 5 --warmup 3 ${PEER_ARGS:-})
        PYTHONUNBUFFERED=1 trace_one "row${n}_compile" 8 3 \
          " of torch_peer.py --mode compile (3 warm-up steps, the first compiling from the caches of the timed run)" -- \
          "$PY" "${PARGS[@]}"
        finalize
      done
    fi
  fi
fi

CLOCKS_AFTER="$(clocks)"
write_meta
finalize
say "done in ${SECONDS} s -> $RESULT${OUT:+ (and $OUT)}"
sed -n '/^## Summary/,/^## Row 1/p' "$RESULT" | sed '$d'  # the summary; the rest is in the file
