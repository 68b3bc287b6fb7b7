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
  # The libraries the GPU machine lacks (utf8proc, PCRE2, sentencepiece: scripts/fetch-gpu-deps.sh)
  # live in .deps/root, which a device call that carries .deps replaces: unpack them again.
  local root; root="$(pwd)/.deps/root"
  if compgen -G ".deps/*.deb" >/dev/null && [[ ! -d "$root/usr/lib/x86_64-linux-gnu" ]]; then
    mkdir -p "$root"; for deb in .deps/*.deb; do dpkg -x "$deb" "$root"; done
  fi
  if [[ -d "$root/usr/lib/x86_64-linux-gnu" && ":${LD_LIBRARY_PATH:-}:" != *":$root/usr/lib/x86_64-linux-gnu:"* ]]; then
    export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  [[ -x "$FORGE" ]] || { echo "$who: $FORGE not found; build first (scripts/gpu-check.sh)"; exit 2; }
  [[ -n "$PY" ]] || { echo "$who: no Python with CUDA-enabled torch found; set PYTHON=..."; exit 2; }
  GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | sed -n 1p | tr ' ' '_')"
}

# The CUPTI kernel tracer (benchmarks/step/ktrace.cpp) -> $WORK/libktrace.so; needs WORK and PY.
# Run a program under it with CUDA_INJECTION64_PATH=$WORK/libktrace.so FORGE_KTRACE_OUT=DIR/ktrace.%p.csv;
# benchmarks/step/kernels.py summarises a trace.
build_ktrace() {  # -> $WORK/libktrace.so, from the CUPTI of the CUDA toolkit (or of PyTorch's wheels)
  local inc="" lib="" d
  local roots=("${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12)
  roots+=("$("$PY" -c 'import os, nvidia; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)/nvidia/cu13"
          "$("$PY" -c 'import os, nvidia; print(nvidia.__path__[0])' 2>/dev/null)/cuda_cupti")
  for d in "${roots[@]}"; do
    for i in "$d/extras/CUPTI/include" "$d/targets/x86_64-linux/include" "$d/include"; do
      if [[ -z "$inc" && -f "$i/cupti.h" ]]; then inc="$i"; fi
    done
    for l in "$d/extras/CUPTI/lib64" "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"; do
      if [[ -z "$lib" ]] && compgen -G "$l/libcupti.so*" > /dev/null; then lib="$l"; fi
    done
  done
  [[ -n "$inc" && -n "$lib" ]] || { echo "no CUPTI (cupti.h and libcupti.so) found"; return 1; }
  local cuda_inc=/usr/local/cuda/include
  if [[ -f "$inc/cuda.h" ]]; then cuda_inc="$inc"; fi
  # The newest record layouts the header declares (ktrace.cpp reads fields common to all).
  local k m s so
  k=$(grep -oE '\} CUpti_ActivityKernel[0-9]+;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -1)
  m=$(grep -oE '\} CUpti_ActivityMemcpy[0-9]+;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -1)
  s=$(grep -oE '\} CUpti_ActivityMemset[0-9]+;' "$inc/cupti_activity.h" | tr -d '}; ' | sort -V | tail -1)
  so=$(compgen -G "$lib/libcupti.so*" | sort | sed -n 1p)
  g++ -std=c++17 -O2 -shared -fPIC -I"$inc" -I"$cuda_inc" ${k:+-DKTRACE_KERNEL_RECORD=$k} ${m:+-DKTRACE_MEMCPY_RECORD=$m} \
    ${s:+-DKTRACE_MEMSET_RECORD=$s} benchmarks/step/ktrace.cpp -o "$WORK/libktrace.so" "$so" -Wl,-rpath,"$lib" 2>&1 \
    && echo "built against $inc ($k), $so"
}
