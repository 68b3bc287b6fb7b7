#!/usr/bin/env bash
# One device call for a performance change (issue 15) on a two-GPU machine: build, then two
# lanes at once, one per GPU, so that neither waits for the other:
#   GPU 0  NCU_LIST's kernels under Nsight Compute if set (scripts/gpu-ncu.sh), AB_LIST0's A/Bs
#          (AB_LIST's format, below), then benchmarks/step/run.sh: forge beside PyTorch eager and
#          torch.compile (STEP_ROWS, default "1 2 3", none: not run; STEP_PROFILE_ROWS, default
#          none: a kernel trace costs a minute a row)
#   GPU 1  PROBE_CMD if set (a command of its own, output in probe.log), the CUDA tests matching
#          CTEST_REGEX (tests that need two GPUs skip here: run those with
#          scripts/gpu-dist-runs.sh), then each A/B of AB_LIST with benchmarks/ab/run_ab.sh on
#          the binary just built (SAME=1)
# AB_LIST holds entries separated by ';', each "name|VAR=value VAR=value": run_ab.sh's variables
# for that A/B (ENV_A/ENV_B, ARGS_A/ARGS_B, ROWS, ROUNDS, FIG_LAST), e.g.
#   AB_LIST='graph|ARGS_A=--run.cuda_graph=false ROWS=llama_1gpu ROUNDS=2;gelu|ENV_A=FORGE_GELU_BIAS_GRAD=0 ROWS=gpt2_1gpu'
# (a value cannot hold spaces: separate several words with commas, ENV_B=A=1,B=1). The device copy's .git can be stale: pass FORGE_COMMIT.
# Results go to RESULTS (default /tmp/forge_step_ab): log (a line per stage, the key figures),
# build.log, step/ (step.md and raw/), ctest.log, ab_<name>/ (figures.txt, ab_summary.txt, logs).
#
#   FORGE_COMMIT=$(git rev-parse --short=12 HEAD) CTEST_REGEX=CudaLinear AB_LIST=... scripts/gpu-step-ab.sh
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0
R="${RESULTS:-/tmp/forge_step_ab}"
mkdir -p "$R"
exec > "$R/log" 2>&1
C=${FORGE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
t() { echo "[$(date +%H:%M:%S)] $*"; }
t "start, commit $C"; nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
if [[ "${BUILD:-1}" == 1 ]]; then
  BUILD_ONLY=1 JOBS="${JOBS:-32}" scripts/gpu-check.sh > "$R/build.log" 2>&1; rc=$?; t "build rc=$rc"
  grep -E "error|warning:" "$R/build.log" | head
  [[ $rc == 0 ]] || { tail -30 "$R/build.log"; t ALL_DONE; exit 1; }
fi
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] &&
  export LD_LIBRARY_PATH="$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ab_list GPU LIST: each A/B of LIST (AB_LIST's format) with benchmarks/ab/run_ab.sh on that GPU.
ab_list() {
  local gpu=$1 entry name vars entries kv
  IFS=';' read -r -a entries <<< "$2"
  for entry in "${entries[@]}"; do
    [[ -z "$entry" ]] && continue
    name=${entry%%|*}; vars=${entry#*|}
    read -r -a kv <<< "$vars"
    CUDA_VISIBLE_DEVICES=$gpu env "${kv[@]}" SAME=1 AB_BIN="$ROOT/build-gpu/forge" AB_OUT="$R/ab_$name" OUT= \
      timeout "${AB_TIMEOUT:-200}" benchmarks/ab/run_ab.sh runs > "$R/ab_$name.log" 2>&1
    t "A/B $name on GPU $gpu ($vars) rc=$?"; cat "$R/ab_$name/ab_summary.txt" 2>/dev/null
  done
}

lane_step() {
  if [[ -n "${NCU_LIST:-}" ]]; then   # Nsight Compute on chosen kernels first (scripts/gpu-ncu.sh)
    CUDA_VISIBLE_DEVICES=0 RESULTS=$R/ncu scripts/gpu-ncu.sh > "$R/ncu.log" 2>&1
    t "ncu rc=$?"; cat "$R/ncu/digest.txt" 2>/dev/null
  fi
  ab_list 0 "${AB_LIST0:-}"
  [[ "${STEP_ROWS:-}" == none ]] && return
  CUDA_VISIBLE_DEVICES=0 FORGE_COMMIT=$C BUILD=0 ROWS="${STEP_ROWS:-1 2 3}" PROFILE_ROWS="${STEP_PROFILE_ROWS:-}" \
    RAW_DIR=$R/step/raw RESULT_FILE=$R/step/step.md OUT= timeout "${STEP_TIMEOUT:-400}" benchmarks/step/run.sh \
    > "$R/step_bench.log" 2>&1
  t "step bench rc=$?"; grep -E "^\| [0-9] \|" "$R/step/step.md" | head -4
}

lane_checks() {
  if [[ -n "${PROBE_CMD:-}" ]]; then   # a probe of its own (e.g. benchmarks/overlap/probe.py) on GPU 1, first
    CUDA_VISIBLE_DEVICES=1 timeout "${PROBE_TIMEOUT:-120}" bash -c "$PROBE_CMD" > "$R/probe.log" 2>&1
    t "probe rc=$?"; tail -8 "$R/probe.log"
  fi
  if [[ -n "${CTEST_REGEX:-}" ]]; then
    (cd build-gpu && CUDA_VISIBLE_DEVICES=1 timeout "${CTEST_TIMEOUT:-150}" ctest -L cuda -R "$CTEST_REGEX" \
       --output-on-failure -j8 > "$R/ctest.log" 2>&1)
    t "ctest rc=$?"; grep -E "tests passed|\(Failed\)|Timeout|Not Run" "$R/ctest.log" | head -20
  fi
  ab_list 1 "${AB_LIST:-}"
}

lane_step & S=$!
lane_checks & K=$!
wait $S $K
t ALL_DONE
