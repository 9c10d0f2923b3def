#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction, from Nsight Compute's source page.

    ncu --section WarpStateStats --section SourceCounters ... -o rep <program>
    ncu --import rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 tools/gpu/ncu_sass_stalls.py sass.csv [--top 40] [--context 0] > stalls.md

Prints (markdown): the stall reasons over the whole kernel, the instructions with the most
samples (address, SASS, executions, their two main reasons), and the share of the samples by
opcode. No -lineinfo is needed: the SASS view carries the samples. The thirty-second session found
with it that a lab switch tested per word inside an unrolled loop serialized the register-A
kernel's int4 conversion (docs/perf/cuda/s32-runs1-6-two-level-conversion-gemv-chain.md).
"""
import argparse
import csv
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # The page starts with a "Kernel Name" line, then the header (the one naming "Address").
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[head]
    col = {h: i for i, h in enumerate(header)}
    if SAMPLES not in col or "Source" not in col:
        sys.exit(f"{path}: no '{SAMPLES}' / 'Source' columns: profile with --section SourceCounters "
                 "--section WarpStateStats and print the page with --print-source sass")
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    kernel = rows[head - 1][1] if head > 0 and len(rows[head - 1]) > 1 else "?"
    insts = []
    for r in rows[head + 1:]:
        if len(r) < len(header):
            continue
        try:
            n = int(r[col[SAMPLES]] or 0)
        except ValueError:
            continue
        reasons = {h[len("stall_"):]: int(r[col[h]] or 0) for h in stalls}
        executed = r[col["Instructions Executed"]] if "Instructions Executed" in col else ""
        insts.append({"addr": r[col["Address"]], "sass": r[col["Source"]].strip(), "samples": n,
                      "executed": executed, "reasons": reasons})
    return kernel, insts


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40, help="instructions listed (most samples first)")
    ap.add_argument("--context", type=int, default=0,
                    help="also print this many instructions before and after each listed one")
    a = ap.parse_args()
    kernel, insts = load(a.csv)
    total = sum(i["samples"] for i in insts)
    if total == 0:
        sys.exit(f"{a.csv}: no stall samples")
    print(f"# Stall samples of {kernel}\n\n{total} samples over {len(insts)} SASS instructions.\n")
    reasons = Counter()
    for i in insts:
        reasons.update(i["reasons"])
    print("| reason | samples | share |\n|---|---:|---:|")
    for k, v in reasons.most_common(12):
        print(f"| {k} | {v} | {100 * v / total:.1f}% |")
    ops = Counter()
    for i in insts:
        ops[opcode(i["sass"])] += i["samples"]
    print("\n| opcode | samples | share |\n|---|---:|---:|")
    for k, v in ops.most_common(15):
        print(f"| {k} | {v} | {100 * v / total:.1f}% |")
    print(f"\n## The {a.top} instructions with the most samples\n")
    print("| address | samples | share | executed | SASS | main reasons |\n|---|---:|---:|---:|---|---|")
    order = sorted(range(len(insts)), key=lambda j: -insts[j]["samples"])[:a.top]
    for j in order:
        i = insts[j]
        top = sorted(i["reasons"].items(), key=lambda kv: -kv[1])[:2]
        why = ", ".join(f"{k} {v}" for k, v in top if v)
        print(f"| {i['addr'][-6:]} | {i['samples']} | {100 * i['samples'] / total:.1f}% | {i['executed']} | "
              f"`{i['sass']}` | {why} |")
    if a.context > 0:
        print("\n## Around them\n")
        for j in sorted(order):
            print("```")
            for k in range(max(0, j - a.context), min(len(insts), j + a.context + 1)):
                i = insts[k]
                mark = ">" if k == j else " "
                print(f"{mark} {i['addr'][-6:]} {i['samples']:6d}  {i['sass']}")
            print("```")


if __name__ == "__main__":
    main()
