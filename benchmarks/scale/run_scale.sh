#!/usr/bin/env bash
# Scaling on one host of several GPUs (issue 20): every parallel layout forge has, measured at
# the machine's GPU count N (and at the powers of two below it where the phase says so), beside
# PyTorch on the same shapes and forge plan's prediction of each run. Results: $RAW_DIR (default
# benchmarks/results/raw/scale_<gpu>_x<N>/: logs and JSON lines); benchmarks/scale/report_scale.py
# writes benchmarks/results/scale_<gpu>_x<N>.md from them.
#
#   BUILD_ONLY=1 scripts/gpu-check.sh && benchmarks/scale/run_scale.sh
#   PHASES="ddp zero" SCALE_N=4 benchmarks/scale/run_scale.sh
#
# Phases (PHASES, run in the order given; default all, in this order):
#   collectives  forge bench collectives on N GPUs (all_reduce, all_gather, reduce_scatter,
#                all_to_all; 8 B .. 1 GiB, bf16) and, where NCCL_TESTS_DIR holds nccl-tests'
#                binaries (scripts/gpu-dist-runs.sh builds them from .deps/nccl-tests), NCCL's own
#                all_reduce_perf, all_gather_perf, reduce_scatter_perf and alltoall_perf on the same
#                sizes (one process, -g N), whose bus bandwidth forge's is set against
#   ddp          GPT-2 124M (configs/gpt2-124m.toml): forge on 1, 2, .., N GPUs at 16 sequences per
#                GPU; PyTorch (DDP, torch.compile) on 1 and N (PEER_WORLDS); scaling efficiency =
#                tokens/s / (GPUs x one GPU's tokens/s)
#   zero         the 0.85B LLaMA (configs/llama-0.85b.toml), 4 x 2048 tokens per GPU: forge on 1 GPU,
#                and on N under ZeRO stage ZERO_STAGES ("0 1 2 3"); PyTorch on 1 GPU, DDP, FSDP2 as
#                ZeRO-2 (reshard_after_forward=False) and as ZeRO-3 (PEER_FSDP), compiled
#   tp           the 0.85B LLaMA, 8 x 2048 tokens per step: forge tp = t for t in TP_DEGREES ("2 N"),
#                with and without sequence parallelism; PyTorch tp = N (+ sp), compiled blocks
#   pp           the 0.85B LLaMA at pp = N (dp 1), micro-batches of 2, K in PP_KS ("8 16"), every
#                schedule in PP_SCHEDS; ms = a K + b fitted per schedule, the bubble beside theory
#   3d           the 0.85B LLaMA, 16 x 2048 tokens per step, on the layouts LAYOUTS ("dp2.tp2
#                tp2.pp2 dp2.pp2" on 4 GPUs; 8: "dp2.tp2.pp2 dp4.tp2 tp2.pp4 dp2.pp4 tp4.pp2")
#   largest      LLaMA of width 4096 (32/8 heads, FFN 11008, vocabulary 32000, 2048 tokens, one
#                sequence per micro-batch, full activation checkpointing): forge plan's largest
#                depth that fits each of LARGEST_LAYOUTS ("z3 tp<N> pp<N>"), then forge train at that
#                depth (should train) and at LARGEST_OVER (15%) more layers (should not fit)
# Every forge run records its last two logging intervals (tokens/s, ms/step, MFU), its peak memory
# (the largest of its ranks; per stage for pipelines) and forge plan's prediction for that run
# (memory: the subtotal, bytes in tensors, which is what the peak measures; the total adds the
# allocator margin and the runtime reserve, and decides whether it fits).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
source benchmarks/common.sh
bench_setup run_scale.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NGPU=$(nvidia-smi -L | wc -l)
N="${SCALE_N:-$NGPU}"
[[ "$N" -ge 2 && "$N" -le "$NGPU" ]] || { echo "run_scale.sh: SCALE_N=$N, but this machine has $NGPU GPUs (need 2..$NGPU)"; exit 2; }
PHASES="${PHASES:-collectives ddp zero tp pp 3d largest}"
RAW="${RAW_DIR:-benchmarks/results/raw/scale_${GPU}_x$N}"
RUNS="${RUNS_DIR:-/tmp/forge_scale_runs}"
mkdir -p "$RAW" "$RUNS"
PLAN_GPU=h100; [[ "$GPU" == *H200* ]] && PLAN_GPU=h200
WORLDS=""; for ((w = 1; w <= N; w *= 2)); do WORLDS+="$w "; done
{ [[ -n "${FORGE_COMMIT:-}" ]] && echo "$FORGE_COMMIT" || git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; } > "$RAW/commit.txt"
nvidia-smi topo -m > "$RAW/topology.txt" 2>&1 || true
nvidia-smi --query-gpu=index,name,memory.total,power.limit,clocks.max.sm --format=csv > "$RAW/gpus.csv" 2>&1 || true
echo "run_scale: $GPU x $N (of $NGPU), phases: $PHASES, commit $(cat "$RAW/commit.txt")"

# ---- helpers ------------------------------------------------------------------------------------
# The figures of a finished forge run: the last two logging intervals, the peak memory (largest rank;
# per pipeline stage), MFU, loss.
summarize() {  # RUN_DIR
  "$PY" - "$1" <<'PYEOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")]
fin = [r for r in recs if r.get("final")]
last = prog[-2:]
print(json.dumps({"tokens_per_s": sum(r["tokens_per_s"] for r in last) / len(last),
                  "ms_per_step": sum(r["ms_per_step"] for r in last) / len(last),
                  "mfu": last[-1].get("mfu"), "loss": last[-1].get("loss"),
                  "mem_bytes": max(r.get("mem_bytes", 0) for r in prog),
                  "mem_bytes_max": fin[-1].get("mem_bytes_max") if fin else None,
                  "mem_bytes_per_stage": fin[-1].get("mem_bytes_per_stage") if fin else None}))
PYEOF
}
why_failed() {  # LOG -> a short reason, JSON-safe
  local r
  r=$(grep -aiE "out of memory|error|what\(\)" "$1" 2>/dev/null | grep -v "^ *$" | tail -1 | tr -d '"\\' | tr -s ' ' | cut -c1-220)
  echo "${r:-see $(basename "$1")}"
}
# forge train on WORLD GPUs (forge launch for more than one) -> the summary JSON, or an error.
forge_run() {  # NAME WORLD [forge train arguments...]
  local name=$1 world=$2; shift 2
  local cmd=("$FORGE" train)
  [[ "$world" -gt 1 ]] && cmd=("$FORGE" launch --nproc-per-node "$world" -- "$FORGE" train)
  if OMP_NUM_THREADS=4 timeout "${RUN_TIMEOUT:-240}" "${cmd[@]}" "$@" --run.dir="$RUNS" --run.overwrite=true \
       --run.name="$name" --eval.every=0 --checkpoint.at_end=false > "$RAW/$name.log" 2>&1; then
    summarize "$RUNS/$name" || echo '{"error": "no summary"}'
  else
    local rc=$? oom=false
    grep -qaiE "out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED" "$RAW/$name.log" && oom=true
    echo "{\"error\": \"exit $rc: $(why_failed "$RAW/$name.log")\", \"oom\": $oom}"
  fi
}
# forge plan of a run -> its memory, fit and time (one JSON line).
plan_run() {  # forge plan arguments...
  "$FORGE" plan --gpu "$PLAN_GPU" --json "$@" 2>"$RAW/plan_last.err" | "$PY" -c "
import json, sys
j = json.load(sys.stdin)
m, t = j['memory'], j['time']
print(json.dumps({'mem_total': m['total'], 'mem_subtotal': m['subtotal'], 'fits': m['fits'],
                  'mem_total_per_stage': [s['total'] for s in m.get('per_stage', [])],
                  'mem_subtotal_per_stage': [s['subtotal'] for s in m.get('per_stage', [])],
                  'params': j['parameters'].get('total') if isinstance(j.get('parameters'), dict) else None,
                  'step_s': t['step'], 'tokens_per_s': t['tokens_per_s'], 'mfu': t.get('mfu'),
                  'bubble_s': t.get('bubble')}))" 2>/dev/null || echo "{\"error\": \"plan failed: $(tr -d '"\\' < "$RAW/plan_last.err" | tail -1 | cut -c1-200)\"}"
}
# PyTorch on WORLD GPUs (torchrun for more than one): benchmarks/step/torch_peer.py -> its JSON.
peer_run() {  # NAME WORLD [torch_peer.py arguments...]
  local name=$1 world=$2; shift 2
  local cmd=("$PY" benchmarks/step/torch_peer.py)
  [[ "$world" -gt 1 ]] && cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$world" benchmarks/step/torch_peer.py)
  if timeout "${PEER_TIMEOUT:-300}" "${cmd[@]}" "$@" --json "$RAW/$name.json" > "$RAW/$name.log" 2>&1; then
    "$PY" -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))" "$RAW/$name.json"
  else
    echo "{\"error\": \"exit $?: $(why_failed "$RAW/$name.log")\"}"
  fi
}
record() {  # FILE JSON
  echo "$2" | tee -a "$RAW/$1.jsonl"
}

# ---- collectives --------------------------------------------------------------------------------
run_collectives() {
  echo "== collectives on $N GPUs: forge bench collectives and nccl-tests"
  OPS="all_reduce all_gather reduce_scatter all_to_all"
  timeout 300 "$FORGE" launch --no-prefix --nproc-per-node "$N" -- "$FORGE" bench collectives --device cuda \
    --ops "${OPS// /,}" --sizes "${COLL_SIZES:-8..1G}" --dtype bf16 --json > "$RAW/collectives_forge.json" \
    2> "$RAW/collectives_forge.log" || echo "   forge bench collectives FAILED (see collectives_forge.log)"
  if [[ -n "${NCCL_TESTS_DIR:-}" && -x "${NCCL_TESTS_DIR}/all_reduce_perf" ]]; then
    for op in $OPS; do
      bin="${op//_/}_perf"; [[ $op == all_reduce ]] && bin=all_reduce_perf
      [[ $op == all_gather ]] && bin=all_gather_perf
      [[ $op == reduce_scatter ]] && bin=reduce_scatter_perf
      [[ $op == all_to_all ]] && bin=alltoall_perf
      # -b/-e/-f: 8 B .. 1 GiB in x2 steps; -g N: one process drives the N GPUs; bf16; 5 warm-up and
      # 20 timed iterations (forge's defaults); -c 0: no data check inside the timing.
      timeout 300 "$NCCL_TESTS_DIR/$bin" -b 8 -e "${COLL_MAX:-1G}" -f 2 -g "$N" -d bfloat16 -w 5 -n 20 -c 0 \
        > "$RAW/nccltests_$op.txt" 2>&1 || echo "   nccl-tests $bin FAILED"
      # One process per GPU (as forge's ranks are), where the MPI build exists.
      if [[ -x "$NCCL_TESTS_DIR/${bin}_mpi" ]]; then
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 mpirun --allow-run-as-root --oversubscribe \
          -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$NCCL_TESTS_DIR/${bin}_mpi" -b 8 -e "${COLL_MAX:-1G}" -f 2 -g 1 \
          -d bfloat16 -w 5 -n 20 -c 0 > "$RAW/nccltests_mpi_$op.txt" 2>&1 || echo "   nccl-tests ${bin}_mpi FAILED"
      fi
    done
  else
    echo "   (no nccl-tests binaries in NCCL_TESTS_DIR='${NCCL_TESTS_DIR:-}': forge's figures stand alone)"
  fi
  "$PY" benchmarks/scale/report_scale.py --collectives "$RAW" || true
}

# ---- ddp: GPT-2 124M ----------------------------------------------------------------------------
run_ddp() {
  echo "== GPT-2 124M, data parallel on $WORLDS GPU(s), 16 sequences per GPU"
  G=(configs/gpt2-124m.toml --train.steps="${DDP_STEPS:-40}" --train.log_every=10)
  for w in $WORLDS; do
    r=$(forge_run ddp_gpt2_x$w "$w" "${G[@]}" --train.batch_size=$((16 * w)))
    p=$(plan_run --config configs/gpt2-124m.toml --gpus "$w" --dp "$w" --micro-batch 16 --batch $((16 * w)))
    record ddp "{\"model\": \"gpt2-124m\", \"who\": \"forge\", \"layout\": \"ddp\", \"gpus\": $w, \"result\": $r, \"plan\": $p}"
  done
  for w in ${PEER_WORLDS:-1 $N}; do
    r=$(peer_run peer_ddp_gpt2_x$w "$w" --config configs/gpt2-124m.toml --mode "${PEER_MODE:-compile}" --batch 16 \
          --steps "${PEER_STEPS:-15}" --warmup "${PEER_WARMUP:-8}")
    record ddp "{\"model\": \"gpt2-124m\", \"who\": \"pytorch\", \"layout\": \"ddp\", \"gpus\": $w, \"result\": $r}"
  done
}

# ---- zero: the 0.85B LLaMA ------------------------------------------------------------------------
run_zero() {
  echo "== LLaMA 0.85B, 4 x 2048 tokens per GPU: 1 GPU, and ZeRO stages ${ZERO_STAGES:-0 1 2 3} on $N GPUs"
  L=(configs/llama-0.85b.toml --train.steps="${ZERO_STEPS:-20}" --train.log_every=5 --schedule.warmup_steps=2)
  r=$(forge_run zero_llama_x1 1 "${L[@]}" --train.batch_size=4)
  p=$(plan_run --config configs/llama-0.85b.toml --gpus 1 --micro-batch 4 --batch 4)
  record zero "{\"model\": \"llama-0.85b\", \"who\": \"forge\", \"layout\": \"1gpu\", \"zero\": 0, \"gpus\": 1, \"result\": $r, \"plan\": $p}"
  for z in ${ZERO_STAGES:-0 1 2 3}; do
    r=$(forge_run zero_llama_z${z}_x$N "$N" "${L[@]}" --train.batch_size=$((4 * N)) --dist.zero_stage=$z)
    p=$(plan_run --config configs/llama-0.85b.toml --gpus "$N" --dp "$N" --zero "$z" --micro-batch 4 --batch $((4 * N)))
    record zero "{\"model\": \"llama-0.85b\", \"who\": \"forge\", \"layout\": \"zero$z\", \"zero\": $z, \"gpus\": $N, \"result\": $r, \"plan\": $p}"
  done
  PA=(--config configs/llama-0.85b.toml --mode "${PEER_MODE:-compile}" --batch 4 --steps "${PEER_STEPS:-12}" --warmup "${PEER_WARMUP:-6}")
  r=$(peer_run peer_zero_llama_x1 1 "${PA[@]}")
  record zero "{\"model\": \"llama-0.85b\", \"who\": \"pytorch\", \"layout\": \"1gpu\", \"gpus\": 1, \"result\": $r}"
  for v in ${PEER_FSDP:-ddp zero2 zero3}; do
    F=(); [[ $v != ddp ]] && F=(--fsdp "$v")
    r=$(peer_run peer_zero_llama_${v}_x$N "$N" "${PA[@]}" "${F[@]}")
    record zero "{\"model\": \"llama-0.85b\", \"who\": \"pytorch\", \"layout\": \"$( [[ $v == ddp ]] && echo ddp || echo fsdp2_$v )\", \"gpus\": $N, \"result\": $r}"
  done
}

# ---- tp ----------------------------------------------------------------------------------------
run_tp() {
  degrees=$(echo ${TP_DEGREES:-2 $N} | tr ' ' '\n' | sort -nu | tr '\n' ' ')
  echo "== LLaMA 0.85B, tensor parallel at tp = $degrees, 8 x 2048 tokens per step"
  T=(configs/llama-0.85b.toml --train.batch_size=8 --train.steps="${TP_STEPS:-20}" --train.log_every=5 --schedule.warmup_steps=2)
  for t in $degrees; do
    for sp in false true; do
      SPP=(--no-sp); [[ $sp == true ]] && SPP=(--sp)
      r=$(forge_run tp_llama_tp${t}_sp$sp "$t" "${T[@]}" --dist.tp="$t" --dist.sequence_parallel=$sp)
      p=$(plan_run --config configs/llama-0.85b.toml --gpus "$t" --tp "$t" --dp 1 "${SPP[@]}" --micro-batch 8 --batch 8)
      record tp "{\"model\": \"llama-0.85b\", \"who\": \"forge\", \"layout\": \"tp$t$( [[ $sp == true ]] && echo _sp )\", \"tp\": $t, \"sp\": $sp, \"gpus\": $t, \"result\": $r, \"plan\": $p}"
    done
  done
  for sp in ${PEER_TP_SP:-false true}; do
    S=(); [[ $sp == true ]] && S=(--sp)
    r=$(peer_run peer_tp_llama_tp${N}_sp$sp "$N" --config configs/llama-0.85b.toml --mode "${PEER_MODE:-compile}" --batch 8 \
          --tp "$N" "${S[@]}" --steps "${PEER_STEPS:-12}" --warmup "${PEER_WARMUP:-6}")
    record tp "{\"model\": \"llama-0.85b\", \"who\": \"pytorch\", \"layout\": \"tp$N$( [[ $sp == true ]] && echo _sp )\", \"tp\": $N, \"sp\": $sp, \"gpus\": $N, \"result\": $r}"
  done
}

# ---- pp ----------------------------------------------------------------------------------------
run_pp() {
  echo "== LLaMA 0.85B, pipeline parallel at pp = $N, micro-batches of 2, K = ${PP_KS:-8 16}"
  for sched in ${PP_SCHEDS:-1f1b gpipe zb-h1 interleaved}; do
    for K in ${PP_KS:-8 16}; do
      VS=(); VP=(); [[ $sched == interleaved ]] && VS=(--dist.pp_virtual_stages=2) && VP=(--virtual-stages 2)
      r=$(forge_run pp_llama_pp${N}_${sched}_k$K "$N" configs/llama-0.85b.toml --train.batch_size=$((2 * K)) \
            --train.grad_accum="$K" --train.steps="${PP_STEPS:-12}" --train.log_every=4 --schedule.warmup_steps=2 \
            --dist.pp="$N" --dist.pp_schedule="$sched" "${VS[@]}")
      p=$(plan_run --config configs/llama-0.85b.toml --gpus "$N" --pp "$N" --dp 1 --micro-batch 2 --grad-accum "$K" \
            --batch $((2 * K)) --schedule "$sched" "${VP[@]}")
      record pp "{\"model\": \"llama-0.85b\", \"who\": \"forge\", \"layout\": \"pp$N\", \"pp\": $N, \"schedule\": \"$sched\", \"K\": $K, \"micro\": 2, \"gpus\": $N, \"result\": $r, \"plan\": $p}"
    done
  done
}

# ---- 3d ----------------------------------------------------------------------------------------
run_three_d() {
  if [[ -z "${LAYOUTS:-}" ]]; then
    case $N in
      4) LAYOUTS="dp2.tp2 tp2.pp2 dp2.pp2" ;;
      8) LAYOUTS="dp2.tp2.pp2 dp4.tp2 tp2.pp4 dp2.pp4 tp4.pp2" ;;
      *) LAYOUTS="" ;;
    esac
  fi
  echo "== LLaMA 0.85B, 16 x 2048 tokens per step, layouts: ${LAYOUTS:-none for $N GPUs}"
  for lay in $LAYOUTS; do
    dp=1 tp=1 pp=1
    for part in ${lay//./ }; do
      case $part in dp*) dp=${part#dp} ;; tp*) tp=${part#tp} ;; pp*) pp=${part#pp} ;; esac
    done
    [[ $((dp * tp * pp)) -eq $N ]] || { echo "   layout $lay is not $N GPUs: skipped"; continue; }
    B=16; micro=$((B / dp)); K=1
    [[ $pp -gt 1 ]] && micro=2 && K=$((B / (2 * dp)))
    r=$(forge_run 3d_llama_$lay "$N" configs/llama-0.85b.toml --train.batch_size=$B --train.grad_accum=$K \
          --train.steps="${LAYOUT_STEPS:-12}" --train.log_every=4 --schedule.warmup_steps=2 --dist.tp=$tp --dist.pp=$pp \
          --dist.sequence_parallel=false)
    p=$(plan_run --config configs/llama-0.85b.toml --gpus "$N" --dp $dp --tp $tp --pp $pp --no-sp --micro-batch $micro \
          --grad-accum $K --batch $B)
    record 3d "{\"model\": \"llama-0.85b\", \"who\": \"forge\", \"layout\": \"$lay\", \"dp\": $dp, \"tp\": $tp, \"pp\": $pp, \"micro\": $micro, \"K\": $K, \"gpus\": $N, \"result\": $r, \"plan\": $p}"
  done
}

# ---- largest -----------------------------------------------------------------------------------
run_largest() {
  WIDE=(--arch llama --width 4096 --heads 32 --kv-heads 8 --ffn 11008 --vocab 32000 --seq 2048 --checkpointing full)
  for lay in ${LARGEST_LAYOUTS:-z3 tp$N pp$N}; do
    case $lay in
      z*) LP=(--dp "$N" --zero "${lay#z}" --micro-batch 1 --batch "$N"); LF=(--dist.zero_stage="${lay#z}" --train.batch_size="$N") ;;
      tp*) LP=(--tp "${lay#tp}" --dp $((N / ${lay#tp})) --no-sp --micro-batch 1 --batch $((N / ${lay#tp})))
           LF=(--dist.tp="${lay#tp}" --dist.sequence_parallel=false --train.batch_size=$((N / ${lay#tp}))) ;;
      pp*) LP=(--pp "${lay#pp}" --dp $((N / ${lay#pp})) --micro-batch 1 --grad-accum 8 --batch $((8 * N / ${lay#pp})))
           LF=(--dist.pp="${lay#pp}" --train.grad_accum=8 --train.batch_size=$((8 * N / ${lay#pp}))) ;;
      *) echo "   unknown layout $lay"; continue ;;
    esac
    # forge plan's largest depth that fits (memory.fits is monotone in the depth).
    best=$("$PY" - "$FORGE" "$PLAN_GPU" "$N" "${WIDE[@]}" "${LP[@]}" <<'PYEOF'
import json, subprocess, sys
forge, gpu, n, rest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def fits(layers):
    out = subprocess.run([forge, "plan", "--gpu", gpu, "--gpus", n, "--layers", str(layers), "--json", *rest],
                         capture_output=True, text=True)
    return out.returncode == 0 and json.loads(out.stdout)["memory"]["fits"]
lo, hi = 0, 8  # (fewer layers than pipeline stages is an error: "does not fit")
while fits(hi) and hi < 4096:
    lo, hi = hi, hi * 2
while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
print(lo)
PYEOF
)
    if [[ "$best" -lt 1 ]]; then echo "   $lay: forge plan fits no depth"; continue; fi
    over=$(( best + (best * ${LARGEST_OVER:-15} + 99) / 100 ))
    for layers in $best $over; do
      r=$(RUN_TIMEOUT=${LARGEST_TIMEOUT:-300} forge_run largest_${lay}_L$layers "$N" configs/llama-0.85b.toml --model.dim=4096 \
            --model.n_layer=$layers --model.n_head=32 --model.n_kv_head=8 --model.ffn_hidden=11008 \
            --model.checkpoint_activations=true --train.steps=4 --train.log_every=2 --schedule.warmup_steps=1 "${LF[@]}")
      p=$(plan_run "${WIDE[@]}" --gpus "$N" --layers "$layers" "${LP[@]}")
      record largest "{\"model\": \"llama-4096x$layers\", \"who\": \"forge\", \"layout\": \"$lay\", \"layers\": $layers, \"plan_largest_layers\": $best, \"gpus\": $N, \"result\": $r, \"plan\": $p}"
    done
  done
}

for ph in $PHASES; do
  case $ph in
    collectives|ddp|zero|tp|pp|largest) "run_$ph" ;;
    3d) run_three_d ;;
    *) echo "run_scale.sh: unknown phase '$ph' (collectives ddp zero tp pp 3d largest)"; exit 2 ;;
  esac
done
echo "run_scale: done; raw results in $RAW"
