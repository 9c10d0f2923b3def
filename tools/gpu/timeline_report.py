#!/usr/bin/env python3
"""Reads a decode timeline (PERRY_LAB_DECODE_TIMELINE=file, src/kernels/cuda/lab_timeline.h) and
prints where each kernel's blocks spend a decode step, as a markdown report:

  timeline_report.py FILE [--skip-launches N]

Per kernel kind (GEMV by input/output form and K, attention partial, combine), medians over its
launches of:
  * gap: from the previous launch's last block end to this launch's first block start, and to
    its first block past the PDL wait (global timer, ns);
  * span: first block start to last block end;
  * per block: start -> wait passed, wait -> input built (attention: work done), -> end (SM clock);
  * handoff: on one SM, the previous block's end to this kernel's block start (SM clock), when
    the previous block on that SM belonged to the launch just before;
  * advance: this launch's last block end minus the previous launch's — what the launch adds to
    the step (the advances of all launches sum to the wall time), and its tail: the last block
    end minus the median block end;
  * the token boundary: from lm_head's last block end (the storing GEMV that a GEMV follows, the
    last of a step) to the next step's first GEMV — its first block start, and its last block end (what the
    argmax, the embedding and the boundary between launches add, on top of that GEMV).
SM cycles are turned into ns by the ratio of the global timer to the SM clock over the log.
"""
import argparse
import statistics
import struct
import sys

REC = struct.Struct("<IIIIQQQQQQ")
IN_KIND = {0: "rmsnorm", 1: "plain"}
OUT_KIND = {0: "store", 1: "acc", 2: "swiglu", 3: "rope-kv"}


def label(kernel, arg):
    if kernel == 1:
        return "gemv %s->%s K=%d" % (IN_KIND.get((arg >> 4) & 15, "?"), OUT_KIND.get(arg & 15, "?"), arg >> 8)
    return {2: "attention partial", 3: "attention combine"}.get(kernel, "kernel %d" % kernel)


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"perrytl1":
        sys.exit("%s: not a perry timeline (magic %r)" % (path, data[:8]))
    count, missed = struct.unpack_from("<QQ", data, 8)
    if len(data) != 24 + count * REC.size:
        sys.exit("%s: %d records announced, %d bytes of records" % (path, count, len(data) - 24))
    rows = [REC.unpack_from(data, 24 + i * REC.size) for i in range(count)]
    return rows, missed


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--skip-launches", type=int, default=0, help="leave out the first N launches (warm-up)")
    a = ap.parse_args()
    rows, missed = load(a.file)
    if not rows:
        sys.exit("no records")
    # (kernel, smid, block, arg, g0, g3, c0, c1, c2, c3)
    recs = [dict(kernel=r[0], sm=r[1], block=r[2], arg=r[3], g0=r[4], g3=r[5], c0=r[6], c1=r[7], c2=r[8], c3=r[9])
            for r in rows]
    # ns per SM cycle: global-timer span over clock span, blocks of at least 2 us.
    ratios = [(r["g3"] - r["g0"]) / (r["c3"] - r["c0"]) for r in recs
              if r["c3"] > r["c0"] and r["g3"] - r["g0"] >= 2000]
    ns_per_cycle = med(ratios) if ratios else 1 / 1.98
    # Launches: each block of a launch once; a record joins the open launch of its kind.
    recs.sort(key=lambda r: r["g0"])
    launches, open_by_key = [], {}
    for r in recs:
        key = (r["kernel"], r["arg"])
        l = open_by_key.get(key)
        if l is None or r["block"] in l["blocks"]:
            l = {"key": key, "blocks": set(), "recs": []}
            launches.append(l)
            open_by_key[key] = l
        l["blocks"].add(r["block"])
        l["recs"].append(r)
    launches.sort(key=lambda l: min(r["g0"] for r in l["recs"]))
    for i, l in enumerate(launches):
        for r in l["recs"]:
            r["launch"] = i
    if a.skip_launches >= len(launches):
        sys.exit("only %d launches: --skip-launches %d leaves none" % (len(launches), a.skip_launches))
    stats = {}
    for i, l in enumerate(launches):
        if i < a.skip_launches:
            continue
        rs = l["recs"]
        first = min(r["g0"] for r in rs)
        last = max(r["g3"] for r in rs)
        waited = min(r["g0"] + (r["c1"] - r["c0"]) * ns_per_cycle for r in rs)
        s = stats.setdefault(label(*l["key"]), {"n": 0, "gap": [], "gap_wait": [], "span": [], "pre": [], "build": [],
                                                 "rest": [], "handoff": [], "blocks": [], "advance": [], "tail": []})
        s["n"] += 1
        s["span"].append(last - first)
        s["blocks"].append(len(rs))
        s["tail"].append(last - med([r["g3"] for r in rs]))
        if i > 0:
            prev_last = max(r["g3"] for r in launches[i - 1]["recs"])
            s["gap"].append(first - prev_last)
            s["gap_wait"].append(waited - prev_last)
            s["advance"].append(last - prev_last)
        for r in rs:
            s["pre"].append((r["c1"] - r["c0"]) * ns_per_cycle)
            s["build"].append((r["c2"] - r["c1"]) * ns_per_cycle)
            s["rest"].append((r["c3"] - r["c2"]) * ns_per_cycle)
    # Handoffs on one SM, in clock order.
    by_sm = {}
    for r in recs:
        by_sm.setdefault(r["sm"], []).append(r)
    for sm_recs in by_sm.values():
        sm_recs.sort(key=lambda r: r["c0"])
        for p, q in zip(sm_recs, sm_recs[1:]):
            if q["launch"] == p["launch"] + 1 and q["launch"] >= a.skip_launches:
                stats[label(q["kernel"], q["arg"])]["handoff"].append((q["c0"] - p["c3"]) * ns_per_cycle)
    print("## Decode timeline: %d block records (%d missed), %d launches, %.3f ns an SM cycle"
          % (len(rows), missed, len(launches), ns_per_cycle))
    print()
    print("Medians (µs). advance: previous launch's last block end -> this launch's last block end (the sum over the"
          " launches reported, in ms, is the wall time); tail: last block end - median block end; gap: previous"
          " launch's last block end -> first block start / -> first block past its wait; span: first start -> last"
          " end; pre: block start -> wait passed; build: -> input built (attention: work done); rest: -> block end;"
          " handoff: on one SM, the previous launch's block end -> this block's start.")
    print()
    print("| kernel | launches | blocks | advance (sum ms) | tail | gap start | gap wait | span | pre | build | rest |"
          " handoff (n) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    total_span = 0.0
    for name, s in sorted(stats.items(), key=lambda kv: -sum(kv[1]["advance"])):
        total_span += sum(s["span"])
        print("| %s | %d | %d | %.2f (%.2f) | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f (%d) |" % (
            name, s["n"], med(s["blocks"]), med(s["advance"]) / 1e3, sum(s["advance"]) / 1e6, med(s["tail"]) / 1e3,
            med(s["gap"]) / 1e3, med(s["gap_wait"]) / 1e3, med(s["span"]) / 1e3, med(s["pre"]) / 1e3,
            med(s["build"]) / 1e3, med(s["rest"]) / 1e3, med(s["handoff"]) / 1e3, len(s["handoff"])))
    # The token boundary: lm_head -> the next launch. lm_head is a storing GEMV followed by a GEMV
    # (a storing q|k|v, in models with q/k norm, is followed by attention).
    b_start, b_end = [], []
    for i in range(max(a.skip_launches, 0), len(launches) - 1):
        k, arg = launches[i]["key"]
        if k == 1 and (arg & 15) == 0 and launches[i + 1]["key"][0] == 1:
            last_i = max(r["g3"] for r in launches[i]["recs"])
            nxt = launches[i + 1]["recs"]
            b_start.append(min(r["g0"] for r in nxt) - last_i)
            b_end.append(max(r["g3"] for r in nxt) - last_i)
    if b_start:
        print()
        print("Token boundary (%d): lm_head's last block end -> the next launch's first block start %.2f µs (median;"
              " max %.2f), -> its last block end %.2f µs (max %.2f)."
              % (len(b_start), med(b_start) / 1e3, max(b_start) / 1e3, med(b_end) / 1e3, max(b_end) / 1e3))
    first = min(r["g0"] for l in launches[a.skip_launches:] for r in l["recs"])
    last = max(r["g3"] for r in recs)
    gaps = sum(sum(s["gap"]) for s in stats.values())
    print()
    print("Wall time of the launches reported: %.1f µs; sum of spans %.1f µs; sum of gaps between launches %.1f µs."
          % ((last - first) / 1e3, total_span / 1e3, gaps / 1e3))


if __name__ == "__main__":
    main()
