#!/usr/bin/env python3
"""Per-kernel table of the last decode step in Nsight Compute raw CSVs (profile_decode.sh);
with --first, of the first forward pass after the warm-up ones instead (a prefill).

A forward pass starts with the embedding kernel, so the kernels after the last embedding launch
are one decode step. Prints, per mode, the kernels grouped by name: launches, total and mean
microseconds, and the step's summed kernel time (launch gaps are not in it)."""
import csv
import re
import sys
from collections import OrderedDict


def rows(path):
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    reader = csv.reader(lines)
    header = None
    for r in reader:
        if r and r[0] == "ID":
            header = r
            continue
        if header is None or not r or not r[0].isdigit():
            continue
        d = dict(zip(header, r))
        try:
            us = float(d["gpu__time_duration.sum"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        yield d["Kernel Name"], d.get("Grid Size", ""), d.get("Block Size", ""), us


def short(name):
    name = re.sub(r"\(.*$", "", name) if "<" not in name else name
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"perry::cuda::(\(anonymous namespace\)::)?", "", name)
    return name[:90]


def main():
    args = sys.argv[1:]
    first = "--first" in args
    args = [a for a in args if a != "--first"]
    for path in args:
        mode = re.sub(r".*profile-(.*)\.csv$", r"\1", path)
        ks = list(rows(path))
        if not ks:
            print(f"## {mode}: no kernels in {path}\n")
            continue
        # ncu reports nanoseconds (unit row skipped above); convert to us.
        starts = [i for i, k in enumerate(ks) if "embedding" in k[0]]
        if first:
            # The longest forward (most kernels between two embedding launches, or to the end):
            # the prompt's prefill, whatever warm-up steps precede it.
            bounds = starts + [len(ks)]
            spans = [(bounds[i + 1] - bounds[i], bounds[i]) for i in range(len(starts))] or [(len(ks), 0)]
            n, s0 = max(spans)
            step = ks[s0:s0 + n]
        else:
            step = ks[starts[-1]:] if starts else ks
        groups = OrderedDict()
        for name, grid, block, ns in step:
            g = groups.setdefault(short(name), [0, 0.0, grid, block])
            g[0] += 1
            g[1] += ns / 1000.0
        total = sum(g[1] for g in groups.values())
        print(f"## {mode}: {'first forward' if first else 'last decode step'}, {len(step)} kernels, {total:.1f} us of kernel time\n")
        print("| kernel | launches | total us | mean us | grid | block |")
        print("|---|---:|---:|---:|---|---|")
        for name, (n, us, grid, block) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            print(f"| `{name}` | {n} | {us:.1f} | {us / n:.2f} | {grid} | {block} |")
        print()


if __name__ == "__main__":
    main()
