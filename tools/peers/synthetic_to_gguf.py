#!/usr/bin/python3
"""Write perry's synthetic `llama3.2-1b` weights as a llama.cpp GGUF (BF16), bit-identical.

perry's SyntheticWeights (src/model/synthetic.cpp) fills every tensor with a counter-based
splitmix64 stream seeded by seed ^ FNV-1a(tensor name), maps the top 24 bits to u in [-1, 1),
computes center + amp * u in float32 and rounds to bf16 (round-to-nearest-even). This script
reproduces that with vectorised numpy on uint64 arrays, so llama.cpp and perry run on the very same
weights. The GGUF follows llama.cpp's own converter (convert_hf_to_gguf.py / conversion/llama.py):
tensor names, Q/K rows permuted from HF's rotate-half layout to GGML's interleaved one, norms as
F32, a rope_freqs tensor for Llama-3 RoPE scaling, tied embeddings (no output.weight). The
tokenizer metadata is copied from llama.cpp's models/ggml-vocab-llama-bpe.gguf (Llama-3 vocab).

  synthetic_to_gguf.py --llama-src /tmp/llama.cpp/src --out X-bf16.gguf      # write
  synthetic_to_gguf.py --llama-src ... --check X-bf16.gguf [--perry-dump BIN]  # verify
"""
import argparse
import math
import subprocess
import sys
import time

import numpy as np

# The preset, as in synthetic_preset("llama3.2-1b") (src/model/synthetic.cpp).
CFG = dict(vocab=128256, hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64,
           rope_theta=500000.0, rms_eps=1e-5, max_pos=131072,
           rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig=8192)
SEED = 1234  # SyntheticWeights' default seed, used by `perry --synthetic`

M64 = (1 << 64) - 1


def fnv1a64(name: str) -> int:
    h = 1469598103934665603
    for b in name.encode():
        h = ((h ^ b) * 1099511628211) & M64
    return h


def hf_tensors(c=CFG):
    """(name, shape, kind) in the order of expected_tensors() (src/model/tensor_names.cpp)."""
    H, I, Q, KV = c["hidden"], c["inter"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    t = [("model.embed_tokens.weight", (c["vocab"], H), "embed")]
    for l in range(c["layers"]):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", (H,), "norm"),
              (p + "self_attn.q_proj.weight", (Q, H), "linear"),
              (p + "self_attn.k_proj.weight", (KV, H), "linear"),
              (p + "self_attn.v_proj.weight", (KV, H), "linear"),
              (p + "self_attn.o_proj.weight", (H, Q), "linear"),
              (p + "post_attention_layernorm.weight", (H,), "norm"),
              (p + "mlp.gate_proj.weight", (I, H), "linear"),
              (p + "mlp.up_proj.weight", (I, H), "linear"),
              (p + "mlp.down_proj.weight", (H, I), "linear")]
    t.append(("model.norm.weight", (H,), "norm"))
    return t  # tie_word_embeddings: no lm_head


def synthetic_bf16(name, shape, kind, seed=SEED, count=None):
    """perry's SyntheticWeights::get() in numpy; returns uint16 bf16 bits (first `count` values)."""
    n = int(np.prod(shape)) if count is None else count
    k = shape[-1]
    if kind == "norm":
        amp, center = np.float32(0.1), np.float32(1.0)
    else:
        amp, center = np.sqrt(np.float32(3.0) / np.float32(k)), np.float32(0.0)  # float sqrt, as std::sqrt(float)
    s = np.uint64((seed ^ fnv1a64(name)) & M64)
    out = np.empty(n, dtype=np.uint16)
    g = np.uint64(0x9E3779B97F4A7C15)
    c1, c2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31, s40, s16 = (np.uint64(x) for x in (30, 27, 31, 40, 16))
    step = 1 << 22
    with np.errstate(over="ignore"):
        for b in range(0, n, step):
            e = min(n, b + step)
            z = np.arange(b + 1, e + 1, dtype=np.uint64)
            z *= g
            z += s
            z ^= z >> s30
            z *= c1
            z ^= z >> s27
            z *= c2
            z ^= z >> s31
            u = (z >> s40).astype(np.float32)
            u *= np.float32(1.0 / 16777216.0)
            u *= np.float32(2.0)
            u -= np.float32(1.0)
            v = center + amp * u  # float32, two roundings (perry is built without FP contraction)
            bits = v.view(np.uint32)
            bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            out[b:e] = bits.astype(np.uint16)
    return out.reshape(shape) if count is None else out


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << np.uint32(16)).view(np.float32)


def permute(w, n_head, n_head_kv):
    """LlamaModel.permute: HF rotate-half rows -> GGML interleaved (conversion/llama.py)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    parts = hf.split(".")
    l, rest = parts[2], ".".join(parts[3:])
    m = {"input_layernorm.weight": "attn_norm", "self_attn.q_proj.weight": "attn_q",
         "self_attn.k_proj.weight": "attn_k", "self_attn.v_proj.weight": "attn_v",
         "self_attn.o_proj.weight": "attn_output", "post_attention_layernorm.weight": "ffn_norm",
         "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down"}
    return f"blk.{l}.{m[rest]}.weight"


def gguf_layout(hf, shape, kind, c=CFG):
    """The tensor as llama.cpp stores it (numpy: F32 for norms, uint16 bf16 bits otherwise)."""
    w = synthetic_bf16(hf, shape, kind)
    if hf.endswith("q_proj.weight"):
        w = permute(w, c["heads"], c["heads"])
    elif hf.endswith("k_proj.weight"):
        w = permute(w, c["heads"], c["kv_heads"])
    if kind == "norm":
        return bf16_to_f32(w)  # 1-D tensors are F32 in llama.cpp's converter; bf16 -> f32 is exact
    return np.ascontiguousarray(w)


def rope_freqs(c=CFG):
    """generate_extra_tensors() of conversion/llama.py for rope_type llama3."""
    dim, base = c["head_dim"], c["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    lo_wl, hi_wl = c["rope_orig"] / c["rope_low"], c["rope_orig"] / c["rope_high"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(c["rope_factor"])
        else:
            sm = (c["rope_orig"] / wl - c["rope_low"]) / (c["rope_high"] - c["rope_low"])
            out.append(1 / ((1 - sm) / c["rope_factor"] + sm))
    return np.array(out, dtype=np.float32)


def write(gguf, llama_src, path, c=CFG):
    vocab = gguf.GGUFReader(f"{llama_src}/models/ggml-vocab-llama-bpe.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("perry-synthetic-llama3.2-1b")
    w.add_context_length(c["max_pos"])
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["inter"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv_heads"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_eps"])
    w.add_vocab_size(c["vocab"])
    w.add_rope_dimension_count(c["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    n_vocab = None
    for key, f in vocab.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            vals = f.contents()
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(vals)
            w.add_array(key, vals)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(key, f.contents())
        elif vt == gguf.GGUFValueType.UINT32:
            w.add_uint32(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), vt)
    if n_vocab != c["vocab"]:
        raise SystemExit(f"vocab file has {n_vocab} tokens, the preset needs {c['vocab']}")

    # Declare all tensors, then stream them one at a time (the BF16 model is 2.5 GB).
    specs = hf_tensors(c)
    w.add_tensor_info("rope_freqs.weight", (c["head_dim"] // 2,), np.dtype(np.float32), c["head_dim"] // 2 * 4)
    for hf, shape, kind in specs:
        if kind == "norm":
            w.add_tensor_info(gguf_name(hf), shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            w.add_tensor_info(gguf_name(hf), shape, np.dtype(np.uint16), int(np.prod(shape)) * 2,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.write_tensor_data(rope_freqs(c))
    t0 = time.time()
    for i, (hf, shape, kind) in enumerate(specs):
        w.write_tensor_data(gguf_layout(hf, shape, kind, c))
        if i % 20 == 0:
            print(f"  {i + 1}/{len(specs)} tensors, {time.time() - t0:.0f} s", file=sys.stderr)
    w.close()


CHECK_TENSORS = [("model.embed_tokens.weight", "embed"), ("model.layers.0.self_attn.q_proj.weight", "linear"),
                 ("model.layers.7.self_attn.k_proj.weight", "linear"), ("model.layers.15.mlp.down_proj.weight", "linear"),
                 ("model.layers.3.input_layernorm.weight", "norm"), ("model.norm.weight", "norm")]


def check(gguf, path, perry_dump, c=CFG):
    """Read tensors back from the GGUF, undo the permutation and compare with the generator (and,
    for the first values, with perry's own SyntheticWeights through tools/peers/synthetic_dump)."""
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    shapes = {hf: shape for hf, shape, _ in hf_tensors(c)}
    ok = True
    for hf, kind in CHECK_TENSORS:
        t = by_name[gguf_name(hf)]
        shape = shapes[hf]
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            got = np.asarray(t.data).view(np.uint16).reshape(shape)
            got_f = bf16_to_f32(got)
        else:
            got_f = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        if hf.endswith("q_proj.weight"):
            got_f = unpermute(got_f, c["heads"], c["heads"])
        elif hf.endswith("k_proj.weight"):
            got_f = unpermute(got_f, c["heads"], c["kv_heads"])
        ref = bf16_to_f32(synthetic_bf16(hf, shape, kind))
        if t.tensor_type in (gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32):
            same = np.array_equal(got_f, ref)
            ok &= same
            print(f"{gguf_name(hf):24s} {t.tensor_type.name:5s} bit-identical to perry's generator: {same}")
        else:  # a quantized copy: report how far llama.cpp's quantization moved it
            rel = float(np.linalg.norm(got_f - ref) / np.linalg.norm(ref))
            ok &= rel < 0.2
            print(f"{gguf_name(hf):24s} {t.tensor_type.name:5s} relative L2 error vs the bf16 weights: {rel:.4f}")
    if perry_dump:
        names = [hf for hf, _ in CHECK_TENSORS]
        out = subprocess.run([perry_dump, *names], check=True, capture_output=True, text=True).stdout.split("\n")
        lines = [l for l in out if l.strip()]
        for hf, kind in CHECK_TENSORS:
            line = next(l for l in lines if l.split()[0] == hf)
            perry_vals = [int(x, 16) for x in line.split()[1:]]
            mine = [int(x) for x in synthetic_bf16(hf, shapes[hf], kind, count=len(perry_vals))]
            same = perry_vals == mine and len(mine) == 8
            ok &= same
            print(f"{hf:42s} first 8 bf16 from perry {' '.join(f'{v:04x}' for v in perry_vals)} "
                  f"== numpy: {same}")
    print("EQUIVALENCE", "OK" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", required=True, help="llama.cpp source (for gguf-py and the vocab file)")
    ap.add_argument("--out", help="write the BF16 GGUF here")
    ap.add_argument("--check", help="verify this GGUF against the generator")
    ap.add_argument("--perry-dump", help="tools/peers/synthetic_dump binary, to cross-check against perry")
    a = ap.parse_args()
    sys.path.insert(0, f"{a.llama_src}/gguf-py")
    import gguf  # noqa: E402  (llama.cpp's own writer/reader)
    if a.out:
        write(gguf, a.llama_src, a.out)
    if a.check:
        sys.exit(0 if check(gguf, a.check, a.perry_dump) else 1)


if __name__ == "__main__":
    main()
