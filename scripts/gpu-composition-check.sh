#!/usr/bin/env bash
# The GPU session of issue 38 (parallelism as one composition, context parallelism): one device
# call per phase on one warm machine (benchmarks/ab/run_ab.sh keeps its builds in build-ab/).
#
#   here:  BASE=<commit before the refactor> benchmarks/ab/run_ab.sh prepare    # .ab/base, .deps
#   PHASE=build  (carry .ab and .deps) both trees' forge and the head's tests; the CUDA tests of
#                the device runtime (events, StepGraph), the attention blocks on every back-end and
#                the CUDA graphs; a GPT-2 run with FORGE_TRAIN_PHASES=1, and one with
#                telemetry.profile_steps (the step trace's GPU track and CUPTI kernels)
#   PHASE=ab     GPT-2 124M and LLaMA 0.85B tokens/s, base against head, ROUNDS alternating rounds
#   PHASE=long   benchmarks/long/run_long.sh on the head's forge (LLaMA 0.85B at 16k and 32k tokens
#                with activation checkpointing beside torch.compile)
#   PHASE=packing  packed documents (issue 40 item 2, issue 38's document masks) on the GPU: the CUDA
#                tests of document ids and per-token rope positions, then GPT-2 124M tokens/s with
#                data.packing = "documents" against "none" on the same text (the document mask runs
#                on the composed attention path for now: the cost is what this measures)
#   PHASE=lora   benchmarks/lora/run_lora.sh: a LLaMA-3.2-1B-shaped LoRA fine-tune, forge beside PEFT +
#                transformers (eager and torch.compile): tokens/s and peak memory
#   PHASE=lora_mem  the forge LoRA run above held to LIMIT (default 23GiB, PEFT + torch.compile's peak):
#                its out-of-memory snapshot, live bytes by owner (FORGE_CUDA_MEMORY_LIMIT)
#   PHASE=chat   tests/python/chat_template_oracle.py: transformers' renderings of the chat fixtures
#                (golden.json, copied into $OUT/chat/ to commit here)
#   PHASE=fp8    the CUDA tests of FP8 training (issue 39: casts against the CPU emulation, the scaled
#                GEMMs, fp8::linear, guardrails, the GEMM choice, a run with and without its graph)
#   PHASE=fp8_bench  benchmarks/fp8/run_fp8.sh: forge bf16 against each FP8 recipe, and the
#                torch._scaled_mm peer, on LLaMA 0.85B and 3.6B (MODELS, RECIPES, PEERS pass through)
#   PHASE=peft   tests/python/peft_oracle.py: PEFT loads forge's exported LoRA adapters (GPT-2 and
#                LLaMA bases) and gives forge's logits (needs HEAD_TARGETS with forge_hf_init_from)
# Results in $OUT (the device tool brings them back) and RESULTS (default /tmp/forge_composition).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
R=${RESULTS:-/tmp/forge_composition}
OUT=${OUT:-$R/out}
mkdir -p "$R" "$OUT"
# .deps/root: the libraries the GPU machine lacks (a device call that carries .deps replaces it,
# so every call unpacks it again, as run_ab.sh's build and runs phases do).
if compgen -G ".deps/*.deb" > /dev/null; then
  mkdir -p .deps/root && for deb in .deps/*.deb; do dpkg -x "$deb" .deps/root; done
fi
export LD_LIBRARY_PATH="$PWD/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
H=build-ab/head
for phase in ${PHASE:?PHASE=build, ab or long}; do
case $phase in
  build)
    HEAD_TARGETS=${HEAD_TARGETS:-"forge forge_cuda_tests"} JOBS=${JOBS:-8} benchmarks/ab/run_ab.sh build 2>&1 | tail -4
    ls -la build-ab/*/forge
    timeout 300 "$H/tests/forge_cuda_tests" \
      --gtest_filter="${CUDA_FILTER:-CudaDeviceRuntime*:CudaAttentionBlocks*:CudaGraph*}" > "$OUT/cuda_tests.log" 2>&1
    echo "cuda tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/cuda_tests.log"
    G=(configs/gpt2-124m.toml --run.dir="$R/runs" --run.overwrite=true --train.steps=12 --train.log_every=4
       --checkpoint.at_end=false --eval.every=0)
    FORGE_TRAIN_PHASES=1 timeout 120 "$H/forge" train "${G[@]}" --run.name=phases > "$OUT/phases.log" 2>&1
    echo "phases run rc=$?"; grep -E "phases|cuda graph" "$OUT/phases.log" | head -8
    timeout 120 "$H/forge" train "${G[@]}" --run.name=trace --telemetry.profile_steps=6:7 > "$OUT/trace.log" 2>&1
    echo "trace run rc=$?"; grep -E "^trace:|cuda graph|gemm:" "$OUT/trace.log"
    python3 - "$R/runs/trace" <<'PY'
import glob, json, sys
for f in glob.glob(sys.argv[1] + "/**/*.json", recursive=True):
    if "trace" not in f: continue
    t = json.load(open(f))
    ev = t.get("traceEvents", [])
    tracks = {e.get("tid") for e in ev if e.get("ph") == "X"}
    print(f, "events", len(ev), "tracks", sorted(tracks), "kernels", t.get("otherData", {}).get("kernels"))
PY
    ;;
  ab)
    # (straight into $OUT: a call cut off by its time limit still brings back the rows so far)
    ROUNDS=${ROUNDS:-3} ROWS=${ROWS:-"gpt2_1gpu llama_1gpu"} AB_OUT="$OUT/ab" OUT= benchmarks/ab/run_ab.sh runs 2>&1 | tail -14 ;;
  long)
    FORGE="$H/forge" RESULTS="$R/long" OUT="$OUT" benchmarks/long/run_long.sh ;;
  packing)
    timeout 300 "$H/tests/forge_cuda_tests" \
      --gtest_filter="${CUDA_FILTER:-CudaPackedAttention*:CudaRope*:CudaAttentionBlocks*:*scaled_dot_product_attention*:*rope*}" \
      > "$OUT/packing_tests.log" 2>&1
    echo "packing cuda tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  " "$OUT/packing_tests.log" | head -20
    # The same text both ways: the project's docs and sources cut into paragraphs, one JSON Lines
    # document each (many short documents, lengths from a line to a few hundred tokens).
    corpus="$R/pack_corpus.jsonl"
    python3 - "$corpus" docs src <<'PY'
import json, pathlib, sys
n = 0
with open(sys.argv[1], "w") as out:
    for root in sys.argv[2:]:
        for f in sorted(pathlib.Path(root).rglob("*")):
            if f.suffix not in (".md", ".cpp", ".h", ".cu"): continue
            for para in f.read_text(errors="replace").split("\n\n"):
                if para.strip(): out.write(json.dumps({"text": para}) + "\n"); n += 1
print(f"packing corpus: {n} documents in {sys.argv[1]}")
PY
    for p in none documents; do
      timeout 200 "$H/forge" train configs/gpt2-124m.toml --run.dir="$R/runs" --run.name="pack_$p" --run.overwrite=true \
        --data.source=files --data.files="$corpus" --data.tokenizer="$PWD/.fixtures/tokenizers/gpt2/tokenizer.json" \
        --data.packing=$p --train.steps=40 --train.log_every=10 --eval.every=0 --checkpoint.at_end=false \
        > "$OUT/pack_$p.log" 2>&1
      echo "packing=$p rc=$? $(grep -E 'packed documents|cuda graph' "$OUT/pack_$p.log" | head -2 | tr '\n' ' ')"
      python3 - "$R/runs/pack_$p/metrics.jsonl" "$p" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
prog = [r for r in recs if "tokens_per_s" in r and not r.get("final")][-2:]
print(f"packing={sys.argv[2]}: {sum(r['tokens_per_s'] for r in prog) / len(prog):.0f} tokens/s, "
      f"{sum(r['ms_per_step'] for r in prog) / len(prog):.1f} ms/step, loss {prog[-1]['loss']:.3f}")
PY
    done ;;
  chat)  # transformers' apply_chat_template renderings of the fixtures, for ChatTemplate.MatchesTransformersGoldens
    timeout 120 python3 tests/python/chat_template_oracle.py 2>&1 | tail -5
    for g in tests/data/chat/*/golden.json; do
      [ -f "$g" ] && mkdir -p "$OUT/chat/$(basename "$(dirname "$g")")" && cp "$g" "$OUT/chat/$(basename "$(dirname "$g")")/"
    done
    ls -la "$OUT/chat" 2>/dev/null ;;
  lora)
    FORGE="$H/forge" RESULTS="$R/lora" OUT="$OUT" benchmarks/lora/run_lora.sh ;;
  lora_mem)  # what holds forge's LoRA memory: the run held to PEFT + torch.compile's peak fails there, and
             # its out-of-memory snapshot says by owner (FORGE_CUDA_MEMORY_LIMIT)
    FORGE_CUDA_MEMORY_LIMIT=${LIMIT:-23GiB} PEERS="" STEPS=2 WARMUP=1 FORGE="$H/forge" RESULTS="$R/lora_mem" OUT= \
      benchmarks/lora/run_lora.sh > /dev/null 2>&1
    grep -m1 "out of memory" "$R/lora_mem/lora.forge.log" | cut -c1-600
    cp "$R/lora_mem/runs/lora/oom_snapshot.rank0.json" "$OUT/lora_oom_snapshot.json" 2>/dev/null &&
      python3 - "$OUT/lora_oom_snapshot.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print("requested", j["requested_bytes"] / 2**30, "GiB for", j["failed_owner"])
for o in j["live_by_owner"][:40]: print(f'{o["bytes"] / 2**30:8.3f} GiB {o["blocks"]:5d} blocks  {o["owner"]}')
print("plan:", json.dumps(j.get("plan", {}).get("memory_per_gpu_bytes")))
PY
    ;;
  fp8)
    timeout 400 "$H/tests/forge_cuda_tests" --gtest_filter="${CUDA_FILTER:-CudaFp8*:Fp8Training*:CudaGemmFp8*}" \
      > "$OUT/fp8_tests.log" 2>&1
    echo "fp8 tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error|Expected|Which is|actual" "$OUT/fp8_tests.log" | head -60 ;;
  fp8_bench)
    FORGE="$H/forge" RESULTS="$R/fp8" OUT="$OUT" benchmarks/fp8/run_fp8.sh ;;
  peft)
    timeout 400 python3 tests/python/peft_oracle.py --forge "$H/forge" --init-from-bin "$H/tests/forge_hf_init_from" \
      --device cuda:0 2>&1 | tee "$OUT/peft_oracle.log" | tail -6 ;;
  *) echo "gpu-composition-check.sh: PHASE=$phase: use build, ab, long, packing, lora, chat, fp8, fp8_bench or peft" >&2; exit 2 ;;
esac
done
