#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages forge needs. Idempotent: packages already present are
# skipped; uses sudo when not root.
#   scripts/install-deps.sh            # building, training AND the tests (make test)
#   scripts/install-deps.sh --runtime  # building and training only (make train, make install)
set -euo pipefail

RUNTIME_ONLY=0
for arg in "$@"; do
  case $arg in
    --runtime) RUNTIME_ONLY=1 ;;
    --with-bench) ;;  # (the benchmarks' library is in the full set)
    *) echo "install-deps: unknown argument '$arg' (use --runtime, or nothing for the tests' set too)" >&2; exit 2 ;;
  esac
done

# What building forge and training with it need.
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev            # CPU GEMM (cblas_sgemm / cblas_dgemm)
  zlib1g-dev                 # reading the gzipped IDX files of Fashion-MNIST, .jsonl.gz corpora
  libxxhash-dev              # checkpoint manifests' checksums (XXH3, used header-only)
  libcli11-dev               # the forge command line
  nlohmann-json3-dev         # safetensors headers, checkpoint metadata, metrics.jsonl
  libpcre2-dev               # tokenizer files: Hugging Face / tiktoken pre-tokenizer regexes
  libutf8proc-dev            # tokenizer files: Unicode normalizers (NFC, ...)
  libsentencepiece-dev       # tokenizer files: sentencepiece .model
  libopenmpi-dev openmpi-bin # forge::parallel on CPU tensors and multi-node start-up (mpirun)
  fortunes                   # the demo corpus (configs/tiny.toml)
)
# What the tests and benchmarks add (make test).
test_packages=(
  libgtest-dev libgmock-dev googletest  # unit tests (GoogleTest and GoogleMock through CTest)
  libbenchmark-dev           # CPU micro-benchmarks (benchmarks/cpu)
  dataset-fashion-mnist      # the CNN demo and its tests (configs/fashion-mnist.toml)
  python3 python3-numpy python3-torch   # reference checks against PyTorch
)
[ "$RUNTIME_ONLY" = 1 ] || packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

check_cmake() {
  # forge needs CMake >= 3.25 (Debian 12 ships 3.25; Ubuntu 22.04 ships 3.22).
  local v
  v=$(cmake --version 2>/dev/null | sed -n 1p | grep -oE '[0-9]+\.[0-9]+' | sed -n 1p) || true
  if [ -n "$v" ] && [ "$(printf '%s\n3.25\n' "$v" | sort -V | sed -n 1p)" != "3.25" ]; then
    echo "install-deps: CMake $v is too old; forge needs >= 3.25." >&2
    echo "  Install a newer one, e.g. 'sudo snap install cmake --classic' or 'pip install cmake'," >&2
    echo "  and make sure it comes first on PATH." >&2
    exit 1
  fi
}

fixtures() {
  # Real published tokenizer files for the tokenizer tests (checksummed; skipped when present).
  [ "$RUNTIME_ONLY" = 1 ] || bash "$(dirname "$0")/fetch-tokenizer-fixtures.sh"
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  check_cmake
  fixtures
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | sed -n 1p)" ]; then
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
check_cmake
fixtures
