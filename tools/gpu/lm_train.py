"""Wall-clock-budgeted causal-LM training for perry's small models (one GPU, bf16 autocast).

Random 512-token windows of the token stream, AdamW, linear warm-up then cosine decay to 10% of
the peak. The number of steps is fixed once the first steps are timed: min(what the remaining
budget allows, max_epochs over the corpus). Held-out loss (the non-overlapping 512-token
perplexity windows of tests/data/heldout.txt) is evaluated periodically; the best weights are
kept, and training stops early when it has not improved for `patience` evaluations.
"""
import math
import time


def _lr_at(step, peak, warmup, total):
    if step < warmup:
        return peak * (step + 1) / warmup
    if total is None:
        return peak
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _param_groups(model, weight_decay):
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)  # norms and biases: no decay
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def heldout_windows(heldout_ids, seq, device):
    import torch

    n = len(heldout_ids) // seq
    if n == 0:
        raise ValueError(f"held-out text has {len(heldout_ids)} tokens, fewer than one {seq}-token window")
    return torch.tensor(heldout_ids[: n * seq], dtype=torch.long, device=device).view(n, seq)


def evaluate(model, windows, autocast, batch=16):
    """Mean NLL over positions 1..seq-1 of each window (the `perry ppl` non-overlapping measure)."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            w = windows[i:i + batch]
            with autocast():
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            count += w[:, 1:].numel()
    model.train()
    return total / count


def train_lm(model, train_ids, heldout_ids, spec, budget_s, device, log, eval_every_s=10.0, patience=4,
             use_compile=False, weight_decay=0.1):
    """Trains `model` in place (fp32 master weights); returns (model with best weights, log dict)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    t_start = time.time()
    seq, batch, peak = int(spec["seq"]), int(spec["batch"]), float(spec["lr"])
    warmup = int(spec["warmup"])
    torch.manual_seed(int(spec["seed"]))
    model.to(device)
    model.train()
    is_cuda = str(device).startswith("cuda")
    if is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        if is_cuda:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    data = torch.tensor(train_ids, dtype=torch.long, device=device)
    n_tokens = data.numel()
    if n_tokens < seq + 2:
        raise ValueError(f"training stream has only {n_tokens} tokens")
    hold = heldout_windows(heldout_ids, seq, device)
    gen = torch.Generator(device=device).manual_seed(int(spec["seed"]))
    offsets = torch.arange(seq + 1, device=device)

    try:
        opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=peak, betas=(0.9, 0.95), eps=1e-8,
                                fused=is_cuda)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(_param_groups(model, weight_decay), lr=peak, betas=(0.9, 0.95), eps=1e-8)

    step_model = model
    compiled = False
    if use_compile:
        try:
            step_model = torch.compile(model)
            compiled = True
        except Exception as e:  # noqa: BLE001 - any failure means: train eagerly
            log(f"  torch.compile unavailable ({e}); training eagerly")
            step_model = model

    steps_per_epoch = max(1, n_tokens // (batch * seq))
    max_steps = int(spec["max_epochs"] * steps_per_epoch)
    total_steps = None
    history = {"train": [], "eval": [], "lr": []}
    best = {"loss": float("inf"), "step": -1, "state": None}
    evals_without_gain = 0
    stop_reason = "budget"
    step = 0
    loss_acc, loss_n = None, 0
    timing_from = None
    last_eval_t = time.time()

    def do_eval(step_now):
        nonlocal evals_without_gain
        loss = evaluate(model, hold, autocast)
        t = time.time() - t_start
        history["eval"].append({"step": step_now, "time_s": round(t, 2), "tokens": step_now * batch * seq,
                                "heldout_loss": loss})
        if loss < best["loss"] - 1e-3:
            best.update(loss=loss, step=step_now,
                        state={k: v.detach().clone() for k, v in model.state_dict().items()})
            evals_without_gain = 0
        else:
            evals_without_gain += 1
        log(f"  step {step_now}: held-out loss {loss:.4f} (ppl {math.exp(min(loss, 50)):.2f}), "
            f"best {best['loss']:.4f} @ {best['step']}, {t:.0f}s")
        return loss

    while True:
        now = time.time()
        elapsed = now - t_start
        if elapsed >= budget_s:
            stop_reason = "budget"
            break
        if total_steps is not None and step >= total_steps:
            stop_reason = "planned steps done"
            break
        lr = _lr_at(step, peak, warmup, total_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, n_tokens - seq - 1, (batch,), device=device, generator=gen)
        window = data[starts[:, None] + offsets]
        x, y = window[:, :-1], window[:, 1:]
        try:
            with autocast():
                logits = step_model(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
        except Exception as e:  # noqa: BLE001
            if compiled and step == 0:
                log(f"  compiled step failed ({type(e).__name__}: {e}); training eagerly")
                opt.zero_grad(set_to_none=True)
                step_model, compiled = model, False
                continue
            raise
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        loss_n += 1
        step += 1

        if step == 5:
            if is_cuda:
                torch.cuda.synchronize()
            timing_from = (time.time(), step)
        if step == 25 and timing_from is not None:
            if is_cuda:
                torch.cuda.synchronize()
            per_step = (time.time() - timing_from[0]) / (step - timing_from[1])
            left = budget_s - (time.time() - t_start)
            # ~8% of the remaining time goes to evaluations and the final bookkeeping.
            by_time = step + int(0.92 * left / per_step)
            total_steps = max(step + 1, min(by_time, max_steps))
            log(f"  {per_step * 1000:.1f} ms/step, {batch * seq / per_step / 1e6:.2f} M tok/s: planning "
                f"{total_steps} steps (time allows {by_time}, {spec['max_epochs']} epochs = {max_steps})")
        if step % 10 == 0:
            mean = float(loss_acc) / loss_n
            history["train"].append({"step": step, "time_s": round(time.time() - t_start, 2),
                                     "tokens": step * batch * seq, "loss": mean})
            history["lr"].append({"step": step, "lr": lr})
            loss_acc, loss_n = None, 0
            if not math.isfinite(mean):
                stop_reason = "non-finite loss"
                log(f"  non-finite training loss at step {step}; stopping")
                break
        if time.time() - last_eval_t >= eval_every_s and step > warmup // 2:
            do_eval(step)
            last_eval_t = time.time()
            if evals_without_gain >= patience:
                stop_reason = f"held-out loss flat for {patience} evaluations"
                break

    do_eval(step)
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    train_time = time.time() - t_start
    info = {
        "steps": step, "planned_steps": total_steps, "stop_reason": stop_reason, "compiled": compiled,
        "train_time_s": round(train_time, 2), "tokens_seen": step * batch * seq, "corpus_tokens": n_tokens,
        "epochs_seen": round(step * batch * seq / n_tokens, 3), "best_step": best["step"],
        "best_heldout_loss": best["loss"], "best_heldout_ppl": math.exp(min(best["loss"], 50)),
        "heldout_windows": int(hold.shape[0]), "hyper": {k: spec[k] for k in
                                                         ("lr", "batch", "seq", "warmup", "max_epochs", "seed")},
        "weight_decay": weight_decay, "history": history,
    }
    log(f"  done: {step} steps in {train_time:.0f}s ({stop_reason}); best held-out loss {best['loss']:.4f} "
        f"at step {best['step']}")
    return model, info
