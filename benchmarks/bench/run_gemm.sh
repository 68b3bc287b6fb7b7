#!/usr/bin/env bash
# GEMM throughput: `forge bench gemm` (cuBLASLt through forge) against torch.matmul, same GPU,
# same method (CUDA events, median of REPEATS runs after warm-up; docs/bench.md).
#
#   benchmarks/bench/run_gemm.sh                       # after scripts/gpu-check.sh built build-gpu/
#   BUILD_DIR=build-gpu SIZES=128..4096 DTYPES=bf16,f16 REPEATS=20 benchmarks/bench/run_gemm.sh
#
# Writes benchmarks/results/bench_gemm_<gpu>.md (forge TFLOP/s, torch TFLOP/s, forge/torch per
# (dtype, size), and forge's % of the datasheet dense peak) and the two raw JSONs beside it in raw/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SIZES="${SIZES:-128..16384}"
DTYPES="${DTYPES:-f32,tf32,bf16,f16}"
REPEATS="${REPEATS:-20}"
source benchmarks/common.sh
bench_setup run_gemm.sh
RAW="benchmarks/results/raw"
mkdir -p "$RAW"
FORGE_JSON="$RAW/bench_gemm_forge_$GPU.json"
TORCH_JSON="$RAW/bench_gemm_torch_$GPU.json"
OUT="benchmarks/results/bench_gemm_$GPU.md"
echo "bench gemm: $GPU, forge $FORGE, python $PY, sizes $SIZES, dtypes $DTYPES, repeats $REPEATS"

"$FORGE" bench gemm --device cuda --sizes "$SIZES" --dtype "$DTYPES,fp8" --repeats "$REPEATS" --json > "$FORGE_JSON"
# GRAPH=N (default 10): the torch side's products timed N to a CUDA graph replay, so that its small
# sizes are not timed with Python's dispatch (forge queues its runs from C++); GRAPH=0: events per call.
"$PY" benchmarks/bench/gemm_vs_torch.py --sizes "$SIZES" --dtype "$DTYPES" --repeats "$REPEATS" --graph "${GRAPH:-10}" > "$TORCH_JSON"

"$PY" - "$FORGE_JSON" "$TORCH_JSON" "$OUT" <<'PYEOF'
import json, sys
forge, torch_, out = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
key = lambda r: (r["dtype"], r["m"], r["n"], r["k"])
t = {key(r): r for r in torch_["results"]}
lines = [f"# GEMM throughput: forge vs {torch_['framework']} on {forge['device_name']}", "",
         f"C = A B, row-major, randn inputs; median of {forge['method']['repeats']} runs timed with CUDA events after "
         "warm-up; FLOPs = 2*M*N*K (method: docs/bench.md). Produced by benchmarks/bench/run_gemm.sh.", "",
         "| dtype | M | N | K | forge TFLOP/s | torch TFLOP/s | forge / torch | forge % of dense peak |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for r in forge["results"]:
    tr = t.get(key(r))
    tt = f"{tr['tflops']:.1f}" if tr else "-"
    ratio = f"{r['tflops'] / tr['tflops']:.2f}" if tr and tr["tflops"] > 0 else "-"
    pct = f"{r['peak_pct']:.1f}" if r.get("peak_pct") is not None else "-"
    lines.append(f"| {r['dtype']} | {r['m']} | {r['n']} | {r['k']} | {r['tflops']:.1f} | {tt} | {ratio} | {pct} |")
for s in forge["skipped"]:
    lines.append("")
    lines.append(f"forge skipped {s['dtype']} {s['shape']}: {s['reason']}")
for s in torch_["skipped"]:
    lines.append("")
    lines.append(f"torch skipped {s['dtype']} {s['shape']}: {s['reason']}")
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
echo "wrote $OUT"
