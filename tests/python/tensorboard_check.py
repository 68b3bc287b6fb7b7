#!/usr/bin/env python3
"""TensorBoard's own reader against forge's event files (issue 19; Note [TensorBoard event files]).

    python3 tests/python/tensorboard_check.py RUN_DIR

Loads RUN_DIR/tb with tensorboard's EventAccumulator and checks that every number of every
RUN_DIR/metrics.jsonl record is a scalar at its step (the final record's under final/<key>), as a
float32. Exits 0 and prints a one-line summary when they agree; exits 1 listing the first
mismatches otherwise; exits 2 when tensorboard is not installed (run it where it is: the GPU
machine has it).
"""
import json
import math
import os
import struct
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    run = sys.argv[1]
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("tensorboard_check: no tensorboard module here", file=sys.stderr)
        sys.exit(2)
    acc = EventAccumulator(os.path.join(run, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    values = {}
    for tag in tags:
        for ev in acc.Scalars(tag):
            values.setdefault((ev.step, tag), []).append(ev.value)
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
    bad, checked = [], 0
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step" not in rec:
                continue
            final = rec.get("final", False)
            for key, v in rec.items():
                if key == "step" or isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                tag = ("final/" if final else "") + key
                got = values.get((rec["step"], tag), [])
                if not any(g == f32(v) or (math.isnan(g) and math.isnan(v)) for g in got):
                    bad.append(f"step {rec['step']} {tag}: metrics.jsonl {v}, TensorBoard {got}")
                checked += 1
    if bad or checked == 0:
        print("tensorboard_check: MISMATCH\n" + "\n".join(bad[:20]))
        sys.exit(1)
    print(f"tensorboard_check: OK, {checked} scalars of {len(tags)} tags agree with metrics.jsonl")


if __name__ == "__main__":
    main()
