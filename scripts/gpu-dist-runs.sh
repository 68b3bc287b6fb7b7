#!/usr/bin/env bash
# The two-GPU session of issues 16 and 17 in one detached run: build, the CUDA tests of the
# distributed paths, then the tensor- and pipeline-parallel benchmarks. Results go OUTSIDE the
# repository (RESULTS, default /tmp/forge_dist_results): the device tool re-sends the working tree
# on every call and removes files it does not have, so raw results written under benchmarks/
# would vanish between calls.
#
#   setsid nohup scripts/gpu-dist-runs.sh > /dev/null 2>&1 < /dev/null &   # then poll $RESULTS/log
#   STEPS_TO_RUN="tp_perf pp_bubble" scripts/gpu-dist-runs.sh               # a subset
#
# Steps (STEPS_TO_RUN, in this order): build ctest pp_check tp_check pp_bubble pp_peer pp_socket
# tp_perf. Each writes under $RESULTS/<benchmark>/; $RESULTS/log has a line per step and the key
# numbers (grep ALL_DONE). Copy $RESULTS/pp and $RESULTS/tp into benchmarks/results/raw/<kind>_<gpu>/
# and run benchmarks/pp/report_pp.py and benchmarks/tp/report_tp.py to write the reports.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0
R="${RESULTS:-/tmp/forge_dist_results}"
mkdir -p "$R"
exec > "$R/log" 2>&1
STEPS=" ${STEPS_TO_RUN:-build ctest pp_check tp_check pp_bubble pp_peer pp_socket tp_perf} "
C=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
t() { echo "[$(date +%H:%M:%S)] $*"; }
want() { [[ "$STEPS" == *" $1 "* ]]; }
t "start, commit $C, steps:$STEPS"; nvidia-smi --query-gpu=name --format=csv,noheader
if want build; then
  BUILD_ONLY=1 JOBS="${JOBS:-32}" scripts/gpu-check.sh > "$R/build.log" 2>&1; rc=$?; t "build rc=$rc"
  grep -E "error|warning:" "$R/build.log" | head
  [[ $rc == 0 ]] || { tail -30 "$R/build.log"; t ALL_DONE; exit 1; }
fi
if want ctest; then
  (cd build-gpu && timeout 300 ctest -L cuda -R "LinearDeferred|CudaStreams|CudaTensorParallel|Nccl|GraphedTraining|CudaAllocator|CudaLinear|Deferred|CudaModels|CrossEntropy|OpTable" \
     --output-on-failure -j8 > "$R/ctest.log" 2>&1; t "ctest rc=$?"; grep -E "tests passed|\(Failed\)|Timeout|Not Run" "$R/ctest.log" | head -20)
fi
if want pp_check; then
  FORGE_COMMIT=$C RAW_DIR=$R/pp PHASES=check timeout 300 benchmarks/pp/run_pp.sh > "$R/pp_check.log" 2>&1; t "pp check rc=$?"
  grep -h '"result"' "$R/pp/equivalence.jsonl" | cut -c1-200
fi
if want tp_check; then
  FORGE_COMMIT=$C RAW_DIR=$R/tp PHASES=check timeout 400 benchmarks/tp/run_tp.sh > "$R/tp_check.log" 2>&1; t "tp check rc=$?"
  grep -h '"result"' "$R/tp/equivalence.jsonl" | cut -c1-200
fi
for ph in bubble peer socket; do
  want pp_$ph || continue
  FORGE_COMMIT=$C RAW_DIR=$R/pp PHASES=$ph RUN_TIMEOUT=120 PEER_TIMEOUT=200 timeout 900 benchmarks/pp/run_pp.sh > "$R/pp_$ph.log" 2>&1
  t "pp $ph rc=$?"
  [[ $ph == bubble ]] && cat "$R/pp/bubble_fit.txt"
  [[ $ph != bubble ]] && grep -h '"result"' "$R/pp/$ph.jsonl" | cut -c1-300
done
if want tp_perf; then
  FORGE_COMMIT=$C RAW_DIR=$R/tp REPORT=$R/tp_report.md PHASES=perf STEPS=21 PEER_STEPS=10 PEER_WARMUP=6 \
    WIDE_VARIANTS="${WIDE_VARIANTS:-ddp tp2 tp2_sp}" RUN_TIMEOUT=120 PEER_TIMEOUT=200 timeout 900 benchmarks/tp/run_tp.sh > "$R/tp_perf.log" 2>&1
  t "tp perf rc=$?"
  grep -h '"who"' "$R/tp/perf.jsonl" | cut -c1-300
fi
t ALL_DONE
