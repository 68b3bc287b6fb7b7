#!/usr/bin/env python3
"""Compares two forge runs: the loss of every step (metrics.jsonl) and every parameter of the
latest checkpoint (model.safetensors). Prints one JSON object:
  {"losses": n, "loss_max_rel": ..., "param_max_rel": ..., "worst_param": name}
where a parameter's error is max|a - b| / max|b| over its tensor (as tests/train/test_data_parallel.cpp).
Usage: compare_runs.py RUN_DIR REFERENCE_RUN_DIR"""
import glob, json, os, sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_np import load_safetensors  # noqa: E402

def losses(run):
    out = {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        j = json.loads(line)
        if "loss" in j and not j.get("final"):
            out[j["step"]] = j["loss"]
    return out


def latest(run):
    cks = sorted(glob.glob(os.path.join(run, "checkpoints", "step_*")))
    cks = [c for c in cks if os.path.basename(c)[5:].isdigit()]
    return cks[-1]


def main():
    got, ref = sys.argv[1], sys.argv[2]
    lg, lr = losses(got), losses(ref)
    common = sorted(set(lg) & set(lr))
    loss_rel = max(abs(lg[s] - lr[s]) / abs(lr[s]) for s in common) if common else None
    pg, pr = load_safetensors(os.path.join(latest(got), "model.safetensors")), \
        load_safetensors(os.path.join(latest(ref), "model.safetensors"))
    worst, worst_name = 0.0, ""
    for name, b in pr.items():
        a = pg[name]
        scale = np.abs(b).max()
        e = np.abs(a - b).max() / (scale if scale > 0 else 1.0)
        if e > worst:
            worst, worst_name = float(e), name
    print(json.dumps({"losses": len(common), "loss_max_rel": loss_rel, "param_max_rel": worst,
                      "worst_param": worst_name}))


if __name__ == "__main__":
    main()
