"""Golden outputs from Hugging Face transformers for one checkpoint directory.

For each fixed prompt: the prompt ids, the float32 logits at the last position (full vocabulary,
exact float32 values), the top-5, a 32-token greedy continuation (argmax of a full float32
forward per step, no end-of-sequence stop: the exact oracle for perry's greedy decoding) and what
model.generate() returns (KV cache, stops at eos). For trained models also the held-out
perplexity with perry's windowing (golden_util.py), with float32 and with bf16 weights.
Model loaded with dtype=torch.float32 (bf16 for the bf16 run), attn_implementation="eager".
"""
import hashlib
import json
import os
import time

import golden_util as gu

TEXT_PROMPTS = [
    ("ishmael", "Call me Ishmael. Some years ago"),
    ("genesis", "In the beginning God created"),
    ("sotu_opening", "Mr. Speaker, Mr. Vice President, Members of Congress, my fellow Americans:"),
    ("single_word", "The"),
    ("numbers_unicode", "In 1862, the Congress\u2014after 3 long debates\u2014voted 97\u201312 on \u201cthe question\u201d; caf\u00e9 na\u00efve \u00bd."),
    # A long prompt (~400 tokens) from the held-out text: positions past 256 exercise RoPE
    # scaling (Llama-3 style, original_max_position_embeddings 256) and longer attention.
    ("long_heldout", None),
]
CHAT_PROMPTS = [
    ("chat_user", [{"role": "user", "content": "What is the State of the Union?"}]),
    ("chat_multi_turn", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me about the whale."},
        {"role": "assistant", "content": "The whale is a great fish of the sea."},
        {"role": "user", "content": "And Ahab?"},
    ]),
]
LONG_PROMPT_CHARS = 1600
GREEDY_TOKENS = 32
PPL_RUNS = [("ctx256", 256, 256), ("ctx512", 512, 512), ("ctx512_stride256", 512, 256)]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def long_prompt_text(heldout_text):
    # Starts at a paragraph of the Moby-Dick part, ends at a word boundary.
    start = heldout_text.find("CHAPTER 135.")
    start = 0 if start < 0 else start
    chunk = heldout_text[start:start + LONG_PROMPT_CHARS]
    cut = chunk.rfind(" ")
    return chunk[:cut] if cut > 0 else chunk


def load_model(model_dir, dtype, device):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="eager")
    model.to(device)
    model.eval()
    got = next(model.parameters()).dtype
    if got != dtype:
        raise RuntimeError(f"asked for {dtype}, model loaded as {got}")
    return model


def load_tokenizers(model_dir):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    hf, note = None, "ok"
    try:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # noqa: BLE001
        note = f"AutoTokenizer failed: {type(e).__name__}: {e}"
    return raw, hf, note


def build_prompts(raw, hf, heldout_text):
    """[(name, kind, text, messages, ids, checks)] with ids from transformers' tokenizer when it
    agrees with the raw tokenizers library (recorded either way)."""
    out = []
    for name, text in TEXT_PROMPTS:
        if text is None:
            text = long_prompt_text(heldout_text)
        out.append((name, "text", text, None))
    for name, messages in CHAT_PROMPTS:
        py = gu.render_chatml(messages, add_generation_prompt=True)
        text, check = py, "python ChatML only"
        if hf is not None:
            try:
                rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                check = "transformers == python ChatML" if rendered == py else "MISMATCH: using transformers' rendering"
                text = rendered
            except Exception as e:  # noqa: BLE001
                check = f"apply_chat_template failed ({type(e).__name__}: {e}); python ChatML used"
        out.append((name, "chat", text, {"messages": messages, "template_check": check}))
    result = []
    for name, kind, text, extra in out:
        ids_raw = raw.encode(text, add_special_tokens=True).ids
        ids, check = ids_raw, "tokenizers only"
        if hf is not None:
            try:
                ids_hf = list(hf(text, add_special_tokens=True)["input_ids"])
                check = "transformers == tokenizers" if ids_hf == ids_raw else "MISMATCH: using transformers' ids"
                ids = ids_hf
            except Exception as e:  # noqa: BLE001
                check = f"transformers encode failed ({type(e).__name__}: {e})"
        result.append({"name": name, "kind": kind, "text": text, "ids": ids, "ids_check": check,
                       **(extra or {})})
    return result


def last_logits(model, ids, device):
    import torch

    with torch.no_grad():
        x = torch.tensor([ids], dtype=torch.long, device=device)
        return model(input_ids=x, use_cache=False).logits[0, -1].float()


def greedy_no_eos(model, ids, device, n):
    """Argmax of a full (uncached) float32 forward per step; first index wins ties."""
    import torch

    cur = list(ids)
    out, margins = [], []
    for _ in range(n):
        logits = last_logits(model, cur, device)
        top2 = torch.topk(logits, 2)
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        margins.append(float(top2.values[0] - top2.values[1]))
        cur.append(nxt)
    return out, margins


def hf_generate(model, ids, device, n, eos_ids, pad_id):
    import torch

    x = torch.tensor([ids], dtype=torch.long, device=device)
    with torch.no_grad():
        y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n,
                           eos_token_id=eos_ids, pad_token_id=pad_id)
    return [int(t) for t in y[0, len(ids):].tolist()]


def window_nll(model, ids_t, windows):
    """float64 sum of -log p(token) over the scored positions of each window."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for begin, end, first in windows:
            x = ids_t[begin:end].unsqueeze(0)
            logits = model(input_ids=x, use_cache=False).logits[0]
            length = end - begin
            lp = logits[first - 1:length - 1].double().log_softmax(-1)
            tgt = x[0, first:length]
            total += float(-lp.gather(1, tgt[:, None]).sum())
            count += length - first
    return total, count


def perplexity(model, heldout_ids, device):
    import torch

    ids_t = torch.tensor(heldout_ids, dtype=torch.long, device=device)
    n = len(heldout_ids)
    res = {}
    for name, ctx, stride in PPL_RUNS:
        if stride == ctx:
            windows = gu.nonoverlapping_windows(n, ctx)
            scheme = "non-overlapping"
        else:
            windows = gu.strided_windows(n, ctx, stride)
            scheme = "strided"
        nll, count = window_nll(model, ids_t, windows)
        if count != gu.scored_count(windows):
            raise RuntimeError("scored-token count mismatch")
        res[name] = {"ctx": ctx, "stride": stride, "scheme": scheme, "windows": len(windows),
                     "scored_tokens": count, "nll_sum_f64": nll, "ppl": gu.ppl_from_nll(nll, count)}
    return res


def make_golden(model_dir, name, heldout_text, device, log, with_ppl, heldout_chars=None):
    import tokenizers
    import torch
    import transformers

    t0 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "generation_config.json"), encoding="utf-8") as f:
        gen_cfg = json.load(f)
    eos_ids = gen_cfg["eos_token_id"]
    pad_id = gen_cfg.get("pad_token_id")
    raw, hf, tok_note = load_tokenizers(model_dir)
    prompts = build_prompts(raw, hf, heldout_text)

    model = load_model(model_dir, torch.float32, device)
    vocab = int(model.config.vocab_size)
    for p in prompts:
        logits = last_logits(model, p["ids"], device)
        if logits.numel() != vocab or not bool(torch.isfinite(logits).all()):
            raise RuntimeError(f"{name}/{p['name']}: bad logits")
        top = torch.topk(logits, 5)
        values = logits.cpu().tolist()
        p["last_logits"] = gu.f32_list(values)
        p["top5_ids"] = [int(i) for i in top.indices.tolist()]
        p["top5_logits"] = gu.f32_list(top.values.cpu().tolist())
        p["greedy_ids"], p["greedy_margins"] = greedy_no_eos(model, p["ids"], device, GREEDY_TOKENS)
        p["greedy_text"] = raw.decode(p["greedy_ids"], skip_special_tokens=False)
        try:
            gen = hf_generate(model, p["ids"], device, GREEDY_TOKENS, eos_ids, pad_id)
            p["generate_ids"] = gen
            stop = next((i for i, t in enumerate(gen) if t in eos_ids), None)
            upto = len(gen) if stop is None else stop + 1
            p["generate_matches_greedy"] = gen[:upto] == p["greedy_ids"][:upto]
        except Exception as e:  # noqa: BLE001
            p["generate_error"] = f"{type(e).__name__}: {e}"
    golden = {
        "format": "perry-golden-v1",
        "model": name,
        "model_dir": f"models/{name}",
        "architecture": (config.get("architectures") or ["?"])[0],
        "model_type": config.get("model_type"),
        "dtype_on_disk": config.get("dtype", config.get("torch_dtype")),
        "vocab_size": vocab,
        "files_sha256": {f: sha256_file(os.path.join(model_dir, f)) for f in sorted(os.listdir(model_dir))
                         if f.endswith(".safetensors") or f.endswith(".json")},
        "generator": {
            "transformers": transformers.__version__, "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "load_dtype": "float32", "attn_implementation": "eager", "tf32": False,
            "tokenizer_note": tok_note,
        },
        "notes": ("last_logits: float32 values exactly (parse as double, cast to float). greedy_ids: "
                  f"{GREEDY_TOKENS} argmax tokens of full float32 forwards, never stopping at eos; "
                  "greedy_margins: top1 - top2 logit at each step (small = near tie). generate_ids: "
                  "model.generate(do_sample=False) with the KV cache, stopping at eos_token_id."),
        "prompts": prompts,
    }
    del model
    if with_ppl:
        text = heldout_text if heldout_chars is None else heldout_text[:heldout_chars]
        heldout_ids = raw.encode(text, add_special_tokens=False).ids
        ppl = {"heldout": "tests/data/heldout.txt", "heldout_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
               "heldout_chars": len(text), "tokens": len(heldout_ids),
               "encode": "tokenizer.encode(text, add_special_tokens=False)",
               "windowing": "tools/gpu/golden_util.py (non-overlapping when stride == ctx, else strided)"}
        for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            try:
                m = load_model(model_dir, dtype, device)
                ppl[dtype_name] = perplexity(m, heldout_ids, device)
                del m
            except Exception as e:  # noqa: BLE001
                ppl[dtype_name] = {"error": f"{type(e).__name__}: {e}"}
        golden["ppl"] = ppl
        f32 = ppl.get("float32", {})
        if "ctx512" in f32:
            log(f"  {name}: held-out ppl ctx256 {f32['ctx256']['ppl']:.3f}, ctx512 {f32['ctx512']['ppl']:.3f}, "
                f"ctx512/stride256 {f32['ctx512_stride256']['ppl']:.3f} over {len(heldout_ids)} tokens")
    golden["seconds"] = round(time.time() - t0, 2)
    return golden


def write_golden(golden, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Compact: 8192 logits per prompt; indenting would put each on its own line.
    text = json.dumps(golden, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.write("\n")
    # Verify: the logits parse back to the exact float32 values.
    with open(path, encoding="utf-8") as f:
        back = json.load(f)
    for p_back, p in zip(back["prompts"], golden["prompts"]):
        if len(p_back["last_logits"]) != len(p["last_logits"]):
            raise RuntimeError("golden logits length changed on write")
        for a, b in zip(p_back["last_logits"], p["last_logits"]):
            if gu.f32_bits(gu.f32_round(a)) != gu.f32_bits(gu.f32_round(b)):
                raise RuntimeError("golden logits changed on write")
    return os.path.getsize(path)

