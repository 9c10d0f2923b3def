#!/usr/bin/env python3
r"""Hugging Face transformers, bf16 + SDPA attention, measured the way `perry bench` measures.

    PYTHONUNBUFFERED=1 python3 tools/gpu/peer_transformers.py DIR OUT_PREFIX \
        [--prompts 512 2048 8192] [--decode 32] [--batch 1 16] [--repeats 3] [--decode-context 128] \
        [--check-tokens 8] [--perry-ids "ID ID ..."] [--device cuda]

DIR is a Hugging Face checkpoint directory; for the peer comparison it is perry's own synthetic
preset written by `perry export --synthetic llama3-8b -o DIR`, so both engines run on the same
bf16 weights. Prompts are random token ids from perry's generator (cli/common.cpp
random_token_ids, same seeds as perry bench). Measurements, like src/cli/cmd_bench.cpp:
  prefill P: one forward over P tokens with a KV cache, logits of the last position only, the next
             token read back to the host = TTFT; a warm-up pass, then the median of --repeats.
  decode b=B: B sequences of --decode-context tokens prefilled (not timed), then --decode greedy
             steps with past_key_values, each step's tokens read back to the host (as a streaming
             server must); tok/s counts every sequence's token, ms is one step. Median of --repeats.
  peak GPU MiB: torch.cuda.max_memory_allocated so far (perry reports its pool's in-use peak).
Greedy check: a --check-tokens continuation of perry run --synthetic's prompt (128 tokens, seed
12345); with --perry-ids (the ids `perry run --synthetic ... --prompt-tokens 128 -n K` printed)
the report says how many leading ids agree — both engines run the same weights, so the first
ones should (random weights give near-ties, so a late divergence is not an error).
Writes OUT_PREFIX.md and OUT_PREFIX.json (the format of perry bench's -o) and prints the table.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
import traceback

MODE = "hf-bf16-sdpa"
MASK64 = (1 << 64) - 1


def random_token_ids(n, vocab, seed):
    """perry's random_token_ids: 64-bit LCG (Knuth's MMIX), id = (state >> 33) % vocab."""
    out = []
    s = seed & MASK64
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & MASK64
        out.append((s >> 33) % vocab)
    return out


def median(xs):
    """perry's median: the upper middle element of the sorted list."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="Hugging Face checkpoint directory")
    p.add_argument("out_prefix", help="writes OUT_PREFIX.md and OUT_PREFIX.json")
    p.add_argument("--prompts", type=int, nargs="+", default=[512, 2048, 8192], help="prefill lengths (default 512 2048 8192)")
    p.add_argument("--decode", type=int, default=32, help="decode steps per measurement (default 32)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16], help="decode batch sizes (default 1 16)")
    p.add_argument("--repeats", type=int, default=3, help="repetitions after a warm-up; the median is reported (default 3)")
    p.add_argument("--decode-context", type=int, default=128, help="tokens in each sequence's cache when decoding starts (default 128)")
    p.add_argument("--check-tokens", type=int, default=8, help="greedy ids for the check (default 8; 0 = skip)")
    p.add_argument("--perry-ids", default="", help="perry's greedy ids for the same prompt, space separated")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (tests only)")
    a = p.parse_args(argv)
    if a.repeats < 1 or a.decode < 2 or a.decode_context < 1 or min(a.batch) < 1 or min(a.prompts) < 1:
        p.error("repeats >= 1, decode >= 2, decode context >= 1, batch sizes and prompts >= 1")
    return a


class Report:
    """Rows in perry bench's format; md/json are rewritten after every row so a timeout keeps them."""

    def __init__(self, out_prefix, header):
        self.out_prefix = out_prefix
        self.header = header  # dict: model, device, versions, ...
        self.rows = []
        self.notes = []
        print("%-14s %-14s %7s %12s %10s %9s %9s" % ("mode", "what", "tokens", "tok/s", "ms", "RSS MiB", "GPU MiB"))

    def add(self, what, tokens, tok_s, ms, gpu_mib, extra=None):
        row = {"mode": MODE, "what": what, "tokens": tokens, "tok_s": tok_s, "ms": ms,
               "peak_rss_mib": peak_rss_mib(), "peak_gpu_mib": gpu_mib, "device": self.header.get("device", "")}
        row.update(extra or {})
        self.rows.append(row)
        print("%-14s %-14s %7d %12.1f %10.2f %9.0f %9.0f" % (MODE, what, tokens, tok_s, ms, row["peak_rss_mib"], gpu_mib))
        self.write()

    def note(self, text):
        print("note: " + text)
        self.notes.append(text)
        self.write()

    def markdown(self):
        h = self.header
        lines = ["# transformers bench — %s" % h.get("model", "?"), ""]
        lines.append("transformers %s, torch %s (CUDA %s), Python %s; %s; dtype bfloat16, attn_implementation=%s; "
                     "load %.1f s" % (h.get("transformers", "?"), h.get("torch", "?"), h.get("cuda", "?"),
                                      h.get("python", "?"), h.get("device", "?"), h.get("attn_implementation", "?"),
                                      h.get("load_s", 0.0)))
        lines.append("")
        lines.append("| mode | what | tokens | tok/s | ms | peak RSS MiB | peak GPU MiB |")
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        for r in self.rows:
            lines.append("| %s | %s | %d | %.1f | %.2f | %.0f | %.0f |" % (r["mode"], r["what"], r["tokens"], r["tok_s"],
                                                                          r["ms"], r["peak_rss_mib"], r["peak_gpu_mib"]))
        if "peak_gpu_reserved_mib" in h:
            lines.append("")
            lines.append("peak GPU memory reserved by torch's caching allocator: %.0f MiB" % h["peak_gpu_reserved_mib"])
        for n in self.notes:
            lines.append("")
            lines.append("- " + n)
        return "\n".join(lines) + "\n"

    def write(self):
        doc = dict(self.header)
        doc["results"] = self.rows
        doc["notes"] = self.notes
        d = os.path.dirname(os.path.abspath(self.out_prefix))
        os.makedirs(d, exist_ok=True)
        with open(self.out_prefix + ".json", "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        with open(self.out_prefix + ".md", "w") as f:
            f.write(self.markdown())


def load_model(torch, transformers, path, device):
    """AutoModelForCausalLM in bf16 with SDPA attention, on `device`."""
    from transformers import AutoModelForCausalLM
    ver = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    kw = {"attn_implementation": "sdpa"}
    # transformers >= 4.56 takes dtype=; older ones torch_dtype= (and ignore unknown names silently).
    kw["dtype" if ver >= (4, 56) else "torch_dtype"] = torch.bfloat16
    try:
        model = AutoModelForCausalLM.from_pretrained(path, device_map=device, **kw)
    except (ImportError, ValueError, TypeError) as e:  # device_map needs accelerate on old versions
        print("from_pretrained(device_map=%s) failed (%s); loading on the CPU and moving" % (device, e))
        model = AutoModelForCausalLM.from_pretrained(path, **kw).to(device)
    model.eval()
    p = next(model.parameters())
    if p.dtype != torch.bfloat16:
        print("weights loaded as %s; converting to bfloat16" % p.dtype)
        model = model.to(torch.bfloat16)
    return model


def forward_kwargs(model):
    """logits_to_keep=1 (newer) / num_logits_to_keep=1 (4.45-4.49): the last position's logits only, as
    generate() and perry compute them; absent on old versions."""
    import inspect
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


def run(a):
    import torch
    import transformers

    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("peer_transformers: torch sees no CUDA device")
    dev_name = torch.cuda.get_device_name(torch.device(a.device)) if cuda else platform.processor() or "cpu"
    header = {"model": os.path.abspath(a.dir), "engine": "transformers", "transformers": transformers.__version__,
              "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None), "python": platform.python_version(),
              "device": "%s (%s)" % (a.device, dev_name), "args": vars(a)}
    rep = Report(a.out_prefix, header)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def gpu_mib():
        return torch.cuda.max_memory_allocated() / 2.0**20 if cuda else 0.0

    t0 = time.perf_counter()
    model = load_model(torch, transformers, a.dir, a.device)
    sync()
    header["load_s"] = time.perf_counter() - t0
    header["attn_implementation"] = getattr(model.config, "_attn_implementation", "?")
    header["architecture"] = type(model).__name__
    cfg = model.config
    vocab = int(cfg.vocab_size)
    maxpos = int(getattr(cfg, "max_position_embeddings", 1 << 30))
    header["weight_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    print("loaded %s (%s, %.2f GB of weights, attn %s) in %.1f s on %s" % (
        a.dir, header["architecture"], header["weight_bytes"] / 1e9, header["attn_implementation"], header["load_s"],
        header["device"]))
    if header["attn_implementation"] != "sdpa":
        rep.note("attention implementation is %s, not sdpa" % header["attn_implementation"])
    fkw = forward_kwargs(model)
    if not fkw:
        rep.note("this transformers has no logits_to_keep: prefill computes logits for every position")

    def ids_tensor(rows):
        return torch.tensor(rows, dtype=torch.long, device=a.device)

    def step(input_ids, past=None):
        """One forward; returns (next token ids on the device [B,1], logits of the last position, cache)."""
        out = model(input_ids=input_ids, past_key_values=past, use_cache=True, **fkw)
        last = out.logits[:, -1, :]
        return last.argmax(dim=-1, keepdim=True), last, out.past_key_values

    with torch.inference_mode():
        # Warm-up: a short prefill and a decode step (allocator, kernel selection, lazy init).
        nxt, _, past = step(ids_tensor([random_token_ids(16, vocab, 7)]))
        step(nxt, past)
        del past
        sync()

        for P in a.prompts:
            if P > maxpos:
                rep.note("prefill %d skipped: longer than max_position_embeddings %d" % (P, maxpos))
                continue
            ids = ids_tensor([random_token_ids(P, vocab, 100 + P)])
            times = []
            try:
                for r in range(a.repeats + 1):  # the first pass warms this length up
                    sync()
                    t = time.perf_counter()
                    nxt, _, past = step(ids)
                    nxt.tolist()  # the first token on the host = TTFT
                    dt = time.perf_counter() - t
                    del past, nxt
                    if r > 0:
                        times.append(dt)
            except torch.cuda.OutOfMemoryError as e:  # noqa: F841 (only on CUDA builds)
                rep.note("prefill %d: out of GPU memory" % P)
                torch.cuda.empty_cache()
                continue
            m = median(times)
            rep.add("prefill", P, P / m, m * 1e3, gpu_mib(), {"ttft_ms": m * 1e3, "times_s": times})

        if a.decode_context + a.decode > maxpos:
            rep.note("decode skipped: context %d + %d exceeds %d" % (a.decode_context, a.decode, maxpos))
        else:
            for B in a.batch:
                steps = []
                try:
                    for r in range(a.repeats + 1):  # the first repetition warms this batch size up
                        ctx = random_token_ids(a.decode_context, vocab, 500 + r)
                        nxt, _, past = step(ids_tensor([ctx] * B))
                        nxt.tolist()
                        sync()
                        t = time.perf_counter()
                        for _ in range(a.decode):
                            nxt, _, past = step(nxt, past)
                            nxt.tolist()  # every step's tokens reach the host, as a streaming server's must
                        dt = (time.perf_counter() - t) / a.decode
                        del past, nxt
                        if r > 0:
                            steps.append(dt)
                except torch.cuda.OutOfMemoryError:
                    rep.note("decode b=%d: out of GPU memory" % B)
                    torch.cuda.empty_cache()
                    continue
                m = median(steps)
                rep.add("decode b=%d" % B, a.decode, B / m, m * 1e3, gpu_mib(), {"batch": B, "step_s": steps})

        if a.check_tokens > 0:
            prompt = random_token_ids(128, vocab, 12345)
            nxt, last, past = step(ids_tensor([prompt]))
            top = torch.topk(last[0].float(), 5)
            ids = [int(nxt[0, 0])]
            for _ in range(a.check_tokens - 1):
                nxt, _, past = step(nxt, past)
                ids.append(int(nxt[0, 0]))
            del past
            check = {"prompt": "perry run --synthetic: 128 random ids, seed 12345", "ids": ids,
                     "first_top5_ids": [int(i) for i in top.indices], "first_top5_logits": [float(v) for v in top.values]}
            text = "greedy check: transformers ids %s (first step top-2 logit gap %.3f)" % (
                " ".join(map(str, ids)), check["first_top5_logits"][0] - check["first_top5_logits"][1])
            if a.perry_ids.strip():
                pids = [int(x) for x in a.perry_ids.split()]
                agree = 0
                while agree < min(len(ids), len(pids)) and ids[agree] == pids[agree]:
                    agree += 1
                check["perry_ids"] = pids
                check["agree_prefix"] = agree
                text += "; perry ids %s; first %d of %d agree" % (" ".join(map(str, pids)), agree, min(len(ids), len(pids)))
            header["greedy_check"] = check
            rep.note(text)

    if cuda:
        header["peak_gpu_reserved_mib"] = torch.cuda.max_memory_reserved() / 2.0**20
    rep.write()
    return rep


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    try:
        rep = run(a)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        print("peer_transformers: failed after %.1f s" % (time.perf_counter() - t0))
        return 1
    print("")
    print(rep.markdown())
    print("wrote %s.md and %s.json (%.1f s)" % (a.out_prefix, a.out_prefix, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
