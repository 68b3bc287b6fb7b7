#!/usr/bin/env python3
"""benchmarks/step/report.py's power and SM clock table, on a raw directory made here.

A LLaMA row (row 3) with forge and torch.compile, each with a synthetic nvidia-smi sample file
(`row3_<run>_power.csv`, as run.sh's SAMPLE_POWER writes it): an idle start, a busy warm-up at
one power and clock, the timed steps at another, then the idle exit, plus lines nvidia-smi could
not fill. The table must read the timed steps' samples only: their mean power, their clocks, the
share at the cap. A run without a sample file gets no line; a raw directory without any gets no
section. Exits non-zero on a mismatch.
"""
import datetime
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "step"))
import report  # noqa: E402

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)


def stamp(t0, s):
    return (t0 + datetime.timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def write_power(path, t0, phases):
    """phases: (seconds, power W, SM MHz, utilisation %) in order, a sample every 100 ms."""
    lines, t = [], 0.0
    for secs, power, clock, util in phases:
        for _ in range(round(secs * 10)):
            lines.append(f"{stamp(t0, t)}, {power:.2f}, 700.00, {clock}, {util}")
            t += 0.1
    lines.insert(3, f"{stamp(t0, 0.25)}, [N/A], 700.00, [N/A], 0")  # what nvidia-smi writes when it cannot read
    lines.insert(5, "Failed to read something")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    t0 = datetime.datetime(2026, 11, 27, 23, 0, 0)
    with tempfile.TemporaryDirectory() as raw:
        with open(os.path.join(raw, "meta.json"), "w") as f:
            json.dump({"gpu_name": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.4, "steps": 90, "warmup": 10,
                       "rows": "3"}, f)
        report_text = report.report(raw)
        check("## Power and SM clock" not in report_text, "a directory without rows has no power section")

        with open(os.path.join(raw, "row3_def.json"), "w") as f:
            json.dump({"row": 3, "config": "configs/llama-0.85b.toml", "batch": 4, "gpus": 1, "seq": 2048}, f)
        # forge: 100 steps of 87 ms; the timed ones are 11-100: 90 x 87 ms = 7.83 s.
        with open(os.path.join(raw, "row3_forge.jsonl"), "w") as f:
            for step in range(1, 101):
                f.write(json.dumps({"step": step, "ms_per_step": 87.0, "mem_bytes": 20 << 30, "mfu": 0.52,
                                    "loss": 10.4}) + "\n")
        # eager ran but left no sample file (SAMPLE_POWER=0, or no nvidia-smi): no line of its own.
        with open(os.path.join(raw, "row3_eager.json"), "w") as f:
            json.dump({"tokens_per_s": 63000.0, "ms_per_step": 130.0, "ms_per_step_median": 130.0, "steps": 90,
                       "params": 852559872, "peak_mem_bytes": 25 << 30}, f)
        with open(os.path.join(raw, "row3_compile.json"), "w") as f:
            json.dump({"tokens_per_s": 84760.0, "ms_per_step": 96.65, "ms_per_step_median": 96.69, "steps": 90,
                       "params": 852559872, "peak_mem_bytes": 21 << 30}, f)
        # forge: 2 s idle, 3 s warm-up at 500 W / 1980 MHz, 7.9 s timed at 690 W / 1700 MHz (the
        # first 2.0 s of it at 600 W / 1800 MHz), 1 s idle.
        write_power(os.path.join(raw, "row3_forge_power.csv"), t0,
                    [(2.0, 80, 345, 0), (3.0, 500, 1980, 100), (2.0, 600, 1800, 100), (5.9, 690, 1700, 100),
                     (1.0, 90, 1980, 0)])
        # compile: the timed window is 90 x 96.65 ms = 8.70 s, all at 650 W / 1850 MHz; before it
        # a long compilation at 300 W, then the idle exit.
        write_power(os.path.join(raw, "row3_compile_power.csv"), t0,
                    [(20.0, 300, 1980, 60), (9.0, 650, 1850, 100), (0.5, 85, 1980, 0)])
        # REPEATS=3: two more runs of each side; each repeat's ratio from the median steps
        # (96.69/87, 97/88, 96/86), the headline their median with the range.
        for k, fms, cms in ((2, 88.0, 97.0), (3, 86.0, 96.0)):
            with open(os.path.join(raw, f"row3_forge_r{k}.jsonl"), "w") as f:
                for step in range(1, 101):
                    f.write(json.dumps({"step": step, "ms_per_step": fms, "loss": 10.4}) + "\n")
            with open(os.path.join(raw, f"row3_compile_r{k}.json"), "w") as f:
                json.dump({"tokens_per_s": 8192 / cms * 1e3, "ms_per_step": cms, "ms_per_step_median": cms}, f)
        text = report.report(raw)

    check("## Power and SM clock during the timed steps" in text, "the section is written")
    lines = {l.split("|")[2].strip(): [c.strip() for c in l.split("|")[1:-1]]
             for l in text.splitlines() if l.startswith("| 3 | ") and "of 700" in l}
    check(set(lines) == {"forge", "PyTorch compile"}, f"one line for forge and one for compile, got {sorted(lines)}")
    f, c = lines.get("forge"), lines.get("PyTorch compile")
    if f:
        # forge's window: 7.83 s back from its last busy sample: the 5.9 s at 690 W and the last
        # ~1.9 s of the 600 W phase (19 samples of 100 ms, give or take one at the edge).
        n = int(f[2])
        check(76 <= n <= 80, f"forge: the samples of its 7.83 s window, got {n}")
        n600 = n - 59
        mean = (59 * 690 + n600 * 600) / n
        check(f[3] == f"{mean:.0f} of 700", f"forge: mean power {mean:.0f} of 700, got {f[3]}")
        check(f[5] == "1700", f"forge: median SM clock 1700, got {f[5]}")
        check(f[6] == "1700", f"forge: lowest SM clock 1700, got {f[6]}")
        check(f[7] == f"{100 * 59 / n:.0f}%", f"forge: {59} of {n} samples at >= 97% of 700 W, got {f[7]}")
    if c:
        check(c[3] == "650 of 700", f"compile: mean power 650 of 700 (the compilation left out), got {c[3]}")
        check(c[4] == c[5] == c[6] == "1850", f"compile: every clock 1850, got {c[4:7]}")
        check(c[7] == "0%", f"compile: no sample at 97% of the limit, got {c[7]}")

    r = sorted([96.69 / 87, 97.0 / 88, 96.0 / 86])
    want = f"{r[1]:.3f} ({r[0]:.3f}-{r[2]:.3f}, 3)"
    summary = [l for l in text.splitlines() if l.startswith("| 3 | ") and "not run" not in l and "of 700" not in l]
    check(summary and want in summary[0], f"the summary's repeats: {want}, got {summary[:1]}")

    # The parsing on its own: malformed lines are left out, the rest read as numbers.
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x_power.csv")
        write_power(p, t0, [(1.0, 650, 1850, 100)])
        s = report.power_samples(p)
        check(len(s) == 10 and all(x[1] == 650 and x[3] == 1850 for x in s), f"10 good samples, got {len(s)}")
        check(report.power_figures(p, 0) is None, "no window without timed seconds")
        check(report.power_figures(os.path.join(d, "missing.csv"), 5.0) is None, "no figures without a file")

    if FAILS:
        print("step_report_power: FAILED\n  " + "\n  ".join(FAILS))
        return 1
    print("step_report_power: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
