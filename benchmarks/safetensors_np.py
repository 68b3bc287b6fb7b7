"""A safetensors file's tensors as numpy arrays (float64), for the benchmarks' comparisons
(benchmarks/dist/compare_runs.py, benchmarks/convergence/parity.py): standard library and numpy
only, so the scripts run where the `safetensors` package is not installed.

    load_safetensors(path, dtypes=None) -> {name: np.ndarray of float64, in the tensor's shape}

`dtypes`: the dtypes allowed (e.g. {"F32"}); another one is an error naming the tensor."""
import json
import struct

import numpy as np

_NUMPY = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4"}


def load_safetensors(path, dtypes=None):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        if dtypes is not None and v["dtype"] not in dtypes:
            raise ValueError(f"{path}: {name} is {v['dtype']}, expected {' or '.join(sorted(dtypes))}")
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            arr = (np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif v["dtype"] in _NUMPY:
            arr = np.frombuffer(data[a:b], dtype=_NUMPY[v["dtype"]])
        else:
            raise ValueError(f"{path}: {name} has dtype {v['dtype']}, which this reader does not know")
        out[name] = arr.astype(np.float64).reshape(v["shape"])
    return out
