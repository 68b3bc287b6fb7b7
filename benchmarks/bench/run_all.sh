#!/usr/bin/env bash
# Every `forge bench` subcommand on this GPU machine, with PyTorch timed the same way beside the
# GEMM and memory numbers, in one report (method: docs/bench.md).
#
#   benchmarks/bench/run_all.sh                       # after scripts/gpu-check.sh BUILD_ONLY=1
#   BUILD_DIR=build-gpu BURN_SECONDS=30 benchmarks/bench/run_all.sh
#
# Runs: forge info; bench gemm (bf16, f32, fp8 at 4096, 8192) and torch.matmul / torch._scaled_mm; bench memory (64K..1G
# elements) and torch copy_/mul; bench layer; bench roofline --svg; bench burn --seconds
# $BURN_SECONDS; bench collectives when forge has it. Writes benchmarks/results/bench_<gpu>.md
# (forge/torch ratios, the exact commands, the device), roofline_<gpu>.svg beside it and the raw
# JSONs in benchmarks/results/raw/. About 2-3 minutes on an H100 (burn included). Exits non-zero
# when a step fails (the report is still written, naming it) or burn found mismatches.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BURN_SECONDS="${BURN_SECONDS:-30}"
GEMM_SIZES="${GEMM_SIZES:-4096,8192}"
GEMM_DTYPES="${GEMM_DTYPES:-bf16,f32,fp8}"
source benchmarks/common.sh
bench_setup run_all.sh
RAW="benchmarks/results/raw"
mkdir -p "$RAW"
OUT="benchmarks/results/bench_$GPU.md"
SVG="benchmarks/results/roofline_$GPU.svg"
CMDS="$RAW/bench_all_commands_$GPU.txt"
FAILED="$RAW/bench_all_failed_$GPU.txt"
: > "$CMDS"
: > "$FAILED"
echo "bench run_all: $GPU, forge $FORGE, python $PY, burn ${BURN_SECONDS}s"

# step NAME OUTFILE CMD...: runs CMD with stdout to OUTFILE, records the command; a failure is
# reported and remembered, and the next steps still run.
step() {
  local name="$1" out="$2"
  shift 2
  echo "$*" >> "$CMDS"
  echo "== $name: $*"
  local t0=$SECONDS
  if "$@" > "$out"; then
    echo "   done in $((SECONDS - t0)) s -> $out"
  else
    local rc=$?
    echo "   FAILED (exit $rc) after $((SECONDS - t0)) s: $name" >&2
    echo "$name (exit $rc): $*" >> "$FAILED"
  fi
}

J() { echo "$RAW/bench_${1}_$GPU.json"; }

step info "$(J info)" "$FORGE" info --json
# GEMM: forge and torch alternate for GEMM_ROUNDS rounds, so both see the same clock and power
# state (an H100 at 700 W throttles under long bf16 GEMMs: one side measured first on a cold GPU
# and the other after it is not a fair comparison); each side's figure is its median over rounds.
GEMM_ROUNDS="${GEMM_ROUNDS:-3}"
GEMM_COOLDOWN="${GEMM_COOLDOWN:-3}"   # seconds idle before each side's run, so each starts from the same state
for r in $(seq 1 "$GEMM_ROUNDS"); do
  sleep "$GEMM_COOLDOWN"
  step "gemm (round $r)" "$(J gemm_forge_r$r)" "$FORGE" bench gemm --device cuda --sizes "$GEMM_SIZES" --dtype "$GEMM_DTYPES" --json
  sleep "$GEMM_COOLDOWN"
  step "gemm_torch (round $r)" "$(J gemm_torch_r$r)" "$PY" benchmarks/bench/gemm_vs_torch.py --sizes "$GEMM_SIZES" --dtype "$GEMM_DTYPES"
done
"$PY" - "$RAW" "$GPU" "$GEMM_ROUNDS" <<'PYEOF'
import json, os, statistics, sys
raw, gpu, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for side in ("forge", "torch"):
    docs = []
    for r in range(1, rounds + 1):
        try:
            docs.append(json.load(open(os.path.join(raw, f"bench_gemm_{side}_r{r}_{gpu}.json"))))
        except (OSError, ValueError):
            pass
    if not docs:
        continue
    merged = docs[0]
    for res in merged["results"]:
        key = (res["dtype"], res["m"], res["n"], res["k"])
        vals = [x["tflops"] for d in docs for x in d["results"] if (x["dtype"], x["m"], x["n"], x["k"]) == key]
        res["rounds_tflops"] = vals
        if res.get("peak_pct") and res["tflops"] > 0:
            res["peak_pct"] *= statistics.median(vals) / res["tflops"]
        res["tflops"] = statistics.median(vals)
    merged["rounds"] = len(docs)
    json.dump(merged, open(os.path.join(raw, f"bench_gemm_{side}_{gpu}.json"), "w"), indent=1)
PYEOF
step memory "$(J memory_forge)" "$FORGE" bench memory --device cuda --json
SIZES="$("$PY" -c 'import json,sys; print(",".join(sorted({str(r["elements"]) for r in json.load(open(sys.argv[1]))["results"] if r["kernel"] == "copy"}, key=int)))' "$(J memory_forge)" 2>/dev/null || true)"
if [[ -n "$SIZES" ]]; then
  step memory_torch "$(J memory_torch)" "$PY" benchmarks/bench/memory_vs_torch.py --sizes "$SIZES"
else
  echo "memory_torch: no forge copy sizes to compare (the memory step failed?)" | tee -a "$FAILED" >&2
fi
step layer "$(J layer)" "$FORGE" bench layer --device cuda --json
step roofline "$(J roofline)" "$FORGE" bench roofline --device cuda --svg "$SVG" --json
step burn "$(J burn)" "$FORGE" bench burn --device cuda --seconds "$BURN_SECONDS" --json
if "$FORGE" bench collectives --help > /dev/null 2>&1; then
  step collectives "$(J collectives)" "$FORGE" bench collectives --json
else
  echo "== collectives: not in this forge build, skipped"
  rm -f "$(J collectives)"
fi

"$PY" - "$RAW" "$GPU" "$OUT" "$SVG" "$CMDS" "$FAILED" <<'PYEOF'
import json, os, sys
raw, gpu, out, svg, cmds, failed = sys.argv[1:7]

def load(name):
    p = os.path.join(raw, f"bench_{name}_{gpu}.json")
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None

def f(v, spec=".1f"):
    return "-" if v is None else format(v, spec)

def size(n):
    for s, u in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= s and n % s == 0:
            return f"{n // s}{u}"
    return str(n)

info, gf, gt = load("info"), load("gemm_forge"), load("gemm_torch")
mf, mt, layer, roof, burn, coll = (load(n) for n in ("memory_forge", "memory_torch", "layer", "roofline", "burn",
                                                     "collectives"))
L = [f"# forge bench on {gpu.replace('_', ' ')}", "",
     "Produced by `benchmarks/bench/run_all.sh`; method of every number: docs/bench.md. Raw JSON: "
     f"`benchmarks/results/raw/bench_*_{gpu}.json`.", ""]
if info and info.get("gpus"):
    g = info["gpus"][0]
    L += ["## Device", "",
          f"{len(info['gpus'])} x {g['name']} (cc {g['compute_capability']}, {g['sm_count']} SMs, "
          f"{g['memory_bytes'] / 2**30:.0f} GiB, theoretical {g['bandwidth_gbs']:.0f} GB/s), driver {info['driver']}, "
          f"CUDA runtime {info['cuda_runtime']}, NVML {info['nvml'].get('driver_version') or '-'}; host "
          f"{info['host']['cpu_model']}.", ""]
L += ["## Commands", "", "```"] + [c.rstrip() for c in open(cmds)] + ["```", ""]
bad = [l.rstrip() for l in open(failed) if l.strip()]
if bad:
    L += ["## Failed steps", ""] + [f"- {b}" for b in bad] + [""]

if gf:
    t = {(r["dtype"], r["m"], r["n"], r["k"]): r for r in (gt or {}).get("results", [])}
    L += ["## GEMM (forge cuBLASLt vs torch.matmul)", "",
          f"forge and torch alternate for {gf.get('rounds', 1)} round(s); each figure is the median over rounds "
          "of the median of 20 timed runs (the rounds are listed).", "",
          "| dtype | M=N=K | forge TFLOP/s | torch TFLOP/s | forge / torch | forge % of dense peak | forge rounds | torch rounds |",
          "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in gf["results"]:
        tr = t.get((r["dtype"], r["m"], r["n"], r["k"]))
        ratio = f"{r['tflops'] / tr['tflops']:.3f}" if tr and tr["tflops"] > 0 else "-"
        rr = lambda x: ", ".join(f"{v:.0f}" for v in (x or {}).get("rounds_tflops", []))
        L.append(f"| {r['dtype']} | {r['m']} | {r['tflops']:.1f} | {f(tr and tr['tflops'])} | {ratio} | "
                 f"{f(r.get('peak_pct'))} | {rr(r)} | {rr(tr)} |")
    L.append("")

if mf:
    t = {(r["kernel"], r["elements"]): r for r in (mt or {}).get("results", [])}
    L += ["## Memory (f32; GB/s = bytes read + written / median time)", "",
          "| kernel | elements | forge GB/s | forge method | torch GB/s | forge / torch | forge TFLOP/s |",
          "|---|---:|---:|---|---:|---:|---:|"]
    worst_copy = None
    for r in mf["results"]:
        if r["kernel"] not in ("copy", "multiply"):
            continue
        tr = t.get((r["kernel"], r["elements"]))
        ratio = r["gbs"] / tr["gbs"] if tr and tr["gbs"] > 0 else None
        if r["kernel"] == "copy" and ratio is not None and r["elements"] >= (16 << 20):
            worst_copy = ratio if worst_copy is None else min(worst_copy, ratio)
        L.append(f"| {r['kernel']} | {size(r['elements'])} | {r['gbs']:.0f} | {r['note'] or '-'} | "
                 f"{f(tr and tr['gbs'], '.0f')} | {f(ratio, '.3f')} | "
                 f"{f(r['tflops'], '.4f') if r['kernel'] == 'multiply' else '-'} |")
    if worst_copy is not None:
        L += ["", f"Copy at >= 16M elements: worst forge/torch {worst_copy:.3f} "
                  f"({'within' if worst_copy >= 0.97 else 'NOT within'} 3% of PyTorch)."]
    other = [r for r in mf["results"] if r["kernel"] not in ("copy", "multiply", "copy_kernel", "copy_memcpy")]
    if other:
        L += ["", "| transfer | elements | GB/s | note |", "|---|---:|---:|---|"]
        for r in other:
            L.append(f"| {r['kernel']} | {size(r['elements'])} | {r['gbs']:.1f} | {r['note'] or '-'} |")
    detail = [r for r in mf["results"] if r["kernel"] in ("copy_kernel", "copy_memcpy")]
    if detail:
        L += ["", "Copy methods: " + ", ".join(f"{r['kernel']} {size(r['elements'])} {r['gbs']:.0f}" for r in detail)
              + " GB/s."]
    L.append("")

if layer:
    c = layer["config"]
    L += [f"## GPT block (batch {c['batch']}, seq {c['seq']}, width {c['width']}, heads {c['heads']}, {c['dtype']})", "",
          f"Block forward+backward: {layer['block']['total_ms']:.3f} ms, {layer['block']['tflops']:.1f} TFLOP/s "
          f"(fwd {layer['block']['fwd_ms']:.3f} ms, bwd {layer['block']['bwd_ms']:.3f} ms); the parts sum to "
          f"{100 * layer['parts_ms'] / max(layer['block']['total_ms'], 1e-12):.0f}% of it.", "",
          "| part | kind | fwd ms | bwd ms | TFLOP/s | GB/s | share |", "|---|---|---:|---:|---:|---:|---:|"]
    for p in layer["parts"]:
        tf = f"{p['tflops']:.1f}" if p["flops_fwd"] > 0 else "-"
        L.append(f"| {p['name']} | {p['kind']} | {p['fwd_ms']:.4f} | {p['bwd_ms']:.4f} | {tf} | {p['gbs']:.0f} | "
                 f"{100 * p['share']:.1f}% |")
    L.append("")

if roof:
    L += ["## Roofline", "", f"![roofline]({os.path.basename(svg)})", "",
          f"Bandwidth roof {roof['bandwidth_gbs']:.0f} GB/s ({roof['bandwidth_from']}); compute roofs: " +
          "; ".join(f"{c['dtype']} {c['tflops']:.1f} TFLOP/s (ridge {c['ridge_flop_per_byte']:.0f} FLOP/B)"
                    for c in roof["compute_ceilings"]) + ".", "",
          "| kernel | FLOP/byte | TFLOP/s | % of roof | bound |", "|---|---:|---:|---:|---|"]
    for p in roof["points"]:
        L.append(f"| {p['name']} | {p['flop_per_byte']:.3g} | {p['tflops']:.3f} | {f(p['roof_pct'])} | {p['bound']} |")
    L.append("")

if burn:
    L += [f"## Burn ({burn['method']['gemm']}, {burn['seconds']:.0f} s)", "",
          f"{burn['iterations']} GEMMs, mean {burn['mean_tflops']:.1f} TFLOP/s, {burn['checks']} checks, "
          f"**{burn['errors']} errors**; NVML: {'yes' if burn['nvml']['available'] else burn['nvml']['note']}.", "",
          "| time s | TFLOP/s | SM MHz | temp C | power W | errors |", "|---:|---:|---:|---:|---:|---:|"]
    for r in burn["rows"]:
        L.append(f"| {r['t_s']:.1f} | {r['tflops']:.1f} | {f(r['sm_clock_mhz'], '.0f')} | "
                 f"{f(r['temperature_c'], '.0f')} | {f(r['power_w'], '.0f')} | {r['errors']} |")
    L.append("")

if coll:
    L += ["## Collectives", "", "```json", json.dumps(coll, indent=1)[:4000], "```", ""]

open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PYEOF
echo "wrote $OUT and $SVG"
if [[ -s "$FAILED" ]]; then
  echo "run_all.sh: failed steps:" >&2
  cat "$FAILED" >&2
  exit 1
fi
