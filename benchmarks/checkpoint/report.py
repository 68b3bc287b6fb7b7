#!/usr/bin/env python3
"""The checkpoint-stall table from benchmarks/checkpoint/run.sh's raw files (standard library).

  python3 benchmarks/checkpoint/report.py RAW_DIR --commit C --command "..." > benchmarks/results/checkpoint_<gpu>.md

Per model: the state one rank copies to the host (forge's snapshot_bytes), the GPU's pinned
device-to-host bandwidth (forge bench memory, d2h_pinned at its largest size) and the copy time
that gives; forge's stall per checkpoint (metrics.jsonl "stall_s") synchronous and asynchronous,
the asynchronous write's time; DCP's save and async_save on the same state. The first checkpoint
of each run allocates its host memory (pinned, cached after), so it is reported apart; the figures
are medians of the later ones. Targets (issue 35): the asynchronous stall <= 1.1 x the copy time,
and < 0.1 x the synchronous stall.
"""
import argparse
import json
import os
import statistics


def read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def d2h_gbs(raw):
    try:
        j = json.load(open(os.path.join(raw, "bench_memory.json")))
    except (OSError, ValueError):
        return None
    rows = [r for r in j.get("results", []) if r.get("kernel") == "d2h_pinned"]
    return max(rows, key=lambda r: r["bytes"])["gbs"] if rows else None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, unit="s", digits=3):
    return "n/a" if x is None or x != x else f"{x:.{digits}f} {unit}".strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--commit", default="?")
    ap.add_argument("--command", default="benchmarks/checkpoint/run.sh")
    a = ap.parse_args()
    bw = d2h_gbs(a.raw)
    gpu = "?"
    try:
        gpu = json.load(open(os.path.join(a.raw, "bench_memory.json")))["device_name"]
    except (OSError, ValueError, KeyError):
        pass
    print(f"# Checkpoint stall: forge synchronous and asynchronous, beside PyTorch DCP ({gpu})\n")
    print(f"Commit {a.commit}; command `{a.command}`; one GPU. Pinned device-to-host bandwidth (forge bench memory, "
          f"d2h_pinned): {fmt(bw, 'GB/s', 1)}.\n")
    print("| model | state on the host | copy at that bandwidth | forge sync stall | forge async stall | async / copy | "
          "async / sync | async write | DCP save | DCP async_save returns | DCP staged | DCP written |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for m in ("0.85b", "3.6b"):
        runs = {}
        for mode in ("sync", "async"):
            recs = read_jsonl(os.path.join(a.raw, f"{m}_forge_{mode}.metrics.jsonl"))
            ck = [r for r in recs if "stall_s" in r]
            wr = [r["checkpoint_write_s"] for r in recs if "checkpoint_write_s" in r]
            runs[mode] = (ck, wr)
        if not runs["sync"][0] and not runs["async"][0]:
            continue
        ck_a, wr_a = runs["async"]
        ck_s, _ = runs["sync"]
        state = (ck_a or ck_s)[0]["snapshot_bytes"]
        copy = state / (bw * 1e9) if bw else None
        # The stall of the checkpoint itself: a wait for the previous write (checkpoints a minute apart
        # here) is listed apart below.
        sa = med([r["stall_s"] - r.get("wait_previous_s", 0.0) for r in ck_a[1:]])
        ss = med([r["stall_s"] for r in ck_s[1:]])
        try:
            d = json.load(open(os.path.join(a.raw, f"{m}_dcp.json")))
        except (OSError, ValueError):
            d = {"sync": [], "async": []}
        dsync = med([x["stall_s"] for x in d["sync"][1:]])
        dret = med([x["returned_s"] for x in d["async"][1:]])
        dstg = med([x["staged_s"] for x in d["async"][1:]])
        dwr = med([x["written_s"] for x in d["async"][1:]])
        print(f"| LLaMA {m} | {state / 1e9:.2f} GB | {fmt(copy)} | {fmt(ss)} | {fmt(sa)} | "
              f"{fmt(sa / copy if copy else None, 'x', 2)} | {fmt(sa / ss, 'x', 3)} | {fmt(med(wr_a[1:] or wr_a))} | "
              f"{fmt(dsync)} | {fmt(dret)} | {fmt(dstg)} | {fmt(dwr)} |")
        notes.append(f"- LLaMA {m}: first checkpoint (host memory allocated): forge async stall "
                     f"{fmt(ck_a[0]['stall_s'] if ck_a else None)}, sync {fmt(ck_s[0]['stall_s'] if ck_s else None)}; "
                     f"DCP save {fmt(d['sync'][0]['stall_s'] if d['sync'] else None)}, async_save returned "
                     f"{fmt(d['async'][0]['returned_s'] if d['async'] else None)}. Checkpoints measured: forge "
                     f"{len(ck_s)} sync / {len(ck_a)} async, DCP {len(d['sync'])} / {len(d['async'])}; "
                     f"all forge stalls (s): sync {[round(r['stall_s'], 3) for r in ck_s]}, async "
                     f"{[round(r['stall_s'], 3) for r in ck_a]} (of which waiting for the previous write: "
                     f"{[round(r.get('wait_previous_s', 0.0), 3) for r in ck_a]}); async writes (s): "
                     f"{[round(x, 1) for x in wr_a]}. DCP {d.get('torch', '?')}, {d.get('async_api', '?')}; "
                     f"DCP state {d.get('state_bytes', 0) / 1e9:.2f} GB.")
        if copy and sa == sa:
            notes.append(f"  Targets: async stall {sa:.3f} s <= 1.1 x copy {1.1 * copy:.3f} s: "
                         f"{'met' if sa <= 1.1 * copy else 'MISSED'}; < 0.1 x sync stall {0.1 * ss:.3f} s: "
                         f"{'met' if sa < 0.1 * ss else 'MISSED'}.")
    print("\nMedians over the checkpoints after the first of each run (the first allocates the pinned host "
          "memory it then reuses):\n")
    print("\n".join(notes))


if __name__ == "__main__":
    main()
