#!/usr/bin/env python3
"""Plots train_log/<model>.json loss curves to train_log/<model>.png (matplotlib, Agg backend).

make_models.py calls plot_all() on the GPU machine; to redo it elsewhere:
  python3 tools/gpu/plot_loss.py DIR_WITH_TRAIN_LOG_JSONS
(on Debian: apt-get install python3-matplotlib).
"""
import glob
import json
import math
import os
import sys


def plot_one(json_path, png_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path, encoding="utf-8") as f:
        log = json.load(f)
    hist = log["train"]["history"]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    tr = hist.get("train", [])
    ev = hist.get("eval", [])
    if tr:
        ax.plot([p["tokens"] / 1e6 for p in tr], [p["loss"] for p in tr], label="train loss (mean of 10 steps)",
                linewidth=1)
    if ev:
        ax.plot([p["tokens"] / 1e6 for p in ev], [p["heldout_loss"] for p in ev], "o-", label="held-out loss",
                markersize=3)
    best = log["train"].get("best_heldout_loss")
    if best is not None and math.isfinite(best):
        ax.axhline(best, color="gray", linestyle=":", linewidth=1,
                   label=f"best held-out {best:.3f} (ppl {math.exp(best):.1f})")
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"{log['name']}: {log.get('params', '?')} parameters, {log['train'].get('steps', '?')} steps, "
                 f"{log['train'].get('train_time_s', '?')} s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def plot_all(train_log_dir):
    done = []
    for p in sorted(glob.glob(os.path.join(train_log_dir, "*.json"))):
        done.append(plot_one(p, p[:-5] + ".png"))
    return done


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    for png in plot_all(sys.argv[1]):
        print(png)
