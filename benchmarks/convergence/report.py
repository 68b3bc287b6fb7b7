#!/usr/bin/env python3
"""Lays a forge run beside its PyTorch reference (reference.py): loss curves, the bounds, time to
the reference's final validation loss.

    python3 report.py --forge RUN/metrics.jsonl --ref ref.jsonl --title "GPT-2 124M" --out section.md \
        [--svg curves.svg] [--every 250] [--json summary.json]

Per validation step (every --every): forge's and PyTorch's validation loss and their relative
difference, and the training loss of each averaged over the steps since the previous row (one
step's loss is noisy; the mean of 250 is what the curve shows). The bounds (issue 37): validation
loss within 0.5% of PyTorch's at every row after step 500, the final one within 0.3%, and no loss
spike in forge that PyTorch does not have (a spike: a step whose loss is above 1.2x the median of
the 50 steps before it; PyTorch has it too when, within 5 steps of it, PyTorch's loss is above 1.1x
its own median: a corpus of code and tables makes the same batch spike on both sides, one just over
the line and the other just under it). Time to loss: the training time (elapsed_s: validation passes excluded,
start-up and compilation included) each side took to reach PyTorch's final validation loss
(forge: at the first validation row at or below it).
"""
import argparse
import json
import statistics


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def curves(records):
    """{step: loss}, {step: (val_loss, training seconds)}, {step: elapsed_s} of a metrics file.
    A validation's training seconds are its elapsed_s less every validation pass's eval_s up to it
    (forge's records count the passes in elapsed_s and give each one's eval_s; reference.py's
    leave them out already)."""
    train, val, elapsed = {}, {}, {}
    evals = 0.0
    for r in sorted((r for r in records if "step" in r and "val_loss" in r), key=lambda r: int(r["step"])):
        evals += float(r.get("eval_s", 0.0))
        r["_train_s"] = float(r.get("elapsed_s", float("nan"))) - evals
    for r in records:
        if "step" not in r:
            continue
        s = int(r["step"])
        if "val_loss" in r:
            val[s] = (float(r["val_loss"]), r["_train_s"])
        elif "loss" in r and not r.get("final"):
            train[s] = float(r["loss"])
            if "elapsed_s" in r:
                elapsed[s] = float(r["elapsed_s"])
    return train, val, elapsed


def spikes(train, window=50, factor=1.2):
    steps = sorted(train)
    out = []
    for i, s in enumerate(steps):
        if i < window:
            continue
        med = statistics.median(train[t] for t in steps[i - window:i])
        if train[s] > factor * med:
            out.append(s)
    return out


def svg(title, series, path, width=900, height=340):
    """Two panels (training loss, mean of each 50 steps; validation loss), one line per side."""
    colors = {"forge": "#d62728", "PyTorch": "#1f77b4"}
    panels = [("training loss (mean of 50 steps)", "train"), ("validation loss", "val")]
    pw, ph, ml, mt = (width - 80) // 2, height - 70, 50, 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>']
    for p, (label, key) in enumerate(panels):
        x0 = ml + p * (pw + 40)
        pts = {name: s[key] for name, s in series.items() if s[key]}
        xs = [x for v in pts.values() for x, _ in v]
        ys = [y for v in pts.values() for _, y in v]
        if not xs:
            continue
        lo_x, hi_x = min(xs), max(xs)
        # the later part of the curve decides the scale (the first steps' losses are far above)
        tail = sorted(ys)[: max(1, int(0.9 * len(ys)))]
        lo_y, hi_y = min(ys), max(tail) if tail else max(ys)
        hi_y = max(hi_y, lo_y + 1e-6)

        def X(x):
            return x0 + (x - lo_x) / max(hi_x - lo_x, 1) * pw

        def Y(y):
            return mt + ph - (min(y, hi_y) - lo_y) / (hi_y - lo_y) * ph
        parts.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{mt - 4}" text-anchor="middle">{label}</text>')
        for i in range(5):
            yv = lo_y + (hi_y - lo_y) * i / 4
            parts.append(f'<text x="{x0 - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
            xv = lo_x + (hi_x - lo_x) * i / 4
            parts.append(f'<text x="{X(xv):.1f}" y="{mt + ph + 14}" text-anchor="middle">{int(xv)}</text>')
        for n, (name, v) in enumerate(pts.items()):
            d = " ".join(f"{'M' if i == 0 else 'L'}{X(x):.1f},{Y(y):.1f}" for i, (x, y) in enumerate(v))
            dash = ' stroke-dasharray="5,3"' if name == "PyTorch" else ""
            parts.append(f'<path d="{d}" fill="none" stroke="{colors.get(name, "#333")}" stroke-width="1.5"{dash}/>')
            parts.append(f'<text x="{x0 + pw - 6}" y="{mt + 14 + 14 * n}" text-anchor="end" '
                         f'fill="{colors.get(name, "#333")}">{name}</text>')
    parts.append(f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">step</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forge", required=True, help="forge's metrics.jsonl")
    ap.add_argument("--ref", required=True, help="reference.py's output")
    ap.add_argument("--title", required=True)
    ap.add_argument("--out", required=True, help="the markdown section to write")
    ap.add_argument("--svg", default="")
    ap.add_argument("--json", default="", help="the figures as JSON")
    ap.add_argument("--after", type=int, default=500, help="the 0.5%% bound holds after this step")
    a = ap.parse_args()

    f_train, f_val, f_el = curves(read_jsonl(a.forge))
    r_train, r_val, r_el = curves(read_jsonl(a.ref))
    steps = sorted(set(f_val) & set(r_val))
    if not steps:
        raise SystemExit("report.py: no validation step in common")
    rows, worst_after, prev = [], 0.0, 0
    for s in steps:
        fv, rv = f_val[s][0], r_val[s][0]
        rel = (fv - rv) / rv
        ft = [f_train[t] for t in range(prev + 1, s + 1) if t in f_train]
        rt = [r_train[t] for t in range(prev + 1, s + 1) if t in r_train]
        fm, rm = (statistics.fmean(ft) if ft else float("nan")), (statistics.fmean(rt) if rt else float("nan"))
        rows.append((s, fm, rm, (fm - rm) / rm if rt else float("nan"), fv, rv, rel))
        if s > a.after:
            worst_after = max(worst_after, abs(rel))
        prev = s
    final = steps[-1]
    final_rel = rows[-1][6]
    f_spikes, r_spikes = spikes(f_train), spikes(r_train)
    r_rises = spikes(r_train, factor=1.1)
    only_forge = [s for s in f_spikes if not any(abs(s - t) <= 5 for t in r_rises)]
    target = r_val[final][0]
    forge_reach = next((s for s in sorted(f_val) if f_val[s][0] <= target), None)
    t_forge = f_val[forge_reach][1] if forge_reach is not None else None
    t_ref = r_val[final][1]
    ok_val = worst_after <= 0.005
    ok_final = abs(final_rel) <= 0.003
    ok_spikes = not only_forge

    lines = [f"## {a.title}", "",
             "| step | train loss forge | train loss PyTorch | diff | val loss forge | val loss PyTorch | diff |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for s, fm, rm, td, fv, rv, rel in rows:
        lines.append(f"| {s} | {fm:.4f} | {rm:.4f} | {100 * td:+.2f}% | {fv:.4f} | {rv:.4f} | {100 * rel:+.2f}% |")
    lines += ["", "train loss: the mean of the steps since the previous row; diff: (forge - PyTorch) / PyTorch.", "",
              "| bound | target | measured | met |", "|---|---|---|---|",
              f"| validation loss after step {a.after} | within 0.5% | largest {100 * worst_after:.2f}% | "
              f"{'yes' if ok_val else 'no'} |",
              f"| final validation loss (step {final}) | within 0.3% | {100 * final_rel:+.2f}% | "
              f"{'yes' if ok_final else 'no'} |",
              f"| spikes forge has and PyTorch not | none | {len(only_forge)}"
              f"{' (steps ' + ', '.join(map(str, only_forge[:10])) + ')' if only_forge else ''}; spikes: forge "
              f"{len(f_spikes)}, PyTorch {len(r_spikes)} | {'yes' if ok_spikes else 'no'} |", ""]
    if t_forge is not None:
        lines.append(f"Time to PyTorch's final validation loss ({target:.4f}): forge {t_forge:.1f} s (validation at "
                     f"step {forge_reach}), PyTorch {t_ref:.1f} s (step {final}): **{t_ref / t_forge:.2f}x** in forge's "
                     "favour (training time, start-up and compilation included, validation passes excluded).")
    else:
        # The lowest loss both reached: PyTorch's lowest validation loss not below forge's best.
        best = min(v for v, _ in f_val.values())
        above = [s for s in sorted(r_val) if r_val[s][0] >= best]
        r_step = min(above, key=lambda s: r_val[s][0]) if above else None
        lines.append(f"forge did not reach PyTorch's final validation loss ({target:.4f}) at any validation step.")
        if r_step is not None:
            goal = r_val[r_step][0]
            f_step = next(s for s in sorted(f_val) if f_val[s][0] <= goal)
            lines.append(f"Time to the lowest loss both reached, PyTorch's at step {r_step} ({goal:.4f}): forge "
                         f"{f_val[f_step][1]:.1f} s (step {f_step}), PyTorch {r_val[r_step][1]:.1f} s: "
                         f"**{r_val[r_step][1] / f_val[f_step][1]:.2f}x** in forge's favour.")
    lines.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    if a.svg:
        def smooth(train):
            st = sorted(train)
            return [(st[i + 49], statistics.fmean(train[t] for t in st[i:i + 50])) for i in range(0, len(st) - 49, 50)]
        svg(a.title, {"forge": {"train": smooth(f_train), "val": [(s, f_val[s][0]) for s in sorted(f_val)]},
                      "PyTorch": {"train": smooth(r_train), "val": [(s, r_val[s][0]) for s in sorted(r_val)]}}, a.svg)
    summary = {"title": a.title, "final_step": final, "final_rel": final_rel, "worst_rel_after": worst_after,
               "forge_spikes": f_spikes, "ref_spikes": r_spikes, "only_forge_spikes": only_forge,
               "target_val": target, "forge_time_s": t_forge, "forge_reach_step": forge_reach, "ref_time_s": t_ref,
               "time_ratio": (t_ref / t_forge) if t_forge else None, "bounds_met": ok_val and ok_final and ok_spikes}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
