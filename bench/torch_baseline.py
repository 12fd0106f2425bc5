#!/usr/bin/env python3
"""PyTorch float32 CPU baseline for meshrun's bench/train_step: trains the same GPT-2
(tests/reference/gpt2_reference.py) on one fixed random batch and reports step time,
tokens/s and model TFLOP/s (docs/model.md FLOP count). Prints a table and a JSON line.

--mode eager runs the fused ops a user gets by default (F.scaled_dot_product_attention when
torch has it, F.gelu(approximate="tanh"), F.cross_entropy, AdamW's default implementation);
--mode compile wraps the forward and loss in torch.compile (the warmup steps include the
compilation, so give it at least 1).

Runs with any torch: Debian's (/usr/bin/python3, torch 1.13, eager only) or current torch from
PyPI in the venv that tests/python/make-venv makes from bench/requirements-torch.txt:
  build/torch-venv/bin/python bench/torch_baseline.py --config mini --mode compile
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import gpt2_reference as ref  # noqa: E402

CONFIGS = {
    #             d_model  n_layer n_head seq_len vocab  batch
    "tiny":      dict(d_model=64, n_layer=2, n_head=4, seq_len=64, vocab_size=256, batch=8),
    "mini":      dict(d_model=256, n_layer=4, n_head=8, seq_len=256, vocab_size=256, batch=8),
    "gpt2-124m": dict(d_model=768, n_layer=12, n_head=12, seq_len=256, vocab_size=50257, batch=4),
}


def default_threads():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch float32 CPU GPT-2 training-step baseline")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--seq-len", type=int, default=None, help="override the config's seq_len")
    ap.add_argument("--batch", type=int, default=None, help="override the config's batch (sequences per step)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    ap.add_argument("--threads", type=int, default=default_threads(), help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.threads < 1:
        print("error: --steps must be >= 1, --warmup >= 0, --threads >= 1", file=sys.stderr)
        return 2

    c = dict(CONFIGS[args.config])
    T = args.seq_len or c["seq_len"]
    B = args.batch or c["batch"]
    cfg = ref.GPT2Config(vocab_size=c["vocab_size"], n_layer=c["n_layer"], n_head=c["n_head"],
                         d_model=c["d_model"], seq_len=T)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)

    params = {n: t.requires_grad_(True)
              for n, t in ref.init_params(cfg, torch.float32, "convention", gen).items()}
    plist = list(params.values())
    opt = torch.optim.AdamW(
        [{"params": [p for p in plist if p.dim() >= 2], "weight_decay": 0.1},
         {"params": [p for p in plist if p.dim() < 2], "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    batch = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen)
    inputs, targets = batch[:, :-1], batch[:, 1:].reshape(-1)

    def forward_loss():
        logits = ref.gpt2_forward(params, inputs, cfg, fast=True)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets)

    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            print(f"error: --mode compile: torch {torch.__version__} has no torch.compile", file=sys.stderr)
            return 2
        forward_loss = torch.compile(forward_loss)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = forward_loss()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, 1.0)
        opt.step()
        return loss.item()

    times, losses = [], []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)

    n_params = sum(p.numel() for p in plist)
    n_flop_params = n_params - params["wpe"].numel()
    flops_per_token = 6 * n_flop_params + 12 * cfg.n_layer * cfg.d_model * T
    step_s = statistics.median(times)
    tok_s = B * T / step_s
    tflops = flops_per_token * tok_s / 1e12
    attn = "sdpa" if ref._HAS_SDPA else "manual"

    rows = [("config", args.config), ("d_model/n_layer/n_head", f"{cfg.d_model}/{cfg.n_layer}/{cfg.n_head}"),
            ("vocab/seq_len/batch", f"{cfg.vocab_size}/{T}/{B}"), ("params", f"{n_params:,}"),
            ("threads", args.threads), ("attention", attn), ("mode", args.mode), ("torch", torch.__version__),
            ("steps (timed/warmup)", f"{args.steps}/{args.warmup}"),
            ("loss first/last", f"{losses[0]:.4f}/{losses[-1]:.4f}"),
            ("step_seconds (median)", f"{step_s:.4f}"), ("tokens/s", f"{tok_s:,.0f}"),
            ("model TFLOP/s", f"{tflops:.4f}")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print(json.dumps({"bench": "torch_baseline", "config": args.config, "threads": args.threads,
                      "seq_len": T, "batch": B, "params": n_params, "attention": attn, "mode": args.mode,
                      "tokens_per_second": tok_s, "step_seconds": step_s, "tflops": tflops,
                      "torch": torch.__version__,
                      # ATen's kernels' instruction set (ATEN_CPU_CAPABILITY holds it down)
                      "cpu_capability": torch.backends.cpu.get_cpu_capability()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
