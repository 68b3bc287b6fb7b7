#!/usr/bin/env python3
"""Compares two forge runs: the loss of every step (metrics.jsonl) and every parameter of the
latest checkpoint (model.safetensors). Prints one JSON object:
  {"losses": n, "loss_max_rel": ..., "param_max_rel": ..., "worst_param": name}
where a parameter's error is max|a - b| / max|b| over its tensor (as tests/train/test_data_parallel.cpp).
Usage: compare_runs.py RUN_DIR REFERENCE_RUN_DIR"""
import glob, json, os, struct, sys

import numpy as np

DT = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
        else:
            arr = np.frombuffer(data[a:b], dtype=DT[v["dtype"]])
        out[name] = arr.astype(np.float64).reshape(v["shape"])
    return out


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
