#!/usr/bin/env python3
"""benchmarks/results/multinode_<device>.md from benchmarks/multinode/run.sh's raw directory.

The link each row ran on, as measured (forge bench collectives' all-reduce over the simulated nodes:
bus bandwidth in Gb/s beside the rate asked for), then per model one table: every layout on every
link, measured tokens/s (median of the progress records after the first), forge plan's prediction
and its error, and each layout's speed relative to the flat ring on the same link.
"""
import glob
import json
import os
import sys


def main(raw):
    rows = [json.loads(l) for l in open(os.path.join(raw, "rows.jsonl")) if l.strip()]
    commit = open(os.path.join(raw, "commit.txt")).read().strip() if os.path.exists(os.path.join(raw, "commit.txt")) else "?"
    out = ["# Several machines simulated on one host", "",
           f"Raw data: `{raw}` (commit {commit}); written by `benchmarks/multinode/report.py` from "
           "`benchmarks/multinode/run.sh` (the command and its settings are at the top of that script).", ""]
    out += ["## The link, measured", "",
            "`forge bench collectives --ops all_reduce --node-size K --link-gbps R` over the simulated nodes: "
            "bus bandwidth (nccl-tests' convention, 2(W-1)/W x size / time) of the largest size, in Gb/s. The flat "
            "ring's bus bandwidth is the link's rate as delivered; the hierarchical reduction moves fewer bytes "
            "across it, so its figure (same formula) can exceed the link, as can the `-fp8` rows' (`--grad-compression "
            "fp8`: the gradients sent in FP8, the bandwidth counted over the f32 bytes they stand for; their time includes "
            "the coding, which on CPU ranks (some fifteen passes over the tensor, four ranks sharing two cores) can "
            "cost more than the link saves, where a GPU codes at its memory's rate).", "",
            "| link asked (Gb/s) | dp reduce | size | time (ms) | bus bandwidth (Gb/s) | delivered / asked |",
            "|---|---|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(raw, "coll_*.json")), key=lambda p: (float(p.rsplit("_", 1)[1][:-5]), p)):
        try:
            j = json.load(open(path))
        except (ValueError, OSError):
            continue
        reduce, link = os.path.basename(path)[5:-5].rsplit("_", 1)
        res = [r for r in j.get("results", []) if r["op"] == "all_reduce"]
        if not res:
            continue
        r = max(res, key=lambda r: r["bytes"])
        gbps = r["busbw_gbs"] * 8
        out.append(f"| {link} | {reduce} | {r['bytes'] / 2**20:.0f} MiB | {r['time_us'] / 1e3:.1f} | {gbps:.2f} | "
                   f"{gbps / float(link):.2f} |")
    out += ["", "Layouts (benchmarks/multinode/run.sh): flat, DDP over one ring; hier, reduced within each node first; "
            "hier_acc4, the same with 4 micro-batches per step; zero1_hier, ZeRO-1 hierarchical; pp_nodes, one pipeline "
            "stage per node (1F1B); psgd4, PowerSGD rank 4; fp8, the gradient reductions in FP8 (e4m3 blocks, error "
            "feedback); hier_fp8, hierarchical with the stage between nodes in FP8; local, no simulated network. "
            "Compression changes the numbers (its loss: the compression section below, when present)."]
    for model in sorted({r["model"] for r in rows}):
        mrows = [r for r in rows if r["model"] == model]
        out += ["", f"## {model}", "",
                "| link (Gb/s) | layout | batch x accum | tokens/s measured | vs flat | plan tokens/s | plan error |",
                "|---|---|---|---|---|---|---|"]
        flat = {r["link_gbps"]: r["measured"]["tokens_per_s"] for r in mrows if r.get("layout") == "flat" and "measured" in r}
        for r in sorted(mrows, key=lambda r: (r["link_gbps"] == 0, r["link_gbps"], r["layout"])):
            if "error" in r:
                out.append(f"| {r['link_gbps']} | {r['layout']} | | failed: {r['error']} | | | |")
                continue
            m = r["measured"]["tokens_per_s"]
            rel = f"{m / flat[r['link_gbps']]:.2f}x" if r["link_gbps"] in flat else ""
            p = r.get("plan")
            pt = f"{p['tokens_per_s']:,.0f}" if p else "-"
            err = f"{(p['tokens_per_s'] - m) / m * 100:+.1f}%" if p else "-"
            link = r["link_gbps"] if r["link_gbps"] else "none (one host)"
            out.append(f"| {link} | {r['layout']} | {r['batch']} x {r['grad_accum']} | {m:,.0f} | {rel} | {pt} | {err} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
