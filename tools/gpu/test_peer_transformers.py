#!/usr/bin/env python3
"""Local checks for the transformers peer run, before GPU time is spent on it:
  python3 tools/gpu/test_peer_transformers.py       (PERRY_BIN=path/to/perry to pick the binary)

1. `perry export` output, read by an independent restatement of the safetensors reader's rules
   (header JSON, offsets contiguous from 0 to the end of the file, sizes = shape x dtype) and of
   what transformers needs from config.json / model.safetensors.index.json. Needs a perry binary.
2. peer_transformers.py end to end on the CPU against a stand-in `transformers` module (a tiny
   torch model with HF's call signature), when torch is importable: rows, files, greedy check.
Without perry or torch the parts that need them are skipped.
"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import peer_transformers as pt  # noqa: E402

def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_text(path):
    with open(path) as f:
        return f.read()


DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def find_perry():
    cands = [os.environ.get("PERRY_BIN", "")] + sorted(glob.glob(os.path.join(ROOT, "build*", "perry")),
                                                       key=os.path.getmtime, reverse=True)
    for c in cands:
        if c and os.access(c, os.X_OK):
            try:
                if "export" in subprocess.run([c, "--help"], capture_output=True, text=True, timeout=30).stdout:
                    return c
            except (OSError, subprocess.SubprocessError):
                pass
    return None


def read_safetensors_header(path):
    """The rules of the reference reader: u64 header length, JSON object, every tensor's byte range
    = numel x dtype size, ranges sorted by offset tile [0, data size) exactly."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        assert n <= 100_000_000 and 8 + n <= size, path
        raw = f.read(n)
    assert raw[:1] == b"{", "header must start with {"
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned"
    h = json.loads(raw.decode("utf-8"))
    meta = h.pop("__metadata__", None)
    ranges = []
    for name, e in h.items():
        numel = 1
        for d in e["shape"]:
            numel *= d
        b, en = e["data_offsets"]
        assert en - b == numel * DTYPE_BYTES[e["dtype"]], name
        ranges.append((b, en, name))
    ranges.sort()
    pos = 0
    for b, en, name in ranges:
        assert b == pos, "%s starts at %d, expected %d" % (name, b, pos)
        pos = en
    assert pos + 8 + n == size, "data does not end at the end of the file"
    return h, meta


@unittest.skipUnless(find_perry(), "no perry binary with `export` (set PERRY_BIN)")
class ExportFormat(unittest.TestCase):
    def export(self, preset, shard_gb):
        d = tempfile.mkdtemp(prefix="perry-export-")
        r = subprocess.run([find_perry(), "export", "--synthetic", preset, "-o", d, "--shard-size", str(shard_gb)],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
        return d, r.stderr

    def test_sharded_qwen3(self):
        d, log = self.export("qwen3-0.6b", 0.4)
        self.assertIn("exported synthetic qwen3-0.6b", log)
        cfg = read_json(os.path.join(d, "config.json"))
        self.assertEqual(cfg["architectures"], ["Qwen3ForCausalLM"])
        self.assertEqual(cfg["model_type"], "qwen3")
        for k, v in {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                     "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                     "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "bfloat16"}.items():
            self.assertEqual(cfg[k], v, k)
        self.assertIsInstance(cfg["rope_theta"], float)
        idx = read_json(os.path.join(d, "model.safetensors.index.json"))
        files = sorted(set(idx["weight_map"].values()))
        self.assertEqual(files, sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "model-*.safetensors"))))
        self.assertTrue(all(f.endswith("-of-%05d.safetensors" % len(files)) for f in files), files)
        total, names = 0, set()
        for f in files:
            h, meta = read_safetensors_header(os.path.join(d, f))
            self.assertEqual(meta, {"format": "pt"})  # transformers refuses other formats
            for name, e in h.items():
                self.assertEqual(idx["weight_map"][name], f)
                self.assertEqual(e["dtype"], "BF16")
                total += e["data_offsets"][1] - e["data_offsets"][0]
                names.add(name)
        self.assertEqual(total, idx["metadata"]["total_size"])
        self.assertEqual(names, set(idx["weight_map"]))
        self.assertIn("model.layers.27.self_attn.k_norm.weight", names)
        self.assertNotIn("lm_head.weight", names)  # tied
        self.assertEqual(len(names), 1 + 28 * 11 + 1)

    def test_single_file_and_refusals(self):
        d, _ = self.export("llama3.2-1b", 0)
        self.assertEqual(sorted(os.listdir(d)), ["config.json", "generation_config.json", "model.safetensors"])
        h, _ = read_safetensors_header(os.path.join(d, "model.safetensors"))
        self.assertEqual(h["model.embed_tokens.weight"]["shape"], [128256, 2048])
        cfg = read_json(os.path.join(d, "config.json"))
        self.assertEqual(cfg["rope_scaling"]["rope_type"], "llama3")
        r = subprocess.run([find_perry(), "export", "--synthetic", "llama3.2-1b", "-o", d], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--force", r.stderr)
        r = subprocess.run([find_perry(), "export", "--synthetic", "nope", "-o", d + "-x"], capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("available", r.stderr)


class Helpers(unittest.TestCase):
    def test_lcg_matches_perry(self):
        # perry's random_token_ids(3, 1000, 1), worked by hand from its formula.
        s, want = 1, []
        for _ in range(3):
            s = (s * 6364136223846793005 + 1442695040888963407) % 2**64
            want.append((s >> 33) % 1000)
        self.assertEqual(pt.random_token_ids(3, 1000, 1), want)
        ids = pt.random_token_ids(1000, 128256, 12345)
        self.assertTrue(all(0 <= i < 128256 for i in ids))
        self.assertGreater(len(set(ids)), 990)

    def test_median_is_perrys(self):
        self.assertEqual(pt.median([3.0, 1.0, 2.0, 10.0]), 3.0)  # upper middle, as std::sort + v[n/2]
        self.assertEqual(pt.median([]), 0.0)


def fake_transformers(torch, vocab, hidden=16, maxpos=4096):
    """A stand-in with transformers' surface as peer_transformers uses it."""
    class Out:
        def __init__(self, logits, past):
            self.logits, self.past_key_values = logits, past

    class Cfg:
        vocab_size, max_position_embeddings, _attn_implementation = vocab, maxpos, "sdpa"

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.emb = torch.nn.Parameter(torch.randn(vocab, hidden, generator=g))
            self.config = Cfg()
            self.calls = []

        def forward(self, input_ids=None, past_key_values=None, use_cache=True, logits_to_keep=0):
            self.calls.append((tuple(input_ids.shape), past_key_values is None, logits_to_keep))
            x = self.emb[input_ids]  # [B, T, H]
            prev = past_key_values if past_key_values is not None else x[:, :0]
            past = torch.cat([prev, x], dim=1)
            assert past.shape[1] <= maxpos
            h = past.cumsum(1)[:, -x.shape[1]:]
            if logits_to_keep:
                h = h[:, -logits_to_keep:]
            return Out(h @ self.emb.t(), past)

    made = []

    class Auto:
        @staticmethod
        def from_pretrained(path, device_map=None, attn_implementation=None, **kw):
            assert attn_implementation == "sdpa"
            assert kw.get("dtype", kw.get("torch_dtype")) == torch.bfloat16
            m = Model()
            made.append(m)
            return m.to(torch.bfloat16)

    mod = types.ModuleType("transformers")
    mod.__version__ = "5.17.0"
    mod.AutoModelForCausalLM = Auto
    mod.made = made
    return mod


try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH, "torch is not importable")
class PeerScriptOnCpu(unittest.TestCase):
    def test_end_to_end(self):
        import torch
        fake = fake_transformers(torch, vocab=97)
        saved = sys.modules.get("transformers")
        sys.modules["transformers"] = fake
        try:
            out = os.path.join(tempfile.mkdtemp(), "sub", "peers-transformers")
            rc = pt.main(["/nonexistent-model", out, "--device", "cpu", "--prompts", "32", "64", "9000",
                          "--decode", "4", "--batch", "1", "3", "--repeats", "2", "--decode-context", "8",
                          "--check-tokens", "5", "--perry-ids", "1 2 3"])
        finally:
            if saved is None:
                del sys.modules["transformers"]
            else:
                sys.modules["transformers"] = saved
        self.assertEqual(rc, 0)
        doc = read_json(out + ".json")
        md = read_text(out + ".md")
        whats = [r["what"] for r in doc["results"]]
        self.assertEqual(whats, ["prefill", "prefill", "decode b=1", "decode b=3"])  # 9000 > maxpos: skipped
        self.assertTrue(any("prefill 9000 skipped" in n for n in doc["notes"]))
        for r in doc["results"]:
            self.assertEqual(r["mode"], "hf-bf16-sdpa")
            self.assertGreater(r["tok_s"], 0)
            self.assertGreater(r["ms"], 0)
        self.assertEqual(len(doc["results"][0]["times_s"]), 2)
        self.assertAlmostEqual(doc["results"][0]["tok_s"], 32 / (doc["results"][0]["ms"] / 1e3), places=3)
        self.assertEqual(doc["results"][3]["batch"], 3)
        self.assertAlmostEqual(doc["results"][3]["tok_s"], 3 / (doc["results"][3]["ms"] / 1e3), places=3)
        gc = doc["greedy_check"]
        self.assertEqual(len(gc["ids"]), 5)
        self.assertEqual(gc["perry_ids"], [1, 2, 3])
        self.assertEqual(gc["agree_prefix"], 0 if gc["ids"][0] != 1 else gc["agree_prefix"])
        self.assertIn("| hf-bf16-sdpa | decode b=3 | 4 |", md)
        self.assertIn("greedy check", md)
        m = fake.made[0]
        # Prefill passes start without a cache and keep only the last logits; decode steps feed one token.
        self.assertIn(((1, 32), True, 1), m.calls)
        self.assertIn(((3, 8), True, 1), m.calls)
        self.assertIn(((3, 1), False, 1), m.calls)
        # The greedy check's prompt is perry run --synthetic's: 128 ids, seed 12345.
        self.assertIn(((1, 128), True, 1), m.calls)

    def test_agreeing_ids(self):
        import torch
        fake = fake_transformers(torch, vocab=50)
        sys.modules["transformers"] = fake
        try:
            out = os.path.join(tempfile.mkdtemp(), "p")
            pt.main(["x", out, "--device", "cpu", "--prompts", "8", "--decode", "2", "--batch", "1",
                     "--repeats", "1", "--check-tokens", "3"])
            ids = read_json(out + ".json")["greedy_check"]["ids"]
            pt.main(["x", out, "--device", "cpu", "--prompts", "8", "--decode", "2", "--batch", "1",
                     "--repeats", "1", "--check-tokens", "3", "--perry-ids", " ".join(map(str, ids[:2] + [ids[2] + 1]))])
            gc = read_json(out + ".json")["greedy_check"]
            self.assertEqual(gc["ids"], ids)  # deterministic
            self.assertEqual(gc["agree_prefix"], 2)
            self.assertIn("first 2 of 3 agree", read_text(out + ".md"))
        finally:
            del sys.modules["transformers"]


if __name__ == "__main__":
    unittest.main(verbosity=2)
