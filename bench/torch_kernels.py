#!/usr/bin/env python3
"""PyTorch float32 CPU timings of the kernels bench/kernels times, at the same shapes and
threads, for its torch_ms column: each op as a user writes it in eager torch (F.linear,
F.scaled_dot_product_attention, F.layer_norm, F.gelu(approximate="tanh"), F.cross_entropy,
torch.optim.AdamW's default). Best of --iters runs after --warmup. Prints one JSON line
{"bench": "torch_kernels", "torch": version, "results": {kernel: ms}}.

  build/torch-venv/bin/python bench/torch_kernels.py --B 8 --T 256 --C 256 --H 8 --V 256 --threads 2
"""

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def best_ms(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    for name, default in [("B", 1), ("T", 1024), ("C", 768), ("H", 12), ("V", 50257)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--adamw-params", type=int, default=124_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    N, C, H, T, B, V = a.B * a.T, a.C, a.H, a.T, a.B, a.V
    it, wu = a.iters, a.warmup
    res = {}

    def linear(name, n_in, n_out):
        x = torch.randn(N, n_in, requires_grad=True)
        w = (torch.randn(n_out, n_in) * 0.02).requires_grad_(True)
        b = torch.zeros(n_out, requires_grad=True)
        big = 2.0 * N * n_in * n_out > 2e10
        i, w_ = (min(it, 3), 1) if big else (it, wu)
        with torch.no_grad():
            res[name + "_fwd"] = best_ms(lambda: F.linear(x, w, b), i, w_)
        y = F.linear(x, w, b)
        g = torch.randn_like(y)
        res[name + "_bwd"] = best_ms(lambda: torch.autograd.grad(y, (x, w, b), g, retain_graph=True), i, w_)

    linear("matmul_qkv", C, 3 * C)
    linear("matmul_attn_proj", C, C)
    linear("matmul_fc", C, 4 * C)
    linear("matmul_mlp_proj", 4 * C, C)
    linear("matmul_lm_head", C, V)

    D = C // H
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        res["attention_fwd"] = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), it, wu)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    go = torch.randn_like(o)
    res["attention_bwd"] = best_ms(lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True), it, wu)

    x = torch.randn(N, C, requires_grad=True)
    w, b = torch.ones(C, requires_grad=True), torch.zeros(C, requires_grad=True)
    with torch.no_grad():
        res["layernorm_fwd"] = best_ms(lambda: F.layer_norm(x, (C,), w, b, 1e-5), it, wu)
    y = F.layer_norm(x, (C,), w, b, 1e-5)
    gy = torch.randn_like(y)
    res["layernorm_bwd"] = best_ms(lambda: torch.autograd.grad(y, (x, w, b), gy, retain_graph=True), it, wu)

    h = (torch.rand(N, 4 * C) * 6 - 3).requires_grad_(True)
    with torch.no_grad():
        res["gelu_fwd"] = best_ms(lambda: F.gelu(h, approximate="tanh"), it, wu)
    gh = F.gelu(h, approximate="tanh")
    ggh = torch.randn_like(gh)
    res["gelu_bwd"] = best_ms(lambda: torch.autograd.grad(gh, (h,), ggh, retain_graph=True), it, wu)

    logits = (torch.rand(N, V) * 10 - 5).requires_grad_(True)
    targets = torch.arange(N) * 7919 % V

    def ce():  # loss and dlogits, as meshrun's fused kernel computes both
        loss = F.cross_entropy(logits, targets)
        torch.autograd.grad(loss, (logits,))

    res["cross_entropy"] = best_ms(ce, it, wu)

    p = torch.randn(a.adamw_params, requires_grad=True)
    p.grad = torch.randn(a.adamw_params)
    opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    res["adamw"] = best_ms(opt.step, it, wu)

    print(json.dumps({"bench": "torch_kernels", "torch": torch.__version__, "threads": a.threads,
                      "results": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
