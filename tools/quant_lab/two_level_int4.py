#!/usr/bin/env python3
"""Weight-only accuracy of a two-level int4 format against perry's float-scale g128 int4.

Writes two fake-quantized f32 copies of a checkpoint (every decoder-layer linear quantized, then
dequantized; embeddings, norms and the tied lm_head kept) for `perry ppl --quant f32`, and prints
each format's relative weight error. The formats (docs/research-hopper-int4.md):

  g128     perry's w4a16 / w4a8-g128 rule: per 128-k group, scale = amax / 7, q = nearbyint(w / scale)
           in [-7, 7] (src/quant/quant.cpp).
  2level   one float scale per row s1 = amax_row / 112 and an integer group scale s2 in [1, 16]:
           s2 = ceil(amax_group / (7 s1)), q = nearbyint(w / (s1 s2)) in [-7, 7]. Then s2 q is an
           int8 (|s2 q| <= 112), so the int32 accumulation spans K with no per-group fold.
  2level17   s2 in [1, 17] with s1 = amax_row / 119 (|s2 q| <= 119, still an int8).
  2level-ls  2level with each group's s2 the better (squared error) of ceil and ceil - 1.

Pure Python (no numpy on the dev machine): ~1 minute for perry-qwen3-20m.
  python3 tools/quant_lab/two_level_int4.py models/perry-qwen3-20m /tmp/ql
"""
import json
import math
import os
import shutil
import struct
import sys

GROUP = 128
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def to_f32(dtype, raw):
    if dtype == "BF16":
        u = struct.unpack("<%dH" % (len(raw) // 2), raw)
        return list(struct.unpack("<%df" % len(u), struct.pack("<%dI" % len(u), *[x << 16 for x in u])))
    if dtype == "F32":
        return list(struct.unpack("<%df" % (len(raw) // 4), raw))
    raise SystemExit("unsupported dtype " + dtype)


def quant_g128(row):
    out = []
    for g in range(0, len(row), GROUP):
        grp = row[g:g + GROUP]
        scale = max(abs(v) for v in grp) / 7.0
        out += [min(max(round(v / scale), -7), 7) * scale if scale > 0 else 0.0 for v in grp]
    return out


def quant_two_level(row, s2_max=16):
    s1 = max(abs(v) for v in row) / (7.0 * s2_max)
    if s1 == 0:
        return [0.0] * len(row)
    out = []
    for g in range(0, len(row), GROUP):
        grp = row[g:g + GROUP]
        s2 = min(max(math.ceil(max(abs(v) for v in grp) / (7.0 * s1) - 1e-9), 1), s2_max)
        step = s1 * s2
        out += [min(max(round(v / step), -7), 7) * step for v in grp]
    return out


def quant_two_level_ls(row):
    """As quant_two_level, but each group's s2 is the better of ceil and ceil - 1 (squared error;
    ceil - 1 clips the group's largest values to ±7 steps)."""
    s1 = max(abs(v) for v in row) / 112.0
    if s1 == 0:
        return [0.0] * len(row)
    out = []
    for g in range(0, len(row), GROUP):
        grp = row[g:g + GROUP]
        hi = min(max(math.ceil(max(abs(v) for v in grp) / (7.0 * s1) - 1e-9), 1), 16)
        best = None
        for s2 in (hi, hi - 1) if hi > 1 else (hi,):
            step = s1 * s2
            q = [min(max(round(v / step), -7), 7) * step for v in grp]
            e = sum((a - b) ** 2 for a, b in zip(grp, q))
            if best is None or e < best[0]:
                best = (e, q)
        out += best[1]
    return out


def main():
    src, dst = sys.argv[1], sys.argv[2]
    header, data = read_safetensors(os.path.join(src, "model.safetensors"))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    formats = (("g128", quant_g128), ("2level", quant_two_level), ("2level17", lambda r: quant_two_level(r, 17)),
               ("2level-ls", quant_two_level_ls))
    for fmt, fn in formats:
        out_dir = os.path.join(dst, fmt)
        os.makedirs(out_dir, exist_ok=True)
        for f in os.listdir(src):
            if f != "model.safetensors":
                shutil.copy(os.path.join(src, f), out_dir)
        new_header, blobs, off = {}, [], 0
        err2 = ref2 = 0.0
        for name, t in tensors.items():
            b, e = t["data_offsets"]
            vals = to_f32(t["dtype"], data[b:e])
            if any(name.endswith(l + ".weight") for l in LINEARS):
                rows, cols = t["shape"]
                q = []
                for r in range(rows):
                    q += fn(vals[r * cols:(r + 1) * cols])
                err2 += sum((a - b) ** 2 for a, b in zip(vals, q))
                ref2 += sum(a * a for a in vals)
                vals = q
            blob = struct.pack("<%df" % len(vals), *vals)
            new_header[name] = {"dtype": "F32", "shape": t["shape"], "data_offsets": [off, off + len(blob)]}
            blobs.append(blob)
            off += len(blob)
        h = json.dumps(new_header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for blob in blobs:
                f.write(blob)
        cfg_path = os.path.join(out_dir, "config.json")
        cfg = json.load(open(cfg_path))
        cfg["dtype"] = "float32"
        json.dump(cfg, open(cfg_path, "w"), indent=2)
        print("%-7s relative weight error (L2, all layer linears): %.5f -> %s" % (fmt, math.sqrt(err2 / ref2), out_dir))


if __name__ == "__main__":
    main()
