#!/usr/bin/env bash
# The multi-GPU session of issues 16, 17 and 20 in one detached run: build (and NCCL's nccl-tests
# from .deps/nccl-tests, scripts/fetch-gpu-deps.sh), the CUDA tests of the distributed paths, the
# tensor- and pipeline-parallel checks and benchmarks, and the scaling runs of
# benchmarks/scale/run_scale.sh. Results go OUTSIDE the repository (RESULTS, default
# /tmp/forge_dist_results): the device tool re-sends the working tree on every call and removes
# files it does not have, so raw results written under benchmarks/ would vanish between calls.
#
#   setsid nohup scripts/gpu-dist-runs.sh > /dev/null 2>&1 < /dev/null &   # then poll $RESULTS/log
#   STEPS_TO_RUN="tp_perf pp_bubble" scripts/gpu-dist-runs.sh               # a subset
#
# Steps (STEPS_TO_RUN, in this order): build ctest tp_check pp_check pp_check4 tp_check4 pp_bubble
# pp_peer pp_socket tp_profile tp_perf step_bench hf_checks sample_bench tb_check scale.
#   ctest       the CUDA tests of the distributed paths; with CTEST_GPUS (e.g. 0,1) on those GPUs in
#               the background while the next steps run on CHECK_GPUS (e.g. 2,3), until a step that
#               needs every GPU
#   tp_check / pp_check     equivalence at tp = 2 / pp = 2 (on CHECK_GPUS if set)
#   pp_check4 / tp_check4   the same at pp = 4 / tp = 4 (CHECK4_MODELS, CHECK4_OPTIMS)
#   pp_bubble   the pipeline bubble at pp = 2 (SCHEDS)
#   tp_profile  phase timers and a kernel trace of tp 2 with and without sequence parallelism
#   step_bench  benchmarks/step/run.sh on GPU 0 (STEP_ROWS, default 3; STEP_PROFILE_ROWS, default 3)
#   scale       benchmarks/scale/run_scale.sh on every GPU (SCALE_PHASES; its own variables pass through)
# Each writes under $RESULTS/<benchmark>/; $RESULTS/log has a line per step and the key numbers
# (grep ALL_DONE). Copy $RESULTS/{pp,tp,scale} into benchmarks/results/raw/<kind>_<gpu>/ and run
# benchmarks/{pp/report_pp,tp/report_tp,scale/report_scale}.py to write the reports.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0
R="${RESULTS:-/tmp/forge_dist_results}"
mkdir -p "$R"
exec > "$R/log" 2>&1
STEPS=" ${STEPS_TO_RUN:-build ctest pp_check tp_check pp_bubble pp_peer pp_socket tp_profile tp_perf} "
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Runs a command with CUDA_VISIBLE_DEVICES=$1 when $1 is not empty (empty: every GPU).
on_gpus() { local g=$1; shift; if [[ -n "$g" ]]; then CUDA_VISIBLE_DEVICES="$g" "$@"; else "$@"; fi; }
BG=""
wait_bg() { if [[ -n "$BG" ]]; then wait "$BG" || true; BG=""; t "background ctest done"; grep -E "tests passed|\(Failed\)|Timeout|Not Run" "$R/ctest.log" | head -20; fi; }
C=${FORGE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}  # the device copy's .git can be stale: pass FORGE_COMMIT
t() { echo "[$(date +%H:%M:%S)] $*"; }
want() { [[ "$STEPS" == *" $1 "* ]]; }
t "start, commit $C, steps:$STEPS"; nvidia-smi --query-gpu=name --format=csv,noheader
if want build; then
  NT=""
  if [[ -f .deps/nccl-tests/src/Makefile ]]; then  # NCCL's own benchmarks, the collectives' yardstick
    # Two builds: one process driving every GPU (-g N), and, where Open MPI is there, one process per
    # GPU under mpirun (*_perf_mpi), the layout forge's ranks have.
    (make -C .deps/nccl-tests/src BUILDDIR=/tmp/nccl-tests-build NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" \
       -j 16 > "$R/nccl_tests_build.log" 2>&1; echo "rc=$?" >> "$R/nccl_tests_build.log"
     mpi_home=$(dirname "$(dirname "$(mpicc --showme:incdirs 2>/dev/null | tr ' ' '\n' | grep -m1 openmpi)/x")" 2>/dev/null)
     [[ -n "$mpi_home" && -d "$mpi_home" ]] && make -C .deps/nccl-tests/src BUILDDIR=/tmp/nccl-tests-build MPI=1 \
       MPI_HOME="$mpi_home" NAME_SUFFIX=_mpi NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" -j 16 \
       >> "$R/nccl_tests_build.log" 2>&1; echo "mpi build rc=$? (MPI_HOME=$mpi_home)" >> "$R/nccl_tests_build.log") &
    NT=$!
  fi
  BUILD_ONLY=1 JOBS="${JOBS:-32}" scripts/gpu-check.sh > "$R/build.log" 2>&1; rc=$?; t "build rc=$rc"
  [[ -n "$NT" ]] && { wait "$NT" || true; t "nccl-tests build: $(tail -1 "$R/nccl_tests_build.log")"; }
  grep -E "error|warning:" "$R/build.log" | head
  [[ $rc == 0 ]] || { tail -30 "$R/build.log"; t ALL_DONE; exit 1; }
fi
if want ctest; then
  run_ctest() {
    (cd build-gpu && timeout 300 ctest -L cuda -R "${CTEST_REGEX:-LinearDeferred|CudaStreams|CudaTensorParallel|Nccl|GraphedTraining|CudaAllocator|CudaLinear|Deferred|CudaModels|CrossEntropy|OpTable|CudaRope|CudaNorm|CudaKvCache}" \
       --output-on-failure -j8 > "$R/ctest.log" 2>&1; t "ctest rc=$?")
  }
  if [[ -n "${CTEST_GPUS:-}" ]]; then
    on_gpus "$CTEST_GPUS" run_ctest & BG=$!
    t "ctest in the background on GPUs $CTEST_GPUS"
  else
    run_ctest; grep -E "tests passed|\(Failed\)|Timeout|Not Run" "$R/ctest.log" | head -20
  fi
fi
if want tp_check; then
  on_gpus "${CHECK_GPUS:-}" env FORGE_COMMIT=$C RAW_DIR=$R/tp PHASES=check timeout 400 benchmarks/tp/run_tp.sh > "$R/tp_check.log" 2>&1
  t "tp check rc=$?"; grep -h '"result"' "$R/tp/equivalence.jsonl" | cut -c1-200
fi
if want pp_check; then
  on_gpus "${CHECK_GPUS:-}" env FORGE_COMMIT=$C RAW_DIR=$R/pp PHASES=check timeout 300 benchmarks/pp/run_pp.sh > "$R/pp_check.log" 2>&1
  t "pp check rc=$?"; grep -h '"result"' "$R/pp/equivalence.jsonl" | cut -c1-200
fi
if want pp_check4; then
  wait_bg
  FORGE_COMMIT=$C RAW_DIR=$R/pp PHASES=check CHECK_PP=4 APPEND=1 CHECK_MODELS="${CHECK4_MODELS:-gpt llama}" \
    timeout 300 benchmarks/pp/run_pp.sh > "$R/pp_check4.log" 2>&1
  t "pp check at pp 4 rc=$?"; grep -h '"pp": 4' "$R/pp/equivalence.jsonl" | cut -c1-200
fi
if want tp_check4; then
  wait_bg
  FORGE_COMMIT=$C RAW_DIR=$R/tp PHASES=check CHECK_TP=4 APPEND=1 CHECK_MODELS="${CHECK4_MODELS_TP:-llama_kv2}" \
    CHECK_OPTIMS="${CHECK4_OPTIMS:-adamw}" timeout 300 benchmarks/tp/run_tp.sh > "$R/tp_check4.log" 2>&1
  t "tp check at tp 4 rc=$?"; grep -h '"tp": 4' "$R/tp/equivalence.jsonl" | cut -c1-200
fi
for ph in bubble peer socket; do
  want pp_$ph || continue
  wait_bg
  FORGE_COMMIT=$C RAW_DIR=$R/pp PHASES=$ph RUN_TIMEOUT=120 PEER_TIMEOUT=200 timeout 900 benchmarks/pp/run_pp.sh > "$R/pp_$ph.log" 2>&1
  t "pp $ph rc=$?"
  [[ $ph == bubble ]] && cat "$R/pp/bubble_fit.txt"
  [[ $ph != bubble ]] && grep -h '"result"' "$R/pp/$ph.jsonl" | cut -c1-300
done
if want tp_profile; then
  wait_bg
  # Where tensor parallelism's step goes, with and without sequence parallelism (the 0.85B LLaMA,
  # batch 8 x 2048): forge's phase timers (FORGE_TRAIN_PHASES), then a CUPTI kernel trace of each
  # rank (benchmarks/step/ktrace.cpp) summarised by benchmarks/step/kernels.py: kernels by kind,
  # NCCL's among them, copies.
  (
    source benchmarks/common.sh
    bench_setup gpu-dist-runs.sh
    WORK="$R/ktrace"; mkdir -p "$WORK"
    KT=0; build_ktrace > "$R/ktrace_build.log" 2>&1 && KT=1
    for v in tp2 tp2_sp; do
      V=(--dist.tp=2); [[ $v == tp2_sp ]] && V+=(--dist.sequence_parallel=true)
      RUN=(configs/llama-0.85b.toml --run.dir=/tmp/forge_profile_runs --run.overwrite=true --train.batch_size=8
           --schedule.warmup_steps=2 --eval.every=0 --checkpoint.at_end=false "${V[@]}")
      FORGE_TRAIN_PHASES=1 OMP_NUM_THREADS=8 timeout 150 "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "${RUN[@]}" \
        --run.name=phases_$v --train.steps=12 --train.log_every=6 > "$R/phases_$v.log" 2>&1
      t "phases $v rc=$?"; grep -iE "phase|^step" "$R/phases_$v.log" | tail -12
      if [[ $KT == 1 ]]; then
        rm -f "$WORK"/ktrace.*.csv
        CUDA_INJECTION64_PATH="$WORK/libktrace.so" FORGE_KTRACE_OUT="$WORK/ktrace.%p.csv" OMP_NUM_THREADS=8 timeout 200 \
          "$FORGE" launch --nproc-per-node 2 -- "$FORGE" train "${RUN[@]}" --run.name=ktrace_$v --train.steps=8 \
          --train.log_every=4 > "$R/ktrace_$v.log" 2>&1
        f=$(find "$WORK" -maxdepth 1 -name 'ktrace.*.csv' -printf '%s %p\n' | sort -rn | sed -n 1p | cut -d' ' -f2-)
        if [[ -n "$f" ]]; then
          gzip -c "$f" > "$R/kernels_$v.csv.gz"
          t "kernels $v:"; "$PY" benchmarks/step/kernels.py "$R/kernels_$v.csv.gz" --steps 8 --skip 3 2>&1 | head -40
        else
          t "kernels $v: no trace"
        fi
      fi
    done
  )
fi
if want tp_perf; then
  wait_bg
  FORGE_COMMIT=$C RAW_DIR=$R/tp REPORT=$R/tp_report.md PHASES=perf STEPS=21 PEER_STEPS=10 PEER_WARMUP=6 \
    WIDE_VARIANTS="${WIDE_VARIANTS:-ddp tp2 tp2_sp}" RUN_TIMEOUT=120 PEER_TIMEOUT=200 timeout 900 benchmarks/tp/run_tp.sh > "$R/tp_perf.log" 2>&1
  t "tp perf rc=$?"
  grep -h '"who"' "$R/tp/perf.jsonl" | cut -c1-300
  # NVLink traffic under tensor parallelism (issue 19): the GPM figures of each run's last interval.
  for f in "$R"/tp/perf_*.metrics.jsonl; do
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'gpu_nvlink_tx_gbps' in l]; print(sys.argv[1].split('/')[-1], {k: r[-1][k] for k in ('gpu_nvlink_tx_gbps','gpu_nvlink_rx_gbps','gpu_sm_active_pct','gpu_tensor_active_pct','gpu_util_pct')} if r else 'no GPM keys')" "$f"
  done
fi
if want step_bench; then
  # The single-GPU rows of the training-step benchmark (issue 15) with a kernel breakdown.
  wait_bg
  CUDA_VISIBLE_DEVICES=0 FORGE_COMMIT=$C BUILD=0 ROWS="${STEP_ROWS:-3}" PROFILE_ROWS="${STEP_PROFILE_ROWS-3}" \
    RAW_DIR=$R/step/raw RESULT_FILE=$R/step/step.md OUT= timeout 900 benchmarks/step/run.sh > "$R/step_bench.log" 2>&1
  t "step bench rc=$?"; grep -E "forge / compile|^\| [0-9] \|" "$R/step/step.md" | head -8
fi
if want hf_checks; then
  # Issue 18 on the GPU machine: transformers and the Python tokenizer references as oracles.
  (cd build-gpu && timeout 300 ctest -R "hf_init_from|hf_parity|CudaKvCache|CudaRope" --output-on-failure \
     > "$R/hf_ctest.log" 2>&1; t "hf ctest rc=$?"; grep -E "tests passed|\(Failed\)|Not Run" "$R/hf_ctest.log")
  ( source benchmarks/common.sh; bench_setup gpu-dist-runs.sh
    [[ -d .deps/root/usr/share/games/fortunes && ! -d /usr/share/games/fortunes ]] &&
      export FORGE_FORTUNES_DIR="$ROOT/.deps/root/usr/share/games/fortunes"
    timeout 300 "$PY" tests/python/hf_export_roundtrip.py --forge "$FORGE" > "$R/hf_roundtrip.log" 2>&1
    t "export -> transformers rc=$?"; cat "$R/hf_roundtrip.log"
    if [[ -d .fixtures/tokenizers ]]; then  # (carry .fixtures: scripts/fetch-tokenizer-fixtures.sh)
      timeout 300 "$PY" benchmarks/tokenizers/oracle.py .fixtures/tokenizers tests/data/tokenizers --check "$R/tokenizer_fills.json" \
        > "$R/tokenizer_oracle.log" 2>&1; t "tokenizer oracle rc=$?"; tail -12 "$R/tokenizer_oracle.log"
    fi
    # forge sample tokens/s with and without the KV cache, 1 and 8 prompts, on the GPU (issue 18).
    FORGE_FORTUNES_DIR="${FORGE_FORTUNES_DIR:-/usr/share/games/fortunes}" FORGE="$FORGE" PY="$PY" DEVICE=cuda TOKENS=256 \
      RESULT="$R/sample_gpu.md" timeout 300 benchmarks/sample/run.sh > "$R/sample_speed.txt" 2>&1
    t "sample bench rc=$?"; cat "$R/sample_speed.txt" )
fi
if want sample_bench; then
  # forge sample beside transformers' generate() on the GPU (issue 18), alone (hf_checks runs it too).
  ( source benchmarks/common.sh; bench_setup gpu-dist-runs.sh
    [[ -d .deps/root/usr/share/games/fortunes && ! -d /usr/share/games/fortunes ]] &&
      export FORGE_FORTUNES_DIR="$ROOT/.deps/root/usr/share/games/fortunes"
    FORGE="$FORGE" PY="$PY" DEVICE=cuda TOKENS=256 RESULT="$R/sample_gpu.md" timeout 300 benchmarks/sample/run.sh \
      > "$R/sample_speed.txt" 2>&1
    t "sample bench rc=$?"; cat "$R/sample_speed.txt" )
fi
if want tb_check; then
  # TensorBoard's own EventAccumulator against a GPU run's metrics.jsonl (issue 19).
  # TB_PARTS picks among "tb trace slow oom top" (default all).
  ( source benchmarks/common.sh; bench_setup gpu-dist-runs.sh
    part() { [[ " ${TB_PARTS:-tb trace slow oom top} " == *" $1 "* ]]; }
    if part tb; then
    timeout 120 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/forge_tb_runs --run.name=tb --train.steps=30 \
      --train.log_every=5 --eval.every=0 --checkpoint.at_end=false > "$R/tb_train.log" 2>&1
    "$PY" tests/python/tensorboard_check.py /tmp/forge_tb_runs/tb 2>&1; t "tensorboard check rc=$?"
    fi
    if part trace; then
    # A step trace on the GPU (telemetry.profile_steps): its host and device tracks.
    timeout 120 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/forge_tb_runs --run.name=trace --train.steps=20 \
      --eval.every=0 --checkpoint.at_end=false --telemetry.profile_steps=10:12 > "$R/trace_train.log" 2>&1
    cp /tmp/forge_tb_runs/trace/trace.rank0.json "$R/" 2>/dev/null
    "$PY" -c "import json,collections; j=json.load(open('$R/trace.rank0.json')); print('trace events by track and name', collections.Counter((e.get('tid'), 'kernel' if e.get('tid') == 3 else e['name'].split(':')[0]) for e in j['traceEvents'] if e['ph']=='X'), j['otherData'].get('kernels'))"
    grep -E "cuda graph" "$R/trace_train.log"
    fi
    if part slow; then
    # A deliberately slow input pipeline (one loader worker, tiny batches): the idle warning.
    timeout 120 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/forge_tb_runs --run.name=slow --train.steps=60 \
      --train.batch_size=1 --train.log_every=10 --eval.every=0 --checkpoint.at_end=false > "$R/slow_train.log" 2>&1
    grep -E "warning: GPU|gpu_util" "$R/slow_train.log" | head -3
    fi
    # A deliberately oversized batch: the out-of-memory error and its snapshot beside the plan.
    if part oom; then
    timeout 120 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/forge_tb_runs --run.name=oom --train.batch_size=512 \
      --train.steps=3 --eval.every=0 --checkpoint.at_end=false > "$R/oom_train.log" 2>&1; t "oom run rc=$? (non-zero expected)"
    grep -E "out of memory|oom_snapshot" "$R/oom_train.log" | cut -c1-400 | head -3
    cp /tmp/forge_tb_runs/oom/oom_snapshot.rank0.json "$R/" 2>/dev/null
    "$PY" -c "import json; j=json.load(open('$R/oom_snapshot.rank0.json')); print('oom owner', j['failed_owner'], j['requested_bytes'], 'live', [(o['owner'], round(o['bytes']/1e9, 2)) for o in j['live_by_owner'][:6]], 'plan', j.get('plan', {}).get('memory_per_gpu_bytes', {}).get('total'), j.get('plan', {}).get('fits'), j.get('plan_error'))"
    fi
    # forge top beside nvidia-smi while a run holds GPU 0 (memory and utilisation should agree).
    # (3000 steps: still training when sampled, ~25 s in; stopped right after.)
    part top || exit 0
    timeout 90 "$FORGE" train configs/gpt2-124m.toml --run.dir=/tmp/forge_tb_runs --run.name=top --train.steps=3000 \
      --train.log_every=100 --eval.every=0 --checkpoint.at_end=false > "$R/top_train.log" 2>&1 &
    TOPRUN=$!
    sleep 25
    "$FORGE" top --once --json > "$R/top.json" 2>&1; t "forge top rc=$?"
    nvidia-smi --query-gpu=index,memory.used,utilization.gpu,power.draw --format=csv | tee "$R/top_nvidia_smi.csv"
    "$FORGE" top --once > "$R/top.txt" 2>&1; cat "$R/top.txt"
    "$PY" -c "import json; j = json.load(open('$R/top.json')); print([(g['index'], g['memory_used_bytes'] // 2**20, g['utilization_pct'], g['power_w'], g['sm_active_pct'], g['tensor_active_pct']) for g in j['gpus']])"
    kill $TOPRUN 2>/dev/null; wait
    grep -E "GPU busy" "$R/top_train.log" | tail -2
    grep -h '"gpu_sm_active_pct"' /tmp/forge_tb_runs/top/metrics.jsonl | tail -1 | cut -c1-600 )
fi
if want scale; then
  wait_bg
  FORGE_COMMIT=$C RAW_DIR=$R/scale PHASES="${SCALE_PHASES:-collectives ddp zero tp pp 3d largest}" \
    NCCL_TESTS_DIR=/tmp/nccl-tests-build timeout "${SCALE_TIMEOUT:-3000}" benchmarks/scale/run_scale.sh > "$R/scale.log" 2>&1
  t "scale rc=$?"
  python3 benchmarks/scale/report_scale.py "$R/scale" > "$R/scale_report.md" 2>&1 || true
fi
wait_bg
t ALL_DONE
