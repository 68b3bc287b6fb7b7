#!/usr/bin/env bash
# Nsight Compute on chosen kernels of short forge trainings (issue 15: why a memory-bound kernel
# runs below bandwidth). Needs a build (scripts/gpu-check.sh BUILD_ONLY=1) and ncu on the PATH or
# in /usr/local/cuda/bin. Clocks are left alone (--clock-control none, METHOD.md). The runs go
# without CUDA graphs (ncu profiles launches) and skip the first step's launches (GEMM tuning).
# NCU_LIST holds entries separated by ';', each "name|row|kernel regex|skip|count|VAR=value ...":
#   row: gpt2 (configs/gpt2-124m.toml, batch 16) or llama (configs/llama-0.85b.toml, batch 4)
#   regex: matched against demangled names (template arguments included)
#   skip, count: matching launches skipped, then profiled
# Output in RESULTS (default /tmp/forge_ncu): ncu_<name>.csv (ncu --csv --page details) and
# ncu_<name>.log; a digest of each kernel (duration, DRAM throughput, achieved occupancy,
# registers, top stall) in digest.txt.
#   NCU_LIST='rope|llama|rope_kernel|64|4' scripts/gpu-ncu.sh
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
export NCCL_NVLS_ENABLE=0
R="${RESULTS:-/tmp/forge_ncu}"; mkdir -p "$R"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[[ -d .deps/root/usr/lib/x86_64-linux-gnu ]] &&
  export LD_LIBRARY_PATH="$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN=${FORGE_BIN:-$ROOT/build-gpu/forge}
IFS=';' read -r -a entries <<< "${NCU_LIST:-}"
for entry in "${entries[@]}"; do
  [[ -z "$entry" ]] && continue
  IFS='|' read -r name row regex skip count envs <<< "$entry"
  case $row in
    gpt2) cfg=(configs/gpt2-124m.toml --train.batch_size=16) ;;
    llama) cfg=(configs/llama-0.85b.toml --train.batch_size=4 --eval.every=0) ;;
    *) echo "gpu-ncu.sh: unknown row '$row' (gpt2, llama)"; continue ;;
  esac
  read -r -a ev <<< "${envs:-}"
  env "${ev[@]}" timeout "${NCU_TIMEOUT:-150}" "$NCU" --clock-control none --kernel-name-base demangled \
    -k "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --csv --page details \
    "$BIN" train "${cfg[@]}" --run.cuda_graph=false --run.overwrite=true --train.steps=3 --train.log_every=1 \
    --checkpoint.at_end=false --run.dir=/tmp/ncu_runs --run.name="$name" > "$R/ncu_$name.csv" 2> "$R/ncu_$name.log"
  echo "ncu $name rc=$?"
done
python3 - "$R" <<'PY' | tee "$R/digest.txt"
import csv, glob, io, os, re, sys
want = ["Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput", "Achieved Occupancy",
        "Theoretical Occupancy", "Registers Per Thread", "Block Size", "Grid Size", "Eligible Warps Per Scheduler",
        "Issued Warp Per Scheduler", "Warp Cycles Per Issued Instruction", "L2 Hit Rate", "L1/TEX Hit Rate",
        "Dynamic Shared Memory Per Block", "Waves Per SM"]
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ncu_*.csv"))):
    text = open(f, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        print(f"{os.path.basename(f)}: no rows"); continue
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    by = {}
    for r in rows:
        k = (r["ID"], r["Kernel Name"][:110])
        by.setdefault(k, {})[r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
    print(f"== {os.path.basename(f)}")
    for (i, n), m in by.items():
        print(f"  [{i}] {n}")
        print("     " + "; ".join(f"{w}: {m[w]}" for w in want if w in m))
PY
