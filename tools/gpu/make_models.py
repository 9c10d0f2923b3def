#!/usr/bin/env python3
"""Builds perry's models and transformers golden files on the GPU machine (see README.md).

  python3 tools/gpu/make_models.py OUT [--smoke] [--bundle DIR] [--deadline-s 500] [--compile]

Stages (each guarded: a failing stage is logged and recorded, the rest still run):
  tokenizer -> tiny random-init checkpoints -> train Qwen3 (~18M) -> train Llama (~7M)
  -> goldens for every checkpoint -> loss plots -> OUT/summary.md -> optional bundle for transfer.
Everything is written under OUT; with --bundle, OUT is also packed into <= 8 files in DIR.
"""
import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bundle  # noqa: E402
import golden_util as gu  # noqa: E402

VOCAB_SIZE = 8192


class Run:
    def __init__(self, out, deadline_s):
        self.t0 = time.time()
        self.deadline = self.t0 + deadline_s
        self.out = out
        self.status = {}
        self.timings = {}
        os.makedirs(out, exist_ok=True)
        self.log_path = os.path.join(out, "make_models.log")
        self.log_file = open(self.log_path, "a", encoding="utf-8")

    def log(self, msg):
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def remaining(self):
        return self.deadline - time.time()

    def stage(self, name, fn, critical=False):
        ts = time.time()
        self.log(f"== {name}")
        try:
            result = fn()
            self.status[name] = "ok"
            return result
        except Exception as e:  # noqa: BLE001 - every stage is isolated
            self.status[name] = f"error: {type(e).__name__}: {e}"
            self.log(f"!! {name} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}")
            if critical:
                raise
            return None
        finally:
            self.timings[name] = round(time.time() - ts, 2)
            self.log(f"   {name}: {self.status.get(name, '?')} ({self.timings[name]:.1f}s)")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--smoke", action="store_true", help="tiny budgets and a 1.5 MB corpus slice (~1 minute)")
    ap.add_argument("--bundle", help="also pack OUT into <= 8 files here (the device tool's $OUT)")
    ap.add_argument("--deadline-s", type=float, default=500.0, help="total wall-clock budget of this script")
    ap.add_argument("--qwen-budget-s", type=float, default=150.0)
    ap.add_argument("--llama-budget-s", type=float, default=60.0)
    ap.add_argument("--compile", action="store_true", help="try torch.compile for training (eager on failure)")
    ap.add_argument("--corpus", default=os.path.join(REPO, "corpus", "train.txt"))
    ap.add_argument("--heldout", default=os.path.join(REPO, "tests", "data", "heldout.txt"))
    return ap.parse_args(argv)


def environment(run):
    import tokenizers
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
           "tokenizers": tokenizers.__version__, "cuda": cuda,
           "device_name": torch.cuda.get_device_name(0) if cuda else "cpu"}
    run.log(f"environment: {env}")
    if not transformers.__version__.startswith("5."):
        run.log(f"warning: written for transformers 5.x, found {transformers.__version__}")
    if not cuda:
        run.log("warning: no CUDA device; running on the CPU (slow, budgets still apply)")
    return env, ("cuda" if cuda else "cpu")


def train_one(run, name, spec, vocab, special, train_ids, heldout_ids, budget, device, args, results):
    import torch

    import hf_models
    import lm_train

    cfg = hf_models.build_config(spec, vocab, special)
    model = hf_models.new_model(cfg, "sdpa")
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    run.log(f"  {name}: {cfg.model_type}, {n_params} parameters, budget {budget:.0f}s")
    model, info = lm_train.train_lm(model, train_ids, heldout_ids, spec, budget, device, run.log,
                                    eval_every_s=1.5 if args.smoke else 8.0, use_compile=args.compile)
    model = model.to("cpu")
    model_dir = os.path.join(run.out, "models", name)
    files = hf_models.save_model(model, model_dir, "bfloat16", os.path.join(run.out, "tokenizer"), special)
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files if f.endswith(".safetensors"))
    try:
        config = json.loads(cfg.to_json_string())
    except Exception:  # noqa: BLE001 - the log must not lose a trained model
        config = str(cfg)
    log = {"name": name, "params": n_params, "safetensors_bytes": size, "config": config, "train": info}
    with open(os.path.join(run.out, "train_log", f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(log, f, indent=1)
    results["trained"][name] = {k: v for k, v in log.items() if k != "config"}
    results["trained"][name]["train"] = {k: v for k, v in info.items() if k != "history"}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()


def write_summary(run, args, env, results):
    lines = [f"# perry models: make_models summary ({'SMOKE' if args.smoke else 'full'} run)", ""]
    lines.append(f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} in {time.time() - run.t0:.0f} s. "
                 f"Environment: `{json.dumps(env)}`.")
    lines += ["", "## Stages", "", "| stage | status | seconds |", "|---|---|---|"]
    for k, v in run.status.items():
        lines.append(f"| {k} | {v.replace('|', '/')[:200]} | {run.timings.get(k, '')} |")
    lines += ["", "## Trained models", "",
              "| model | params | safetensors MB | steps | tokens (epochs) | train s | stop | best held-out loss "
              "| ppl ctx256 | ppl ctx512 | ppl ctx512/s256 | bf16 ppl ctx512 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["trained"].items():
        t = r["train"]
        ppl = results["golden"].get(name, {}).get("ppl", {})
        f32, b16 = ppl.get("float32", {}), ppl.get("bfloat16", {})

        def fmt(d, k):
            return f"{d[k]['ppl']:.3f}" if k in d else "-"
        lines.append(f"| {name} | {r['params']:,} | {r['safetensors_bytes'] / 1e6:.1f} | {t['steps']} | "
                     f"{t['tokens_seen'] / 1e6:.1f} M ({t['epochs_seen']}) | {t['train_time_s']} | {t['stop_reason']} | "
                     f"{t['best_heldout_loss']:.4f} | {fmt(f32, 'ctx256')} | {fmt(f32, 'ctx512')} | "
                     f"{fmt(f32, 'ctx512_stride256')} | {fmt(b16, 'ctx512')} |")
    lines += ["", "## Random-init checkpoints", "", "| model | params | dtype | safetensors bytes | config.json |",
              "|---|---|---|---|---|"]
    for name, r in results["tiny"].items():
        lines.append(f"| {name} | {r['params']:,} | {r['dtype']} | {r['safetensors_bytes']:,} | {r['config']} |")
    lines += ["", "## Goldens", "", "| golden | bytes | seconds | ids check | generate == greedy |", "|---|---|---|---|---|"]
    for name, g in results["golden"].items():
        lines.append(f"| golden/{name}.json | {g['bytes']:,} | {g['seconds']} | {g['ids_check']} | {g['generate']} |")
    lines += ["", "Unpack on the dev machine: `python3 tools/gpu/bundle.py unpack DIR_WITH_PARTS DEST`, then copy "
              "`DEST/models/*` to `models/` and `DEST/golden/*.json` to `tests/golden/` (see tools/gpu/README.md).", ""]
    path = os.path.join(run.out, "summary.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with open(os.path.join(run.out, "status.json"), "w", encoding="utf-8") as f:
        json.dump({"status": run.status, "timings": run.timings, "results": results, "env": env}, f, indent=1,
                  default=str)
    return path


def do_bundle(run, args):
    loose = ["summary.md", "make_models.log", "status.json"]
    # If the bundle is too big for the return channel, leave out the least important
    # checkpoints (with their goldens) one at a time, and say so.
    drop_order = ["tiny-random-llama-f32", "tiny-random-qwen3-f16", "tiny-random-qwen2-sharded"]
    excluded = []
    while True:
        try:
            info = bundle.pack(run.out, args.bundle, loose=loose, exclude=excluded)
            run.log(f"bundle: {info['bytes']} bytes in {info['parts']} (+ {loose}); left out: {excluded or 'nothing'}")
            return info
        except bundle.BundleTooBig as e:
            if not drop_order:
                raise
            name = drop_order.pop(0)
            excluded += [f"models/{name}", f"golden/{name}.json"]
            run.log(f"bundle: {e}; leaving out {name}")


def main(argv):
    args = parse_args(argv)
    out = os.path.abspath(args.out)
    for sub in ("models", "golden", "train_log", "tokenizer"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    run = Run(out, args.deadline_s)
    run.log(f"make_models: out={out} smoke={args.smoke} bundle={args.bundle} deadline={args.deadline_s}s")
    results = {"trained": {}, "tiny": {}, "golden": {}}
    env = {}
    try:
        env, device = run.stage("environment", lambda: environment(run), critical=True)
        import hf_models
        import hf_tokenizer

        with open(args.heldout, encoding="utf-8") as f:
            heldout_text = f.read()
        docs = run.stage("corpus", lambda: hf_tokenizer.read_corpus_docs(
            args.corpus, max_bytes=1_500_000 if args.smoke else None), critical=True)
        run.log(f"  {len(docs)} documents, {sum(len(d) for d in docs)} characters; held-out {len(heldout_text)} characters")
        if gu.EOT in heldout_text:
            raise ValueError("held-out text contains <|endoftext|>")

        tok = run.stage("tokenizer", lambda: hf_tokenizer.save_tokenizer(
            hf_tokenizer.train_tokenizer(docs, VOCAB_SIZE), os.path.join(out, "tokenizer")), critical=True)
        vocab = tok.get_vocab_size(with_added_tokens=True)
        special = hf_tokenizer.special_ids(tok)
        run.log(f"  vocab {vocab}, special ids {special}")
        if vocab != VOCAB_SIZE:
            run.log(f"warning: vocab is {vocab}, not {VOCAB_SIZE}")

        def encode():
            ids = hf_tokenizer.encode_docs(tok, docs)
            held = tok.encode(heldout_text, add_special_tokens=False).ids
            run.log(f"  training stream {len(ids)} tokens ({sum(len(d.encode()) for d in docs) / len(ids):.2f} bytes/token), "
                    f"held-out {len(held)} tokens")
            return ids, held
        train_ids, heldout_ids = run.stage("encode", encode, critical=True)

        for name, spec in hf_models.TINY.items():
            r = run.stage(f"tiny:{name}", lambda: hf_models.make_tiny(
                name, spec, vocab, special, os.path.join(out, "tokenizer"), os.path.join(out, "models"), run.log))
            if r:
                results["tiny"][name] = r

        golden_reserve = 45.0 if args.smoke else 120.0
        for name, spec in hf_models.TRAINED.items():
            want = (args.qwen_budget_s if spec["family"] == "qwen3" else args.llama_budget_s)
            if args.smoke:
                want = 4.0 if spec["family"] == "qwen3" else 3.0
            # Time still owed to the models trained after this one (Qwen3 first, then Llama).
            later = 0.0 if spec["family"] == "llama" else (3.0 if args.smoke else args.llama_budget_s)
            budget = max(5.0, min(want, run.remaining() - golden_reserve - later - 10.0))
            run.stage(f"train:{name}", lambda: train_one(run, name, spec, vocab, special, train_ids, heldout_ids,
                                                         budget, device, args, results))

        import golden
        names = list(hf_models.TRAINED) + list(hf_models.TINY)
        for name in names:
            model_dir = os.path.join(out, "models", name)
            if not os.path.isfile(os.path.join(model_dir, "config.json")):
                continue
            if run.remaining() < 15:
                run.status[f"golden:{name}"] = "skipped: deadline"
                continue

            def one(name=name, model_dir=model_dir):
                g = golden.make_golden(model_dir, name, heldout_text, device, run.log, with_ppl=name in hf_models.TRAINED,
                                       heldout_chars=20000 if args.smoke else None)
                size = golden.write_golden(g, os.path.join(out, "golden", f"{name}.json"))
                checks = sorted({p["ids_check"] for p in g["prompts"]} | {p.get("template_check", "") for p in g["prompts"]} - {""})
                gen = sum(1 for p in g["prompts"] if p.get("generate_matches_greedy"))
                results["golden"][name] = {"bytes": size, "seconds": g["seconds"], "ids_check": "; ".join(checks),
                                           "generate": f"{gen}/{len(g['prompts'])}", "ppl": g.get("ppl", {})}
            run.stage(f"golden:{name}", one)

        def plots():
            import plot_loss
            return plot_loss.plot_all(os.path.join(out, "train_log"))
        run.stage("plots", plots)
    except Exception as e:  # noqa: BLE001 - a critical stage failed; still write what we have
        run.log(f"!! stopping early: {type(e).__name__}: {e}")
    write_summary(run, args, env, results)
    if args.bundle:
        run.stage("bundle", lambda: do_bundle(run, args))
        write_summary(run, args, env, results)
    failed = [k for k, v in run.status.items() if v != "ok"]
    run.log(f"finished in {time.time() - run.t0:.0f}s; {len(failed)} stage(s) not ok: {failed}")
    if args.bundle and os.path.isdir(args.bundle):
        for f in ("summary.md", "make_models.log", "status.json"):  # final copies beside the parts
            src = os.path.join(out, f)
            if os.path.isfile(src):
                with open(src, "rb") as a, open(os.path.join(args.bundle, f), "wb") as b:
                    b.write(a.read())
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
