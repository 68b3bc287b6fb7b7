#!/usr/bin/env bash
# GPT-2 124M training throughput, forge against PyTorch eager and torch.compile: now rows 1 and 2
# (batch 16 and 32) of benchmarks/step/run.sh, which this runs.
#
#   benchmarks/gpt2_124m/run.sh                  # = ROWS="1 2" PROFILE_ROWS=1 benchmarks/step/run.sh
#   STEPS=40 WARMUP=10 benchmarks/gpt2_124m/run.sh
#
# Writes benchmarks/results/step_<gpu>.md (the former gpt2_124m_<gpu>.md layout came from
# benchmarks/gpt2_124m/report.py, kept for the raw directories of that time). pytorch_gpt2.py
# beside this file is still the GPT-2 peer's model (benchmarks/step/torch_peer.py imports it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${BATCHES:-}" ]]; then
  echo "gpt2_124m/run.sh: BATCHES is gone: the batch sizes are rows 1 (16) and 2 (32) of benchmarks/step/run.sh (ROWS)"
  exit 2
fi
export ROWS="${ROWS:-1 2}" PROFILE_ROWS="${PROFILE_ROWS-1}"
exec "$ROOT/benchmarks/step/run.sh"
