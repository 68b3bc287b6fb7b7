#!/usr/bin/env bash
# The four rows of benchmarks/step/run.sh on a host of two GPUs in about half its wall time: rows 1
# and 2 on GPU 0 while row 3 runs on GPU 1, then row 4 on both; one raw directory, one results file.
# Each row's forge, eager and compile runs stay on that row's one GPU, one after another, as run.sh
# runs them, so every ratio is still forge and its peer in the same run on the same GPU; the two
# lanes share the host's CPUs (16 or more cores on the GPU machines: enough for both).
#
#   benchmarks/step/run_two_gpus.sh                        # rows 1-4, STEPS=90 WARMUP=10, no profile
#   PROFILE_ROWS=3 benchmarks/step/run_two_gpus.sh         # with row 3's per-kernel breakdown
#
# Variables: STEPS, WARMUP, PROFILE_ROWS (default none; rows 1-3 are profiled in their own lane),
# BUILD (auto: build forge first, as run.sh; 0: use build-gpu/forge), FORGE_COMMIT, RAW_DIR and
# RESULT_FILE (defaults: run.sh's). Each lane's own log is kept in the raw directory (lane_*.log).
# LANES_DIR=<dir>: run nothing, only merge the lanes' raw directories found there (a: rows 1-2,
# b: row 3, c: row 4, as this script leaves them in its /tmp/forge_step2.* folder) and report:
# for a call cut short after its lanes, and for checking the merge without GPUs.
# Wall time (2026-11-27, H100s, forge built): about 3 minutes for the two lanes, then 2 for row 4.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PROFILE_ROWS="${PROFILE_ROWS-}"
for n in $PROFILE_ROWS; do
  [[ "$n" =~ ^[1-3]$ ]] || { echo "run_two_gpus.sh: PROFILE_ROWS takes rows 1-3, got '$n'"; exit 2; }
done
if [[ -z "${LANES_DIR:-}" && "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]]; then
  echo "run_two_gpus.sh: needs two GPUs (nvidia-smi -L lists $(nvidia-smi -L 2>/dev/null | wc -l)); use benchmarks/step/run.sh"
  exit 2
fi
BUILD_DIR="${BUILD_DIR:-build-gpu}"
if [[ -z "${LANES_DIR:-}" && "${BUILD:-auto}" != 0 ]]; then  # once, before the lanes (as run.sh's own build step)
  if [[ -f "$BUILD_DIR/build.ninja" || -f "$BUILD_DIR/Makefile" ]]; then
    cmake --build "$BUILD_DIR" --target forge -j "$(nproc)" > /tmp/forge_step2_build.log 2>&1
  else
    BUILD_DIR="$BUILD_DIR" BUILD_ONLY=1 scripts/gpu-check.sh > /tmp/forge_step2_build.log 2>&1
  fi || { tail -20 /tmp/forge_step2_build.log; echo "run_two_gpus.sh: the build failed"; exit 2; }
fi
if [[ -z "${LANES_DIR:-}" ]]; then
  # shellcheck source=/dev/null
  source benchmarks/common.sh
  bench_setup run_two_gpus.sh  # FORGE, PY, GPU
else
  PY="${PYTHON:-python3}"
  [[ -f "$LANES_DIR/a/meta.json" ]] || { echo "run_two_gpus.sh: $LANES_DIR/a/meta.json not found (LANES_DIR holds a, b, c)"; exit 2; }
  GPU="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpu_name"].replace(" ", "_"))' \
    "$LANES_DIR/a/meta.json")"
fi
commit="${FORGE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
RAW="${RAW_DIR:-benchmarks/results/raw/step_${GPU}}"
RESULT="${RESULT_FILE:-benchmarks/results/step_${GPU}.md}"
WORK="${LANES_DIR:-$(mktemp -d /tmp/forge_step2.XXXXXX)}"
SECONDS=0
say() { printf '[%2d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
only() {  # the rows of PROFILE_ROWS among "$@"
  local n m out=""
  for n in $PROFILE_ROWS; do for m in "$@"; do [[ "$n" == "$m" ]] && out+="$n "; done; done
  echo "${out% }"
}
lane() {  # NAME GPUS ROWS PROFILE
  CUDA_VISIBLE_DEVICES="$2" FORGE_COMMIT="$commit" BUILD=0 BUILD_DIR="$BUILD_DIR" ROWS="$3" PROFILE_ROWS="$4" STEPS="${STEPS:-90}" \
    WARMUP="${WARMUP:-10}" RAW_DIR="$WORK/$1" RESULT_FILE="$WORK/$1.md" OUT='' benchmarks/step/run.sh \
    > "$WORK/lane_$1.log" 2>&1
}
rc_a=0 rc_b=0 rc_c=0
if [[ -z "${LANES_DIR:-}" ]]; then
  say "rows 1 and 2 on GPU 0, row 3 on GPU 1 (logs in $WORK)"
  lane a 0 "1 2" "$(only 1 2)" & pa=$!
  lane b 1 "3" "$(only 3)" & pb=$!
  wait "$pa" || rc_a=$?
  wait "$pb" || rc_b=$?
  say "lanes done (exit $rc_a, $rc_b); row 4 on both GPUs"
  lane c 0,1 "4" "" || rc_c=$?
  say "row 4 done (exit $rc_c)"
fi

# One raw directory: lane a's, with rows 3 and 4 (and their traces) from the other two; each lane's
# meta.json kept beside it, and meta.json saying how the rows were run.
rm -rf "$RAW" && mkdir -p "$RAW"
[[ -d "$WORK/a" ]] && cp -r "$WORK/a/." "$RAW/"
for f in "$WORK"/b/*row3* "$WORK"/c/*row4*; do [[ -e "$f" ]] && cp -r "$f" "$RAW/"; done
for x in a b c; do
  [[ -f "$WORK/$x/meta.json" ]] && cp "$WORK/$x/meta.json" "$RAW/meta_lane_$x.json"
  [[ -f "$WORK/$x/notes.txt" ]] && cat "$WORK/$x/notes.txt" >> "$RAW/notes_all.txt"
  [[ -f "$WORK/lane_$x.log" ]] && cp "$WORK/lane_$x.log" "$RAW/"
done
[[ -f "$RAW/notes_all.txt" ]] && mv "$RAW/notes_all.txt" "$RAW/notes.txt"
STEPS="${STEPS:-90}" WARMUP="${WARMUP:-10}" PROFILE_ROWS="$PROFILE_ROWS" "$PY" - "$RAW" <<'PYEOF'
import json, os, sys
raw = sys.argv[1]
lanes = {x: json.load(open(f"{raw}/meta_lane_{x}.json")) for x in "abc" if os.path.exists(f"{raw}/meta_lane_{x}.json")}
if not lanes:
    sys.exit(f"run_two_gpus.sh: no lane wrote its meta.json (see the lane_*.log files in {raw})")
meta = dict(next(iter(lanes.values())))
e = os.environ
meta["command"] = (f"benchmarks/step/run_two_gpus.sh (STEPS={e['STEPS']} WARMUP={e['WARMUP']} "
                   f"PROFILE_ROWS=\"{e['PROFILE_ROWS']}\"): benchmarks/step/run.sh ROWS=\"1 2\" on GPU 0 while "
                   "ROWS=\"3\" ran on GPU 1, then ROWS=\"4\" on both")
meta["rows"] = "1 2 3 4"
meta["clocks"] = "; ".join(f"lane {x}: {m['clocks']}" for x, m in lanes.items())
meta["date"] = " to ".join(sorted({m["date"] for m in lanes.values()}))
profilers = sorted({m.get("profiler", "") for m in lanes.values()} - {""})
meta["profiler"] = ", ".join(profilers)
json.dump(meta, open(f"{raw}/meta.json", "w"), indent=1)
PYEOF
"$PY" benchmarks/step/report.py --raw "$RAW" > "$RESULT.tmp" && mv "$RESULT.tmp" "$RESULT"
say "results -> $RESULT, raw -> $RAW"
grep -E "^\| [0-9] \|" "$RESULT" | head -4 || true
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  [[ "$RESULT" -ef "$OUT/$(basename "$RESULT")" ]] || cp "$RESULT" "$OUT/"
  tar czf "$OUT/step_${GPU}_raw.tar.gz" -C "$(dirname "$RAW")" "$(basename "$RAW")" 2>/dev/null || true
fi
[[ $rc_a -eq 0 && $rc_b -eq 0 && $rc_c -eq 0 ]]
