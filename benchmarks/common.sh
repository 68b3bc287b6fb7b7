# Sourced by the benchmark scripts (benchmarks/*/run*.sh): what every GPU benchmark needs first.
#
#   source "$ROOT/benchmarks/common.sh"
#   bench_setup run_gemm.sh     # sets FORGE, PY and GPU, or exits 2 saying what is missing
#
# FORGE: $BUILD_DIR/forge (BUILD_DIR defaults to build-gpu, what scripts/gpu-check.sh builds).
# PY: $PYTHON, else the first of python3, /opt/torch/.venv/bin/python3, /usr/bin/python3 whose
#     torch sees a GPU.
# GPU: the first GPU's name with spaces as underscores (for result file names).
bench_setup() {
  local who="$1"
  BUILD_DIR="${BUILD_DIR:-build-gpu}"
  FORGE="$BUILD_DIR/forge"
  PY="${PYTHON:-}"
  if [[ -z "$PY" ]]; then
    local p
    for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
      if command -v "$p" >/dev/null 2>&1 && "$p" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
        PY="$p"
        break
      fi
    done
  fi
  [[ -x "$FORGE" ]] || { echo "$who: $FORGE not found; build first (scripts/gpu-check.sh)"; exit 2; }
  [[ -n "$PY" ]] || { echo "$who: no Python with CUDA-enabled torch found; set PYTHON=..."; exit 2; }
  GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')"
}
