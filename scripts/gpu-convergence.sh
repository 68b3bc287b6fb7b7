#!/usr/bin/env bash
# The GPU session of the convergence runs (benchmarks/convergence/README.md), in phases, each one
# call of the GPU tool on one warm machine: the corpus travels as xz parts of at most 40 MB
# (scripts/corpus/build-corpus.sh --pack into data/corpus/pack), under the 64 MiB a call may carry, and stays there in
# ignored directories between calls.
#
#   PHASE=build   scripts/gpu-check.sh BUILD_ONLY=1 (carry .deps and the first parts)
#   PHASE=corpus  build-corpus.sh --unpack data/corpus/pack --out .corpus: checksums, reassembly,
#                 forge tokenize (GPT-2, LLaMA-3), every invariant checked (carry the other parts
#                 and .fixtures/tokenizers)
#   PHASE=gpt2    benchmarks/convergence/run.sh MODEL=gpt2 (forge, then PyTorch; RAW in .convergence/)
#   PHASE=gpt2-forge, gpt2-ref: its stages apart (initial weights and forge; PyTorch and the report),
#                 for calls of at most 10 minutes
#   PHASE=llama, llama-forge, llama-ref: the same for LLaMA 0.85B
#   PHASE=data    benchmarks/convergence/data_path.sh: a corpus of >= 1B tokens, data wait, resume
#   PHASE=ab-forge, ab-ref: where forge's bf16 GPT-2 parts from PyTorch's, AB_STEPS (1000) steps each:
#                 forge bf16, f32 (TF32) and with its fused kernels off; then PyTorch compile (f32
#                 parameters under autocast), pure f32 and bf16 parameters, and ab_windows.py's table
#                 (ab_<gpu>.md in $OUT)
#   PHASE=report  the sections written so far, to $OUT
# PHASE may list several ("corpus gpt2-forge"), run in order. STEPS, PEERS, FORGE_EXTRA, ... pass
# through to run.sh; VARIANT=name keeps a run apart (.convergence/<model>_<name>), e.g. the A/B run
#   VARIANT=rounded FORGE_EXTRA=--debug.masters_from_rounded=true PHASE=gpt2-forge
# then report.py --forge .convergence/gpt2_rounded/forge/metrics.jsonl --ref .convergence/gpt2/ref_compile.jsonl.
# Where a gap between the curves comes from, both sides in f32 (TF32 matrix products), shorter:
#   STEPS=1500 VARIANT=f32 FORGE_EXTRA="--run.dtype=f32 --run.allow_tf32=true" PHASE=gpt2-forge
#   STEPS=1500 VARIANT=f32 PEERS="compile:f32-full compile" PHASE=gpt2-ref
# and forge's bf16 with its fusions off (FORGE_GELU_FUSION=0 FORGE_FUSED_CLASSIFIER=0 ... in the
# environment, --run.attention=composed --run.cuda_graph=false in FORGE_EXTRA) as another VARIANT.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PACK=${PACK:-data/corpus/pack}
CORPUS=${CORPUS:-$PWD/.corpus}
OUT=${OUT:-/tmp/gpu-convergence-out}
FORGE_BIN=${FORGE_BIN:-build-gpu/forge}  # (another build of forge: e.g. benchmarks/ab/run_ab.sh's build-ab/head/forge)
mkdir -p "$OUT"
for phase in ${PHASE:?PHASE=build, corpus, gpt2, gpt2-forge, gpt2-ref, llama, llama-forge, llama-ref, data, ab-forge, ab-ref or report}; do
case $phase in
  build)
    BUILD_ONLY=1 JOBS=${JOBS:-16} scripts/gpu-check.sh >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    tail -3 "$OUT/build.log"
    ls -la "$PACK" 2>/dev/null || true ;;
  corpus)
    ls -la "$PACK"
    scripts/corpus/build-corpus.sh --unpack "$PACK" --out "$CORPUS" --forge "$FORGE_BIN" \
      --tokenizers .fixtures/tokenizers 2>&1 | tail -15 ;;
  gpt2|llama|gpt2-forge|llama-forge|gpt2-ref|llama-ref)
    model=${phase%%-*}
    case $phase in *-forge) stages="init forge" ;; *-ref) stages="ref report" ;; *) stages="init forge ref report" ;; esac
    MODEL=$model STAGES=$stages CORPUS="$CORPUS" RAW="$PWD/.convergence/$model${VARIANT:+_$VARIANT}" FORGE="$FORGE_BIN" \
      OUT="$OUT" benchmarks/convergence/run.sh ;;
  data)
    CORPUS="$CORPUS" FORGE="$FORGE_BIN" OUT="$OUT" RAW="$PWD/.convergence/data" benchmarks/convergence/data_path.sh ;;
  ab-forge)
    A=(MODEL=gpt2 STEPS="${AB_STEPS:-1000}" CORPUS="$CORPUS" FORGE="$FORGE_BIN" OUT="$OUT")
    env "${A[@]}" STAGES="init forge" RAW="$PWD/.convergence/ab_bf16" benchmarks/convergence/run.sh | tail -3
    env "${A[@]}" STAGES="init forge" RAW="$PWD/.convergence/ab_f32" FORGE_EXTRA="--run.dtype=f32 --run.allow_tf32=true" \
      benchmarks/convergence/run.sh | tail -3
    env "${A[@]}" STAGES="init forge" RAW="$PWD/.convergence/ab_nofuse" FORGE_EXTRA="--run.cuda_graph=false" \
      FORGE_GELU_FUSION=0 FORGE_FUSED_CLASSIFIER=0 FORGE_GELU_BIAS_GRAD=0 FORGE_NORM_BIAS_GRAD=0 FORGE_BGRAD_EPILOGUE=0 \
      FORGE_FLASH_ATTENTION=0 benchmarks/convergence/run.sh | tail -3 ;;
  ab-ref)
    R=.convergence/ab_bf16
    MODEL=gpt2 STEPS="${AB_STEPS:-1000}" CORPUS="$CORPUS" FORGE="$FORGE_BIN" OUT="$OUT" STAGES=ref RAW="$PWD/$R" \
      PEERS="${AB_PEERS:-compile compile:f32-full compile:bf16}" benchmarks/convergence/run.sh | tail -3
    GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr ' ' '_')
    args=(--run "forge bf16=$R/forge/metrics.jsonl" --run "forge f32=.convergence/ab_f32/forge/metrics.jsonl"
          --run "forge fusions off=.convergence/ab_nofuse/forge/metrics.jsonl")
    for f in "$R"/ref_*.jsonl; do args+=(--ref "PyTorch $(basename "$f" .jsonl | sed 's/^ref_//')=$f"); done
    python3 benchmarks/convergence/ab_windows.py "${args[@]}" | tee "$OUT/ab_${GPU:-gpu}.md" | tail -20
    tar -czf "$OUT/ab_raw.tar.gz" .convergence/ab_*/forge/metrics.jsonl .convergence/ab_*/forge.log "$R"/ref_*.jsonl ;;
  report)
    cat .convergence/*/convergence_*.md ;;
  *) echo "gpu-convergence.sh: PHASE=$phase: use build, corpus, gpt2, gpt2-forge, gpt2-ref, llama, llama-forge, llama-ref, data, ab-forge, ab-ref or report" >&2; exit 2 ;;
esac
done
