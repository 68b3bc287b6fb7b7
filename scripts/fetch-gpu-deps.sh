#!/usr/bin/env bash
# Fetches, as .deb files into .deps/, the header-only packages and test data that the GPU machine
# (Ubuntu 24.04 without a package registry) lacks; scripts/gpu-check.sh unpacks them there.
# Run here, then carry .deps with the GPU run.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
cd .deps
# The tokenizer libraries (src/forge/data/tokenizer.h) with their runtime parts; gpu-check.sh
# points CMake at them when the machine has none of its own (forge builds without them too).
for p in libxxhash-dev fortunes fortunes-min libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
         libsentencepiece-dev libsentencepiece0 libprotobuf-lite32; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls -1 *.deb
# NCCL's own benchmarks (nccl-tests), built on the GPU machine by scripts/gpu-dist-runs.sh: the
# yardstick of forge bench collectives (benchmarks/scale/run_scale.sh). Source only, pinned.
NCCL_TESTS_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432  # v2.19.6
if ! [ -f nccl-tests/src/Makefile ]; then
  if git clone -q https://github.com/NVIDIA/nccl-tests nccl-tests.tmp 2>/dev/null \
       && git -C nccl-tests.tmp checkout -q "$NCCL_TESTS_COMMIT" 2>/dev/null; then
    rm -rf nccl-tests.tmp/.git && mv nccl-tests.tmp nccl-tests
  else
    rm -rf nccl-tests.tmp
    echo "fetch-gpu-deps: could not fetch nccl-tests $NCCL_TESTS_COMMIT; put its source tree in .deps/nccl-tests"
  fi
fi
