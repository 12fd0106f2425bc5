#!/usr/bin/env python3
"""PyTorch reference for meshrun's Lion optimizer (train.optimizer: lion, docs/job-spec.md).

Trains the tiny GPT-2 of fixtures/gpt2_tiny.safetensors (its parameters and token batches, see
gpt2_reference.py) for `--steps` steps in float64 with torch's gradient clipping
(clip_grad_norm_), docs/model.md's learning-rate schedule and Lion as lion-pytorch writes it
(Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):

    p <- p * (1 - lr * wd)                      (decoupled weight decay, 2+-dim parameters)
    p <- p - lr * sign(beta1 * m + (1 - beta1) * g)
    m <- beta2 * m + (1 - beta2) * g

Step k uses the fixture's batch k mod 3 (it holds three). Prints one JSON object:
{"losses": [...], "grad_norms": [...], "lrs": [...]}.

Run with the model venv: build/model-venv/bin/python lion_reference.py FIXTURE [--steps 20]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_reference import (GPT2Config, decays, lr_at, mean_loss, param_names,  # noqa: E402
                            read_safetensors)


class Lion(torch.optim.Optimizer):
    """lion-pytorch's Lion (github.com/lucidrains/lion-pytorch), without its Triton path."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.data.mul_(1.0 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1.0 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(p.grad, alpha=1.0 - beta2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fixture")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=0.5)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    args = ap.parse_args()

    tensors, _ = read_safetensors(args.fixture)
    cfg = GPT2Config(96, 2, 4, 32, 16)  # the fixture's (gpt2_reference.FIXTURE_CONFIG)
    names = param_names(cfg.n_layer)
    params = {n: torch.from_numpy(tensors["param." + n].astype("float64")).requires_grad_(True)
              for n in names}
    tokens = torch.from_numpy(tensors["tokens"].astype("int64")).reshape(-1, 4, cfg.seq_len + 1)
    plist = [params[n] for n in names]
    groups = [
        {"params": [params[n] for n in names if decays(n, params[n].shape)],
         "weight_decay": args.weight_decay},
        {"params": [params[n] for n in names if not decays(n, params[n].shape)],
         "weight_decay": 0.0},
    ]
    opt = Lion(groups, lr=args.lr, betas=(args.beta1, args.beta2))
    out = {"losses": [], "grad_norms": [], "lrs": []}
    for k in range(args.steps):
        batch = tokens[k % tokens.shape[0]]
        opt.zero_grad(set_to_none=True)
        loss = mean_loss(params, batch, cfg)
        loss.backward()
        out["losses"].append(loss.item())
        out["grad_norms"].append(
            torch.nn.utils.clip_grad_norm_(plist, max_norm=args.grad_clip).item())
        lr = lr_at(k, args.lr, args.min_lr, args.warmup_steps, args.steps)
        out["lrs"].append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
