#!/usr/bin/env bash
# A cluster job's life on the CPU, without Slurm (docs/train.md, "Long runs"): the same
# `forge train` command is started, preempted at a random moment (SIGTERM, SIGUSR1 - Slurm's
# --signal - or kill -9), and "requeued" (started again, unchanged), PREEMPTIONS times; then it
# runs to the end. Every step's loss is then compared with an uninterrupted run of the same
# config: they must be equal, bit for bit (the CPU's arithmetic is deterministic).
#
#   scripts/simulate-preemption.sh [--forge build/forge] [--steps 400] [--preemptions 4]
#                                  [--ranks 1] [--seed 1] [--dir DIR] [--keep]
#                                  [--device cpu|cuda] [--args "--section.key=value ..."]
#
# --ranks R > 1 starts the command under `forge launch --nproc-per-node R` (CPU ranks: mpirun)
# and signals the launcher, as Slurm signals a job's batch script. kill -9 loses the steps since
# the latest checkpoint (checkpoint.every = 25 here); a signal loses none. --device cuda trains on
# the GPU in bf16 with run.deterministic = true (what makes a GPU run repeat bit for bit); --args
# adds config overrides after the defaults (e.g. a larger model). Exit 0 when every loss matches;
# 1 with the first difference otherwise.
set -euo pipefail
FORGE=build/forge STEPS=400 PREEMPTIONS=4 RANKS=1 SEED=1 DIR="" KEEP=0 DEVICE=cpu EXTRA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --forge) FORGE=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --preemptions) PREEMPTIONS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --device) DEVICE=$2; shift 2 ;;
    --args) EXTRA=$2; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) echo "simulate-preemption: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
FORGE=$(cd "$(dirname "$FORGE")" && pwd)/$(basename "$FORGE")
[ -x "$FORGE" ] || { echo "simulate-preemption: no forge executable at $FORGE (build it: make build)" >&2; exit 2; }
if [ -z "$DIR" ]; then DIR=$(mktemp -d "${TMPDIR:-/tmp}/forge_preempt.XXXXXX"); fi
mkdir -p "$DIR"
[ "$KEEP" = 1 ] || trap 'rm -rf "$DIR"' EXIT
RANDOM=$SEED
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_orte_tmpdir_base="$DIR"
printf '# every key comes from the command line (scripts/simulate-preemption.sh)\n' > "$DIR/empty.toml"

# The job's command: a small GPT on random tokens, AdamW, a checkpoint every 25 steps.
args() {  # $1 = run name
  local placement="--run.device=cpu --run.dtype=f32"
  [ "$DEVICE" = cuda ] && placement="--run.device=cuda --run.dtype=bf16 --run.deterministic=true"
  echo "train $DIR/empty.toml --run.dir=$DIR --run.name=$1 $placement --model.type=gpt" \
       "--model.vocab_size=256 --model.block_size=16 --model.n_layer=2 --model.n_head=4 --model.n_embd=64" \
       "--data.source=random --train.steps=$STEPS --train.batch_size=8 --train.seq_len=16 --train.log_every=1" \
       "--optim.name=adamw --optim.lr=1e-3 --schedule.warmup_steps=10 --eval.every=0 --checkpoint.every=25 $EXTRA"
}
command_of() {  # $1 = run name
  if [ "$RANKS" -gt 1 ]; then
    echo "$FORGE launch --nproc-per-node $RANKS --device $DEVICE -- $FORGE $(args "$1")"
  else
    echo "$FORGE $(args "$1")"
  fi
}
last_step() {  # the largest step with a loss in a run's metrics (a line being written is skipped)
  python3 - "$DIR/$1/metrics.jsonl" <<'PY'
import json, sys
step = 0
try:
    for line in open(sys.argv[1]):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "loss" in r:
            step = max(step, r["step"])
except FileNotFoundError:
    pass
print(step)
PY
}

kill_session() {  # SIGKILL to every process of session $1 (mpirun and its ranks included)
  local sid=$1 stat rest
  for stat in /proc/[0-9]*/stat; do
    rest=$(cat "$stat" 2>/dev/null) || continue
    rest=${rest##*) }   # the fields after "(comm)": state ppid pgrp session ...
    set -- $rest
    [ "${4:-}" = "$sid" ] && kill -KILL "${stat//[!0-9]/}" 2>/dev/null
  done
  return 0
}

echo "simulate-preemption: $STEPS steps, $PREEMPTIONS preemptions, $RANKS rank(s) on $DEVICE, seed $SEED, in $DIR${EXTRA:+, with $EXTRA}"
$(command_of reference) > "$DIR/reference.log" 2>&1 || { cat "$DIR/reference.log"; exit 1; }

signals=(TERM USR1 KILL)
sig=""
preempted=0
start=0
for ((k = 1; ; k++)); do
  # A session of its own, as a job's processes are: kill -9 takes them all (Slurm kills the job's
  # cgroup), while a signal goes to the command alone (Slurm's --signal=B: to the batch script).
  setsid $(command_of job) >> "$DIR/job.log" 2>&1 &
  pid=$!
  if [ "$k" -le "$PREEMPTIONS" ]; then
    # Preempt once the run has made some progress past where it started: 5 to 60 steps.
    target=$((start + 5 + RANDOM % 56))
    while kill -0 "$pid" 2>/dev/null && [ "$(last_step job)" -lt "$target" ]; do sleep 0.05; done
    sig=${signals[$(( (k - 1) % ${#signals[@]} ))]}
    if [ "$sig" = KILL ]; then kill_session "$pid"; else kill -"$sig" "$pid" 2>/dev/null || true; fi
  fi
  rc=0
  wait "$pid" || rc=$?
  now=$(last_step job)
  echo "simulate-preemption: start $k: exit $rc at step $now${sig:+ (SIG$sig)}"
  # A signal that lands after the last step, while the finished run exits (its handlers gone),
  # ends it by the signal's default action: the run was complete (the check below compares every
  # step). Seen once on a loaded 2-core machine, where this loop polled too late.
  if [ "$rc" -gt 128 ] && [ "$rc" -ne 137 ] && [ "$now" -ge "$STEPS" ]; then
    echo "simulate-preemption: start $k: the signal came after the last step; the run had finished"
    break
  fi
  case "$rc" in
    0) break ;;
    75|137) start=$now; sig=""; preempted=$((preempted + 1)) ;;   # stopped with a checkpoint / killed: requeue
    *) echo "simulate-preemption: start $k failed with $rc:" >&2; tail -20 "$DIR/job.log" >&2; exit 1 ;;
  esac
  [ "$k" -le $((PREEMPTIONS + 2)) ] || { echo "simulate-preemption: the run does not end" >&2; exit 1; }
done

[ "$preempted" -eq "$PREEMPTIONS" ] ||
  echo "simulate-preemption: only $preempted of $PREEMPTIONS preemptions happened (the run ended first: raise --steps)"
python3 - "$DIR/reference/metrics.jsonl" "$DIR/job/metrics.jsonl" "$STEPS" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)  # a torn line would fail here: forge removes them when it continues
        if "loss" in r and not r.get("skipped"):
            out[r["step"]] = r["loss"]
    return out
ref, job, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
assert sorted(ref) == list(range(1, steps + 1)), "the reference run is incomplete"
if sorted(job) != sorted(ref):
    print(f"simulate-preemption: the job logged steps {min(job)}..{max(job)} ({len(job)}), not 1..{steps}")
    sys.exit(1)
bad = [s for s in ref if job[s] != ref[s]]
if bad:
    s = bad[0]
    print(f"simulate-preemption: {len(bad)} losses differ; first at step {s}: {job[s]!r} vs {ref[s]!r}")
    sys.exit(1)
print(f"simulate-preemption: all {steps} losses equal the uninterrupted run's, bit for bit")
PY
