#!/usr/bin/env bash
# forge before and after a change, on the GPU machine, in one run: the same workloads with the
# binary of a base commit (A) and of the working tree (B), alternating A and B within every
# round so that clocks and thermals fall on both alike. For changes that must not move speed
# or results (a refactor): the ratio B / A of each row is the figure to quote.
#
#   # here (no GPU): the base tree and the packages the GPU machine lacks
#   BASE=<commit> benchmarks/ab/run_ab.sh prepare      # .ab/base (git archive), .deps/*.deb
#   # on the GPU machine (device tool: carry .ab and .deps):
#   benchmarks/ab/run_ab.sh build                      # both trees' forge (+ B's tests: HEAD_TARGETS), in parallel
#   ROUNDS=3 benchmarks/ab/run_ab.sh runs              # the rows below; table at the end
# (carry .ab and .deps with the build call only: a carried path replaces what is there.)
#
# Rows (ROWS, default "gpt2_1gpu gpt2_2gpu"; each its own process; figures from metrics.jsonl, the
# mean of the last two logging intervals of 60 steps, i.e. steps 41-60):
#   gpt2_1gpu   GPT-2 124M (configs/gpt2-124m.toml), bf16, batch 16 x 1024, one GPU
#   gpt2_2gpu   the same with DDP on two GPUs (forge launch), batch 32 = 16 per GPU
#   llama_1gpu  LLaMA 0.85B (configs/llama-0.85b.toml), bf16, batch 4 x 2048, one GPU
#   lenet       LeNet on Fashion-MNIST (configs/fashion-mnist.toml) on one GPU: test accuracy and
#               images/s (needs the dataset: .deps/dataset-fashion-mnist*.deb)
# A switch instead of a commit: SAME=1 runs the working tree's binary on both sides (no base
# build needed), with ENV_A / ENV_B added to A's / B's environment, e.g.
#   SAME=1 ENV_B="FORGE_GELU_FUSION=0" ROWS=gpt2_1gpu benchmarks/ab/run_ab.sh runs
# (ENV_A / ENV_B apply without SAME too; words are separated by spaces or commas:
# ENV_B="FORGE_FUSED_CLASSIFIER=1,FORGE_CE_WIDE_ROWS=1".) AB_BIN=build-gpu/forge with SAME=1 runs a binary that
# scripts/gpu-check.sh already built, so no `build` phase is needed. ARGS_A / ARGS_B add forge train
# arguments to one side (a config key: ARGS_A="--run.cuda_graph=false"). FIG_LAST (default 2) is how
# many of the last progress records each figure averages (each covers 10 steps).
# Output: build-ab/results/ (runs, logs, ab_summary.txt) and, on the device tool's machine, $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
AB=$ROOT/.ab          # the base tree (prepare; carried to the GPU machine)
OB=$ROOT/build-ab     # builds and results (ignored like every build*/; kept between device calls
                      # while the machine is warm, as long as the call does not carry it or .ab)
PHASE=${1:-runs}
JOBS=${JOBS:-$(( $(nproc) / 2 ))}
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

deps_args() {  # the header-only packages and data the GPU machine lacks (scripts/fetch-gpu-deps.sh)
  local args=()
  if compgen -G "$ROOT/.deps/*.deb" >/dev/null; then
    mkdir -p "$ROOT/.deps/root"
    # Two A/Bs started together (scripts/gpu-step-ab.sh: one a GPU) would unpack over each other
    # (a bus error on the GPU machine): one at a time.
    (
      flock 9
      for deb in "$ROOT"/.deps/*.deb; do dpkg -x "$deb" "$ROOT/.deps/root"; done
    ) 9> "$ROOT/.deps/.unpack.lock"
    [ -f /usr/include/xxhash.h ] || args+=(-DXXHASH_INCLUDE_DIR="$ROOT/.deps/root/usr/include")
    # The tokenizer libraries (Hugging Face pre-tokenizer regexes, normalisers, .model files).
    local lib="$ROOT/.deps/root/usr/lib/x86_64-linux-gnu" inc="$ROOT/.deps/root/usr/include"
    [ -f /usr/include/pcre2.h ] || ! [ -e "$lib/libpcre2-8.so" ] || args+=(-DPCRE2_INCLUDE_DIR="$inc" -DPCRE2_LIBRARY="$lib/libpcre2-8.so")
    [ -f /usr/include/utf8proc.h ] || ! [ -e "$lib/libutf8proc.so" ] || args+=(-DUTF8PROC_INCLUDE_DIR="$inc" -DUTF8PROC_LIBRARY="$lib/libutf8proc.so")
    [ -f /usr/include/sentencepiece_processor.h ] || ! [ -e "$lib/libsentencepiece.so" ] ||
      args+=(-DSENTENCEPIECE_INCLUDE_DIR="$inc" -DSENTENCEPIECE_LIBRARY="$lib/libsentencepiece.so")
  fi
  echo "${args[@]}"
}

case "$PHASE" in
prepare)
  : "${BASE:?set BASE=<commit> (the code before the change)}"
  rm -rf "$AB/base" && mkdir -p "$AB/base"
  git archive "$BASE" | tar -x -C "$AB/base"
  echo "$BASE" > "$AB/base/.commit"
  git rev-parse HEAD > "$AB/head_commit"
  bash scripts/fetch-gpu-deps.sh
  (cd .deps && { ls dataset-fashion-mnist_*.deb >/dev/null 2>&1 || apt-get download dataset-fashion-mnist; })
  ex="$(git rev-parse --git-dir)/info/exclude"; mkdir -p "$(dirname "$ex")"; grep -qxF /.ab/ "$ex" 2>/dev/null || echo /.ab/ >> "$ex"
  du -sh "$AB" .deps
  ;;
build)
  args=$(deps_args)
  mkdir -p "$OB"
  sides="base head"; [ "${SAME:-0}" = 1 ] && sides=head
  for t in $sides; do
    src=$([ $t = base ] && echo "$AB/base" || echo "$ROOT")
    targets="forge"; [ $t = head ] && targets="${HEAD_TARGETS:-forge forge_tests forge_cuda_tests forge_parallel_tests forge_hf_parity}"
    ( cmake -S "$src" -B "$OB/$t" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON \
        -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc $args > "$OB/configure-$t.log" 2>&1 &&
      cmake --build "$OB/$t" -j "$JOBS" --target $targets > "$OB/build-$t.log" 2>&1
      echo "build $t: exit $? ($(grep -ci warning "$OB/build-$t.log") warning lines)" ) &
  done
  wait
  ls -la "$OB"/*/forge
  ;;
runs)
  R=${ROUNDS:-3}
  deps_args > /dev/null  # .deps/root again (a device call that carries .deps replaces it): its libraries
  [ -d "$ROOT/.deps/root/usr/lib/x86_64-linux-gnu" ] &&
    export LD_LIBRARY_PATH="$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  OUTD=${AB_OUT:-$OB/results}  # AB_OUT: another folder, to keep an earlier A/B's results
  rm -rf "$OUTD" && mkdir -p "$OUTD"
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$OUTD/gpus.txt"
  G=(configs/gpt2-124m.toml --run.overwrite=true --train.steps=60 --train.log_every=10 --checkpoint.at_end=false)
  fig() {  # RUN_DIR -> "tokens_per_s ms_per_step" of the last two progress records
    python3 - "$1/metrics.jsonl" "${FIG_LAST:-2}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")][-int(sys.argv[2]):]
print(f'{sum(r["tokens_per_s"] for r in prog) / len(prog):.1f} {sum(r["ms_per_step"] for r in prog) / len(prog):.3f}')
PY
  }
  L=(configs/llama-0.85b.toml --run.overwrite=true --train.batch_size=4 --train.steps=40 --train.log_every=10
     --eval.every=0 --checkpoint.at_end=false)
  one() {  # WHICH ROW ROUND
    local bin=$OB/$1/forge name="$2_$1_r$3" rc
    [ "${SAME:-0}" = 1 ] && bin=${AB_BIN:-$OB/head/forge}
    # Words separated by spaces or commas (a comma lets scripts/gpu-step-ab.sh's AB_LIST carry several).
    local ea=${ENV_A:-} eb=${ENV_B:-} aa=${ARGS_A:-} ab=${ARGS_B:-}
    local envs=(); [ "$1" = base ] && read -r -a envs <<< "${ea//,/ }"; [ "$1" = head ] && read -r -a envs <<< "${eb//,/ }"
    local args=(); [ "$1" = base ] && read -r -a args <<< "${aa//,/ }"; [ "$1" = head ] && read -r -a args <<< "${ab//,/ }"
    case $2 in
      gpt2_1gpu) env "${envs[@]}" "$bin" train "${G[@]}" "${args[@]}" --run.dir="$OUTD/runs" --run.name="$name" \
                   > "$OUTD/$name.log" 2>&1; rc=$? ;;
      gpt2_2gpu) env "${envs[@]}" "$bin" launch --nproc-per-node 2 -- "$bin" train "${G[@]}" "${args[@]}" \
                   --run.dir="$OUTD/runs" --run.name="$name" --train.batch_size=32 > "$OUTD/$name.log" 2>&1; rc=$? ;;
      llama_1gpu) env "${envs[@]}" "$bin" train "${L[@]}" "${args[@]}" --run.dir="$OUTD/runs" --run.name="$name" \
                    > "$OUTD/$name.log" 2>&1; rc=$? ;;
      *) echo "run_ab.sh: unknown row '$2' (gpt2_1gpu, gpt2_2gpu, llama_1gpu)"; rc=2 ;;
    esac
    if [ $rc -eq 0 ]; then echo "$2 $1 $3 $(fig "$OUTD/runs/$name")" | tee -a "$OUTD/figures.txt"
    else echo "$2 $1 $3 FAILED (exit $rc): $(tail -2 "$OUTD/$name.log" | tr '\n' ' ')" | tee -a "$OUTD/figures.txt"; fi
  }
  for r in $(seq 1 "$R"); do
    # A then B in odd rounds, B then A in even ones.
    order="base head"; [ $((r % 2)) -eq 0 ] && order="head base"
    for row in ${ROWS:-gpt2_1gpu gpt2_2gpu}; do for w in $order; do one "$w" "$row" "$r"; done; done
  done
  if [ "${SAME:-0}" != 1 ] && { [ -d "$ROOT/.deps/root/usr/share/datasets/fashion-mnist" ] || [ -d /usr/share/datasets/fashion-mnist ]; }; then
    D=$([ -d /usr/share/datasets/fashion-mnist ] && echo /usr/share/datasets/fashion-mnist || echo "$ROOT/.deps/root/usr/share/datasets/fashion-mnist")
    for w in base head; do
      "$OB/$w/forge" train configs/fashion-mnist.toml --run.dir="$OUTD/runs" --run.name="lenet_$w" \
        --run.overwrite=true --run.device=cuda --data.dir="$D" > "$OUTD/lenet_$w.log" 2>&1
      echo "lenet $w: exit $? $(grep -E 'test accuracy' "$OUTD/lenet_$w.log" | tail -1)" | tee -a "$OUTD/figures.txt"
    done
  fi
  python3 - "$OUTD/figures.txt" <<'PY' | tee "$OUTD/ab_summary.txt"
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) >= 5 and p[0] != "lenet" and p[3] != "FAILED":
        rows.setdefault(p[0], {}).setdefault(p[1], {})[int(p[2])] = (float(p[3]), float(p[4]))
print(f"{'row':<11}{'A tokens/s':>12}{'B tokens/s':>12}{'B/A':>8}   per round B/A")  # A: base (ENV_A), B: head (ENV_B)
for row, d in rows.items():
    if "base" not in d or "head" not in d: continue
    a = statistics.median(v[0] for v in d["base"].values()); b = statistics.median(v[0] for v in d["head"].values())
    per = " ".join(f"{d['head'][k][0] / d['base'][k][0]:.4f}" for k in sorted(d["head"]) if k in d["base"])
    print(f"{row:<11}{a:>12.0f}{b:>12.0f}{b / a:>8.4f}   {per}")
PY
  if [ -n "${OUT:-}" ]; then  # at most 8 files come back: the tables, and the logs in one archive
    cp "$OUTD"/*.txt "$OUT"/ 2>/dev/null
    tar czf "$OUT/ab_logs.tgz" -C "$OUTD" $(cd "$OUTD" && ls *.log) 2>/dev/null
  fi
  ;;
*) echo "usage: $0 prepare|build|runs" >&2; exit 2 ;;
esac
