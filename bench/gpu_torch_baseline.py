#!/usr/bin/env python3
"""PyTorch baseline for bench/gpu_train_step: the same GPT-2 (124M by default), batch, sequence
length, bf16 mixed precision (fp32 weights, autocast bf16), clipping and AdamW, on the same GPU.
Runs eager mode and then torch.compile (in try/except: a failed or missing compile is reported,
not fatal). Prints a table and one JSON line per mode (flushed at once, so a timeout keeps what
finished), then a summary JSON line with the meshrun/torch ratio when --meshrun-json points at
the bench's JSON line.

Model FLOPs per token (docs/model.md): 6·N + 12·n_layer·d_model·seq_len, N = parameters without
the position embedding, counted with the real vocabulary (50257) although both implementations
pad it internally for aligned GEMMs (meshrun to 50304 rows on the device, here as nanoGPT does).
"""

import argparse
import json
import math
import sys
import time


# Dense bf16 TFLOP/s by device name: the table of common/gpu_peak.cc (docs/gpu.md "MFU"), most
# specific first, matched as whole words.
PEAK_TABLE = [("GH200", 989.4), ("H200 NVL", 835.5), ("H200", 989.4), ("H100 NVL", 835.5),
              ("H100 PCIe", 756.5), ("H100", 989.4), ("H800", 989.4), ("B200", 2250.0),
              ("A100", 312.0), ("A800", 312.0), ("L40S", 362.05), ("L40", 181.05), ("L4", 121.0),
              ("A10G", 70.0), ("A10", 125.0)]


def peak_tflops(name):
    """Dense bf16 peak by device name (0: unknown); MESHRUN_PEAK_TFLOPS overrides it."""
    import os
    import re
    env = os.environ.get("MESHRUN_PEAK_TFLOPS", "")
    try:
        if env and float(env) > 0:
            return float(env)
    except ValueError:
        pass
    for key, tflops in PEAK_TABLE:
        if re.search(r"(?<![A-Za-z0-9])" + re.escape(key) + r"(?![A-Za-z0-9])", name, re.I):
            return tflops
    return 0.0


def build_model(torch, args, vocab_padded):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
            k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
            v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.c_proj(y)
            x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
            return x

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            C = args.d_model
            self.wte = nn.Embedding(vocab_padded, C)
            self.wpe = nn.Embedding(args.seq_len, C)
            self.h = nn.ModuleList([Block(C, args.n_head) for _ in range(args.n_layer)])
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            self.lm_head = nn.Linear(C, vocab_padded, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02
                    if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                        std = 0.02 / math.sqrt(2 * args.n_layer)
                    nn.init.normal_(p, mean=0.0, std=std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            B, T = idx.shape
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))[..., : args.vocab]
            return F.cross_entropy(logits.float().view(-1, args.vocab), targets.view(-1))

    return GPT()


def flops_per_token(args):
    C, L, V, T = args.d_model, args.n_layer, args.vocab, args.seq_len
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C  # without wpe; biases and LayerNorms included
    return 6.0 * n + 12.0 * L * C * T


def run_mode(torch, args, mode, peak, meshrun):
    device = "cuda"
    torch.manual_seed(1337)
    vocab_padded = (args.vocab + 127) // 128 * 128
    model = build_model(torch, args, vocab_padded).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    step_model = torch.compile(model) if mode == "compile" else model
    B, T = args.batch, args.seq_len
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)

    def step():
        idx = torch.randint(0, args.vocab, (B, T), device=device, generator=gen)
        tgt = torch.randint(0, args.vocab, (B, T), device=device, generator=gen)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.time()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    step_s = (time.time() - t0) / args.steps
    tps = B * T / step_s
    fpt = flops_per_token(args)
    tflops = tps * fpt / 1e12
    mfu = tflops / peak if peak > 0 else None
    result = {
        "bench": "gpu_torch_baseline",
        "mode": mode,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "batch": B,
        "seq_len": T,
        "steps": args.steps,
        "warmup_seconds": round(warmup_s, 2),
        "step_seconds": step_s,
        "tokens_per_second": tps,
        "flops_per_token": fpt,
        "tflops": tflops,
        "peak_tflops": peak,
        "mfu": mfu,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "loss_last": float(loss.item()),
    }
    if meshrun and meshrun.get("tokens_per_second"):
        result["meshrun_tokens_per_second"] = meshrun["tokens_per_second"]
        result["ratio_meshrun_over_torch"] = meshrun["tokens_per_second"] / tps
    mfu_s = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
    print(f"{'torch ' + mode:<16} {1e3 * step_s:9.2f} ms {tps:12.0f} tok/s {tflops:8.1f} TFLOP/s "
          f"MFU {mfu_s:>6}  (warmup {warmup_s:.1f} s)", flush=True)
    print(json.dumps(result), flush=True)
    del step_model, model, opt
    torch.cuda.empty_cache()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--meshrun-json", default="",
                    help="a file holding bench/gpu_train_step's JSON line (for the ratio)")
    args = ap.parse_args()

    try:
        import torch
    except ImportError as e:
        print(json.dumps({"bench": "gpu_torch_baseline", "skipped": f"no torch: {e}"}), flush=True)
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_torch_baseline", "skipped": "no CUDA device"}), flush=True)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(0)
    peak = args.peak_tflops if args.peak_tflops > 0 else peak_tflops(name)

    meshrun = None
    if args.meshrun_json:
        try:
            with open(args.meshrun_json) as f:
                for line in f:
                    line = line.strip()
                    if line.startswith("{") and '"gpu_train_step"' in line:
                        meshrun = json.loads(line)
        except (OSError, ValueError) as e:
            print(f"note: cannot read {args.meshrun_json}: {e}", file=sys.stderr)

    print(f"gpu {name}, torch {torch.__version__}, batch {args.batch}x{args.seq_len}, "
          f"peak {peak} TFLOP/s", flush=True)
    results = []
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        try:
            results.append(run_mode(torch, args, mode, peak, meshrun))
        except Exception as e:  # noqa: BLE001 - report any failure of one mode, keep going
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"torch {mode}: failed: {msg}", flush=True)
            print(json.dumps({"bench": "gpu_torch_baseline", "mode": mode, "error": msg}),
                  flush=True)
            torch.cuda.empty_cache()
    if results:
        best = max(results, key=lambda r: r["tokens_per_second"])
        summary = {"bench": "gpu_torch_baseline", "mode": "best", "best_mode": best["mode"],
                   "tokens_per_second": best["tokens_per_second"], "mfu": best["mfu"]}
        if meshrun and meshrun.get("tokens_per_second"):
            summary["meshrun_tokens_per_second"] = meshrun["tokens_per_second"]
            summary["meshrun_mfu"] = meshrun.get("mfu")
            summary["ratio_meshrun_over_torch"] = meshrun["tokens_per_second"] / best[
                "tokens_per_second"]
            print(f"{'meshrun':<16} {1e3 * meshrun['step_seconds']:9.2f} ms "
                  f"{meshrun['tokens_per_second']:12.0f} tok/s   ratio meshrun/torch("
                  f"{best['mode']}) = {summary['ratio_meshrun_over_torch']:.3f}", flush=True)
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
