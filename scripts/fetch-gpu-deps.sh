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
for p in libtomlplusplus-dev fortunes fortunes-min libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
         libsentencepiece-dev libsentencepiece0 libprotobuf-lite32; do
  ls ${p}_*.deb >/dev/null 2>&1 || apt-get download "$p"
done
ls -1 *.deb
