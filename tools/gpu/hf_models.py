"""Model definitions for perry's checkpoints, built with transformers' own classes so every file
is a genuine Hugging Face checkpoint (config.json, safetensors, generation_config.json).

Written against transformers 5.x (RoPE settings live in `rope_parameters`; `dtype=` not
`torch_dtype=`), with a fallback to the 4.x keywords (rope_theta / rope_scaling) where a
constructor refuses the 5.x ones.
"""
import json
import os
import shutil

import golden_util as gu

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 256}

# The trained models. Sizes keep the whole result bundle under the device tool's 64 MiB.
TRAINED = {
    "perry-qwen3-20m": dict(
        family="qwen3", hidden_size=512, intermediate_size=1024, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
        lr=1.5e-3, batch=32, seq=512, warmup=100, max_epochs=10.0, seed=1234),
    "perry-llama-8m": dict(
        family="llama", hidden_size=256, intermediate_size=768, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
        max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
        lr=2e-3, batch=32, seq=512, warmup=80, max_epochs=10.0, seed=4321),
}

# Random-init checkpoints for the loader's per-family golden tests. Non-default eps and theta on
# purpose, so a loader that ignores config.json fails them. "legacy_config": rewrite config.json
# the way transformers 4.x / the Hub's Llama-3 and Qwen2 files spell RoPE (rope_theta +
# rope_scaling) instead of 5.x's rope_parameters, so both spellings are covered.
TINY = {
    "tiny-random-llama": dict(
        family="llama", dtype="bfloat16", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
        max_position_embeddings=2048, rms_norm_eps=3e-5, rope_theta=50000.0, rope_scaling=LLAMA3_SCALING,
        legacy_config=True, seed=101),
    "tiny-random-qwen2": dict(
        family="qwen2", dtype="bfloat16", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=None, tie_word_embeddings=True,
        max_position_embeddings=4096, rms_norm_eps=2e-6, rope_theta=20000.0, rope_scaling=None,
        legacy_config=True, seed=102),
    "tiny-random-qwen3": dict(
        family="qwen3", dtype="bfloat16", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False,
        max_position_embeddings=4096, rms_norm_eps=4e-6, rope_theta=30000.0, rope_scaling=None,
        seed=103),
    "tiny-random-qwen3-f16": dict(
        family="qwen3", dtype="float16", hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, head_dim=48, tie_word_embeddings=True,
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=70000.0, rope_scaling=None,
        seed=104),
    "tiny-random-llama-f32": dict(
        family="llama", dtype="float32", hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=24, tie_word_embeddings=True,
        max_position_embeddings=2048, rms_norm_eps=5e-6, rope_theta=25000.0, rope_scaling=None,
        seed=105),
    "tiny-random-qwen2-sharded": dict(
        family="qwen2", dtype="bfloat16", hidden_size=96, intermediate_size=192, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, head_dim=None, tie_word_embeddings=True,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
        max_shard_size=400_000, seed=106),
}


def config_class(family):
    import transformers

    return {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "qwen3": transformers.Qwen3Config}[family]


def rope_of(cfg):
    """{"rope_theta", "rope_type", ...} from a config of either transformers generation."""
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and rp:
        return dict(rp)
    out = {"rope_theta": getattr(cfg, "rope_theta", None), "rope_type": "default"}
    rs = getattr(cfg, "rope_scaling", None)
    if isinstance(rs, dict):
        out.update(rs)
        out["rope_type"] = rs.get("rope_type", rs.get("type", "default"))
    return out


def build_config(spec, vocab_size, special):
    """A transformers config from one TRAINED/TINY entry; checks RoPE arrived as asked."""
    cls = config_class(spec["family"])
    kw = dict(
        vocab_size=vocab_size, hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], hidden_act="silu",
        max_position_embeddings=spec["max_position_embeddings"], rms_norm_eps=float(spec["rms_norm_eps"]),
        tie_word_embeddings=bool(spec["tie_word_embeddings"]), attention_dropout=0.0,
        bos_token_id=None, eos_token_id=special[gu.IM_END], pad_token_id=special[gu.EOT],
        initializer_range=0.02, use_cache=True,
    )
    if spec.get("head_dim") is not None:
        kw["head_dim"] = int(spec["head_dim"])
    theta = float(spec["rope_theta"])
    scaling = spec.get("rope_scaling")
    rope_parameters = dict(scaling) if scaling else {"rope_type": "default"}
    rope_parameters["rope_theta"] = theta
    try:
        cfg = cls(rope_parameters=rope_parameters, **kw)
        got = rope_of(cfg)
        if got.get("rope_theta") is None or abs(float(got["rope_theta"]) - theta) > 1e-6 * theta:
            raise ValueError(f"rope_parameters not taken: {got}")
    except Exception as e:  # noqa: BLE001 - older transformers: 4.x keywords
        print(f"  config: rope_parameters refused ({type(e).__name__}: {e}); using rope_theta/rope_scaling",
              flush=True)
        cfg = cls(rope_theta=theta, rope_scaling=dict(scaling) if scaling else None, **kw)
    got = rope_of(cfg)
    if abs(float(got["rope_theta"]) - theta) > 1e-6 * theta:
        raise ValueError(f"rope_theta {got.get('rope_theta')} != {theta}")
    want_type = scaling["rope_type"] if scaling else "default"
    if got.get("rope_type", "default") != want_type:
        raise ValueError(f"rope_type {got.get('rope_type')} != {want_type}")
    if scaling:
        for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if float(got[k]) != float(scaling[k]):
                raise ValueError(f"rope {k} {got[k]} != {scaling[k]}")
    if spec.get("head_dim") is not None and int(getattr(cfg, "head_dim", spec["head_dim"])) != int(spec["head_dim"]):
        raise ValueError(f"head_dim not taken: {getattr(cfg, 'head_dim', None)}")
    return cfg


def new_model(cfg, attn_implementation):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=attn_implementation)
    except TypeError:
        model = AutoModelForCausalLM.from_config(cfg)
        model = model.float()
    return model


def init_random_(model, seed, linear_std=0.1, embed_std=1.0, head_std=0.25, bias_std=0.1):
    """Wider-than-default random init (CPU generator: same weights on any machine) so logits are
    far from flat and greedy continuations are stable: linear N(0, 0.1), embeddings N(0, 1),
    untied lm_head N(0, 0.25), biases N(0, 0.1), norm weights U[0.5, 1.5)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied lm_head is listed once, as embed_tokens
            parts = name.split(".")
            owner = parts[-2] if len(parts) >= 2 else ""
            if "norm" in owner:
                val = torch.rand(p.shape, generator=g) + 0.5
            elif parts[-1] == "bias":
                val = torch.randn(p.shape, generator=g) * bias_std
            elif "embed_tokens" in name:
                val = torch.randn(p.shape, generator=g) * embed_std
            elif "lm_head" in name:
                val = torch.randn(p.shape, generator=g) * head_std
            else:
                val = torch.randn(p.shape, generator=g) * linear_std
            p.copy_(val.to(p.dtype))


def link_or_copy(src, dst):
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.link(src, dst)  # the bundle stores hard-linked files once
    except OSError:
        shutil.copyfile(src, dst)


def write_generation_config(model_dir, special):
    import transformers

    gen = {
        "do_sample": False,
        "eos_token_id": [special[gu.IM_END], special[gu.EOT]],
        "pad_token_id": special[gu.EOT],
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(model_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")


def save_model(model, model_dir, dtype_name, tokenizer_dir, special, max_shard_size=None):
    """save_pretrained in the given dtype, plus tokenizer files and generation_config.json."""
    import torch

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype_name]
    os.makedirs(model_dir, exist_ok=True)
    model = model.to(dtype)
    kwargs = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(model_dir, **kwargs)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        link_or_copy(os.path.join(tokenizer_dir, fname), os.path.join(model_dir, fname))
    write_generation_config(model_dir, special)
    files = sorted(os.listdir(model_dir))
    if not any(f.endswith(".safetensors") for f in files):
        raise RuntimeError(f"save_pretrained wrote no .safetensors in {model_dir}: {files}")
    if max_shard_size is not None and "model.safetensors.index.json" not in files:
        raise RuntimeError(f"expected a sharded checkpoint in {model_dir}: {files}")
    return files


def rewrite_config_legacy(model_dir):
    """config.json in the 4.x spelling (rope_theta + rope_scaling, torch_dtype), then checks that
    transformers reads back the same RoPE settings; restores the original on any doubt."""
    from transformers import AutoConfig

    path = os.path.join(model_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        original_text = f.read()
    d = json.loads(original_text)
    before = rope_of(AutoConfig.from_pretrained(model_dir))
    if "rope_parameters" not in d:
        return "already legacy"
    rp = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.get("rope_type", "default")
    d["rope_scaling"] = None if rtype == "default" and len(rp) <= 1 else rp
    if "dtype" in d:
        d["torch_dtype"] = d.pop("dtype")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")
    try:
        after = rope_of(AutoConfig.from_pretrained(model_dir))
        keys = set(before) | set(after)
        same = all(_num_eq(before.get(k), after.get(k)) for k in keys if k not in ("type",))
        if not same:
            raise ValueError(f"RoPE differs after rewrite: {before} vs {after}")
    except Exception as e:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original_text)
        return f"kept 5.x config ({e})"
    return "rewritten"


def _num_eq(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def make_tiny(name, spec, vocab_size, special, tokenizer_dir, models_root, log):
    cfg = build_config(spec, vocab_size, special)
    model = new_model(cfg, "eager")
    init_random_(model, spec["seed"])
    model_dir = os.path.join(models_root, name)
    files = save_model(model, model_dir, spec["dtype"], tokenizer_dir, special, spec.get("max_shard_size"))
    note = rewrite_config_legacy(model_dir) if spec.get("legacy_config") else "5.x config"
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files if f.endswith(".safetensors"))
    log(f"  {name}: {n_params} params, {size} bytes of safetensors, {spec['dtype']}, {note}, files {files}")
    return {"name": name, "params": n_params, "safetensors_bytes": size, "dtype": spec["dtype"], "config": note}
