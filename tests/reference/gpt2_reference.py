#!/usr/bin/env python3
"""PyTorch reference GPT-2 for meshrun (docs/model.md): writes the numeric fixtures the C++
tests compare against (`fixtures`) and scores a Hugging Face GPT-2 export (`score`).

Run with the model venv (torch and numpy from PyPI): build/model-venv/bin/python gpt2_reference.py ...
Importable: bench/torch_baseline.py reuses GPT2Config, init_params and gpt2_forward.
"""

import argparse
import json
import math
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# safetensors, written by hand with numpy (no `safetensors` package here).
# Layout: u64 LE header length, JSON header {name: {dtype, shape, data_offsets}} with an
# optional "__metadata__" (str -> str), then the raw little-endian tensor bytes.
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
_NP_TO_ST = {v: k for k, v in _ST_DTYPES.items()}


def read_safetensors(path):
    """Returns ({name: np.ndarray}, metadata dict). BF16 is widened to float32 exactly."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} exceeds the file size {len(blob)}")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        dtype = info["dtype"]
        raw = data[begin:end]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=_ST_DTYPES[dtype])
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {list(shape)}")
        tensors[name] = arr.reshape(shape).copy()
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: np.ndarray} in insertion order; deterministic bytes for equal input."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    chunks = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        if dt not in _NP_TO_ST:
            raise ValueError(f"tensor {name}: unsupported numpy dtype {arr.dtype}")
        raw = arr.astype(dt, copy=False).tobytes()
        header[name] = {"dtype": _NP_TO_ST[dt], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((-len(hbytes)) % 8)  # pad so the data starts 8-byte aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# The model (docs/model.md), functional over an ordered {name: tensor} dict.
# --------------------------------------------------------------------------------------------

@dataclass
class GPT2Config:
    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int
    ln_eps: float = 1e-5


def param_names(n_layer):
    """Parameter names in the canonical iteration order."""
    names = ["wte", "wpe"]
    for i in range(n_layer):
        p = f"h.{i}."
        names += [p + "ln_1.weight", p + "ln_1.bias",
                  p + "attn.c_attn.weight", p + "attn.c_attn.bias",
                  p + "attn.c_proj.weight", p + "attn.c_proj.bias",
                  p + "ln_2.weight", p + "ln_2.bias",
                  p + "mlp.c_fc.weight", p + "mlp.c_fc.bias",
                  p + "mlp.c_proj.weight", p + "mlp.c_proj.bias"]
    return names + ["ln_f.weight", "ln_f.bias"]


def param_shapes(cfg):
    """{name: shape} with Linear weights in PyTorch (out, in) layout."""
    C, V, T = cfg.d_model, cfg.vocab_size, cfg.seq_len
    shapes = {}
    for name in param_names(cfg.n_layer):
        leaf = name.split(".", 2)[-1] if name.startswith("h.") else name
        shapes[name] = {
            "wte": (V, C), "wpe": (T, C),
            "ln_1.weight": (C,), "ln_1.bias": (C,), "ln_2.weight": (C,), "ln_2.bias": (C,),
            "ln_f.weight": (C,), "ln_f.bias": (C,),
            "attn.c_attn.weight": (3 * C, C), "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
            "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,),
            "mlp.c_proj.weight": (C, 4 * C), "mlp.c_proj.bias": (C,),
        }[leaf]
    return shapes


def is_output_projection(name):
    return name.endswith("attn.c_proj.weight") or name.endswith("mlp.c_proj.weight")


def init_params(cfg, dtype=torch.float32, style="convention", generator=None):
    """Random parameters in canonical order.

    style "convention": docs/model.md (weights N(0,0.02), output projections
    N(0,0.02/sqrt(2L)), biases 0, LayerNorm 1/0). style "fixture": the same weights but biases
    N(0,0.02), LN weights 1+N(0,0.1), LN biases N(0,0.02), so every term of the math is exercised.
    Draws happen in float64 in canonical order, then are cast to `dtype`.
    """
    params = {}
    proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, shape in param_shapes(cfg).items():
        def randn():
            return torch.randn(shape, dtype=torch.float64, generator=generator)
        is_ln = ".ln_" in name or name.startswith("ln_f")
        if is_ln and name.endswith(".weight"):
            t = 1.0 + 0.1 * randn() if style == "fixture" else torch.ones(shape, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.02 * randn() if style == "fixture" else torch.zeros(shape, dtype=torch.float64)
        else:
            t = (proj_std if is_output_projection(name) else 0.02) * randn()
        params[name] = t.to(dtype)
    return params


def gelu_new(x):
    """tanh-approximated GELU, as GPT-2's `gelu_new`."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def causal_attention(q, k, v, fast=False):
    """q, k, v: (B, H, T, hd) -> (B, H, T, hd)."""
    if fast and _HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def gpt2_forward(params, idx, cfg, fast=False):
    """idx: (B, T) int64 token ids -> logits (B, T, V). `fast` uses fused torch ops
    (SDPA when available, F.gelu(approximate="tanh")); the math is the same."""
    B, T = idx.shape
    C, H = cfg.d_model, cfg.n_head
    hd = C // H
    eps = cfg.ln_eps
    act = (lambda t: F.gelu(t, approximate="tanh")) if fast else gelu_new
    x = params["wte"][idx] + params["wpe"][:T]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), params[p + "ln_1.weight"], params[p + "ln_1.bias"], eps)
        qkv = F.linear(h, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])
        # rows of c_attn: part * C + head * hd + j, part = q, k, v
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        y = causal_attention(q, k, v, fast).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), params[p + "ln_2.weight"], params[p + "ln_2.bias"], eps)
        h = act(F.linear(h, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"]))
        x = x + F.linear(h, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), params["ln_f.weight"], params["ln_f.bias"], eps)
    return F.linear(x, params["wte"])  # LM head tied to the token embedding


def mean_loss(params, tokens, cfg):
    """tokens: (B, T+1) -> mean next-token cross-entropy over all B*T targets."""
    logits = gpt2_forward(params, tokens[:, :-1], cfg)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def lr_at(k, lr, min_lr, warmup_steps, steps):
    """docs/model.md schedule at 0-based step k."""
    if k < warmup_steps:
        return lr * (k + 1) / warmup_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * (k - warmup_steps) / (steps - warmup_steps))) * (lr - min_lr)


def decays(name, shape):
    return len(shape) >= 2


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------

FIXTURE_CONFIG = {
    "arch": "gpt2", "vocab_size": 96, "n_layer": 2, "n_head": 4, "d_model": 32, "seq_len": 16,
    "ln_eps": 1e-5, "global_batch_size": 4, "micro_batch_size": 2, "steps": 3,
    "lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 1, "weight_decay": 0.1,
    "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.5, "seed": 0,
}


def _train(params0, tokens, fc, dtype, check=True):
    """Trains `steps` steps from params0 (dict of tensors); returns a record of everything.
    Runs the gradient-accumulation path and (if check) asserts it equals the full batch."""
    cfg = GPT2Config(fc["vocab_size"], fc["n_layer"], fc["n_head"], fc["d_model"], fc["seq_len"], fc["ln_eps"])
    names = list(params0)
    params = {n: params0[n].detach().clone().to(dtype).requires_grad_(True) for n in names}
    plist = [params[n] for n in names]
    groups = [
        {"params": [params[n] for n in names if decays(n, params[n].shape)], "weight_decay": fc["weight_decay"]},
        {"params": [params[n] for n in names if not decays(n, params[n].shape)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=fc["lr"], betas=(fc["beta1"], fc["beta2"]), eps=fc["eps"])
    B, mb = fc["global_batch_size"], fc["micro_batch_size"]
    n_micro = B // mb
    rec = {"losses": [], "grad_norm": [], "lrs": [], "clip_coef": []}
    for k in range(fc["steps"]):
        batch = tokens[k]
        # full batch
        loss_full = mean_loss(params, batch, cfg)
        grads_full = torch.autograd.grad(loss_full, plist)
        if k == 0:
            with torch.no_grad():
                rec["logits"] = gpt2_forward(params, batch[:, :-1], cfg).detach().clone()
            rec["loss0"] = loss_full.detach().clone()
            rec["grads0"] = {n: g.detach().clone() for n, g in zip(names, grads_full)}
        # gradient accumulation over micro-batches, each micro loss scaled by 1/n_micro
        opt.zero_grad(set_to_none=True)
        loss_acc = 0.0
        for m in range(n_micro):
            lm = mean_loss(params, batch[m * mb:(m + 1) * mb], cfg) / n_micro
            lm.backward()
            loss_acc += lm.item()
        if check:
            tol = 1e-12 if dtype == torch.float64 else 1e-5
            assert abs(loss_acc - loss_full.item()) <= tol * abs(loss_full.item()), (loss_acc, loss_full.item())
            for n, g in zip(names, grads_full):
                err = (params[n].grad - g).abs().max().item()
                assert err <= tol * max(g.abs().max().item(), 1e-30), (n, err)
        rec["losses"].append(loss_full.item())
        norm = torch.nn.utils.clip_grad_norm_(plist, max_norm=fc["grad_clip"]).item()
        rec["grad_norm"].append(norm)
        rec["clip_coef"].append(min(1.0, fc["grad_clip"] / (norm + 1e-6)))
        lr = lr_at(k, fc["lr"], fc["min_lr"], fc["warmup_steps"], fc["steps"])
        rec["lrs"].append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
    rec["after"] = {n: params[n].detach().clone() for n in names}
    return rec


def _adamw_by_hand(params0, tokens, fc, grads_per_step_fn):
    """Independent AdamW (docs/model.md formulas) in float64, to cross-check torch.optim."""
    names = list(params0)
    p = {n: params0[n].clone() for n in names}
    m = {n: torch.zeros_like(p[n]) for n in names}
    v = {n: torch.zeros_like(p[n]) for n in names}
    b1, b2 = fc["beta1"], fc["beta2"]
    for k in range(fc["steps"]):
        grads = grads_per_step_fn(p, k)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        coef = min(1.0, fc["grad_clip"] / (norm + 1e-6))
        lr = lr_at(k, fc["lr"], fc["min_lr"], fc["warmup_steps"], fc["steps"])
        t = k + 1
        for n in names:
            g = grads[n] * coef
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            if decays(n, p[n].shape):
                p[n] = p[n] * (1 - lr * fc["weight_decay"])
            mhat = m[n] / (1 - b1 ** t)
            vhat = v[n] / (1 - b2 ** t)
            p[n] = p[n] - lr * mhat / (vhat.sqrt() + fc["eps"])
    return p


def cmd_fixtures(args):
    fc = dict(FIXTURE_CONFIG)
    if args.grad_clip is not None:
        fc["grad_clip"] = args.grad_clip
    cfg = GPT2Config(fc["vocab_size"], fc["n_layer"], fc["n_head"], fc["d_model"], fc["seq_len"], fc["ln_eps"])
    torch.manual_seed(fc["seed"])
    # Draw in float64, round to float32 (what is stored) and compute from the rounded values,
    # so a float32 implementation that starts from the file computes the same function.
    params0 = {n: t.to(torch.float32).to(torch.float64)
               for n, t in init_params(cfg, torch.float64, style="fixture").items()}
    tokens = torch.randint(0, fc["vocab_size"],
                           (fc["steps"], fc["global_batch_size"], fc["seq_len"] + 1), dtype=torch.int64)

    rec = _train(params0, tokens, fc, torch.float64)

    def grads_fn(p, k):
        pp = {n: t.detach().clone().requires_grad_(True) for n, t in p.items()}
        loss = mean_loss(pp, tokens[k], cfg)
        return dict(zip(pp, torch.autograd.grad(loss, list(pp.values()))))
    by_hand = _adamw_by_hand(params0, tokens, fc, grads_fn)
    for n in params0:
        err = (by_hand[n] - rec["after"][n]).abs().max().item()
        assert err <= 1e-12, f"hand AdamW differs from torch.optim.AdamW on {n}: {err}"

    for k, (norm, lr) in enumerate(zip(rec["grad_norm"], rec["lrs"])):
        active = norm > fc["grad_clip"]
        print(f"step {k}: loss {rec['losses'][k]:.10f}  grad_norm {norm:.6f}  clip {fc['grad_clip']}  "
              f"{'clipped' if active else 'NOT clipped'} (coef {rec['clip_coef'][k]:.6f})  lr {lr:.6g}")
        assert active, f"step {k}: grad norm {norm} <= grad_clip {fc['grad_clip']}; clipping must be active"

    f32 = lambda t: t.detach().to(torch.float32).numpy()
    tensors = {}
    for n, t in params0.items():
        tensors["param." + n] = f32(t)
    tensors["tokens"] = tokens.to(torch.int32).numpy()
    tensors["logits"] = f32(rec["logits"])
    tensors["loss"] = np.array([rec["loss0"].item()], dtype=np.float32)
    for n, g in rec["grads0"].items():
        tensors["grad." + n] = f32(g)
    tensors["losses"] = np.array(rec["losses"], dtype=np.float32)
    tensors["grad_norm"] = np.array(rec["grad_norm"], dtype=np.float32)
    for n, t in rec["after"].items():
        tensors["after3." + n] = f32(t)

    metadata = {
        "config": json.dumps(fc, sort_keys=True),
        "param_names": json.dumps(param_names(fc["n_layer"])),
        "lrs": json.dumps(rec["lrs"]),
        "notes": ("float64 math from the stored float32 params; stored as float32. step k uses "
                  "tokens[k]: inputs [:, :T], targets [:, 1:]. clip coef = min(1, grad_clip/(norm+1e-6)) "
                  "(torch clip_grad_norm_). AdamW = torch.optim.AdamW, decay on params with >= 2 dims."),
        "generator": "tests/reference/gpt2_reference.py fixtures",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_safetensors(args.out, tensors, metadata)
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {size} bytes, {len(tensors)} tensors")

    if args.check_fp32:
        _report_fp32_agreement(args.out)


def _rel(a, b):
    """Norm-wise relative error ||a-b|| / ||b||."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def _report_fp32_agreement(path):
    """Replays the fixture in float32 PyTorch and prints how close it gets: an estimate of
    what a correct float32 implementation achieves against the 1e-5 relative tolerance."""
    t, meta = read_safetensors(path)
    fc = json.loads(meta["config"])
    names = json.loads(meta["param_names"])
    params0 = {n: torch.from_numpy(t["param." + n]) for n in names}
    tokens = torch.from_numpy(t["tokens"]).long()
    rec = _train(params0, tokens, fc, torch.float32)
    worst = {}
    worst["logits"] = _rel(rec["logits"].numpy(), t["logits"])
    worst["loss"] = _rel([rec["loss0"].item()], t["loss"])
    worst["losses"] = _rel(rec["losses"], t["losses"])
    worst["grad_norm"] = _rel(rec["grad_norm"], t["grad_norm"])
    worst["grad.* (max over tensors)"] = max(_rel(rec["grads0"][n].numpy(), t["grad." + n]) for n in names)
    worst["after3.* (max over tensors)"] = max(_rel(rec["after"][n].numpy(), t["after3." + n]) for n in names)
    print("float32 torch replay vs fixture, norm-wise relative error:")
    for k, v in worst.items():
        print(f"  {k:28s} {v:.2e}")


# --------------------------------------------------------------------------------------------
# score
# --------------------------------------------------------------------------------------------

LLMC_MAGIC = 20240520


def read_tokens(path, fmt="auto"):
    """Token stream of docs/data.md as an int64 numpy array."""
    if os.path.isdir(path):
        if fmt not in ("auto", "text"):
            raise ValueError(f"{path}: a folder is read as text files, not --format {fmt}")
        data = b"".join(open(os.path.join(path, f), "rb").read()
                        for f in sorted(os.listdir(path)) if os.path.isfile(os.path.join(path, f)))
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    with open(path, "rb") as f:
        data = f.read()
    if fmt == "auto":
        if len(data) >= 1024 and struct.unpack("<i", data[:4])[0] == LLMC_MAGIC:
            fmt = "llmc"
        elif path.endswith(".bin"):
            fmt = "nanogpt"
        else:
            fmt = "text"
    if fmt == "text":
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if fmt == "llmc":
        header = np.frombuffer(data[:1024], dtype="<i4")
        if header[0] != LLMC_MAGIC:
            raise ValueError(f"{path}: magic {header[0]} != {LLMC_MAGIC}; not an llm.c token file")
        count = int(header[2])
        if 1024 + 2 * count > len(data):
            raise ValueError(f"{path}: header says {count} tokens but the file holds {(len(data) - 1024) // 2}")
        return np.frombuffer(data[1024:1024 + 2 * count], dtype="<u2").astype(np.int64)
    if fmt == "nanogpt":
        if len(data) % 2:
            raise ValueError(f"{path}: odd byte count {len(data)} for a uint16 token file")
        return np.frombuffer(data, dtype="<u2").astype(np.int64)
    raise ValueError(f"unknown --format {fmt}")


_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def load_hf_gpt2(model_dir, dtype=torch.float64):
    """Loads a Hugging Face GPT-2 dir (docs/checkpoints.md) into (GPT2Config, params)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    cfg = GPT2Config(vocab_size=hf["vocab_size"], n_layer=hf["n_layer"], n_head=hf["n_head"],
                     d_model=hf["n_embd"], seq_len=hf["n_positions"],
                     ln_eps=hf.get("layer_norm_epsilon", 1e-5))
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        print(f"warning: activation_function {act!r}; scoring with tanh-GELU (gelu_new)", file=sys.stderr)
    raw, _ = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    st = {}
    for k, v in raw.items():
        st[k[len("transformer."):] if k.startswith("transformer.") else k] = v
    params = {}
    for name, shape in param_shapes(cfg).items():
        key = name + ".weight" if name in ("wte", "wpe") else name
        if key not in st:
            raise KeyError(f"{model_dir}: missing tensor transformer.{key}")
        arr = st[key]
        if name.endswith(_CONV1D):
            arr = arr.T  # Conv1D (in, out) -> Linear (out, in)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"{model_dir}: transformer.{key} has shape {list(st[key].shape)}, "
                             f"expected {list(shape)} (after Conv1D transpose)")
        params[name] = torch.from_numpy(np.ascontiguousarray(arr)).to(dtype)
    if "lm_head.weight" in st:
        lm = torch.from_numpy(st["lm_head.weight"]).to(dtype)
        if lm.shape != params["wte"].shape or not torch.equal(lm, params["wte"]):
            print("warning: lm_head.weight differs from transformer.wte.weight; GPT-2 ties them, "
                  "scoring with wte", file=sys.stderr)
    return cfg, params


def score(model_dir, tokens, seq_len=None, max_batch_elems=1 << 25):
    """Mean CE (float64) over all windows j < floor((N-1)/T) of `tokens`; returns (loss, count)."""
    cfg, params = load_hf_gpt2(model_dir, torch.float64)
    T = seq_len or cfg.seq_len
    if T > cfg.seq_len:
        raise ValueError(f"--seq-len {T} exceeds n_positions {cfg.seq_len}")
    if tokens.size and tokens.max() >= cfg.vocab_size:
        raise ValueError(f"token id {int(tokens.max())} >= vocab_size {cfg.vocab_size}")
    n_windows = (len(tokens) - 1) // T if len(tokens) > 0 else 0
    if n_windows == 0:
        raise ValueError(f"{len(tokens)} tokens hold no window of seq_len {T} (+1 target)")
    tok = torch.from_numpy(tokens[:n_windows * T + 1])
    idx = torch.arange(n_windows).unsqueeze(1) * T + torch.arange(T + 1).unsqueeze(0)
    batch = max(1, max_batch_elems // (T * cfg.vocab_size))
    total = 0.0
    with torch.no_grad():
        for s in range(0, n_windows, batch):
            w = tok[idx[s:s + batch]]
            logits = gpt2_forward(params, w[:, :-1], cfg)
            total += F.cross_entropy(logits.reshape(-1, cfg.vocab_size), w[:, 1:].reshape(-1),
                                     reduction="sum").item()
    count = n_windows * T
    return total / count, count


def cmd_score(args):
    tokens = read_tokens(args.tokens, args.format)
    loss, count = score(args.model, tokens, args.seq_len)
    print(json.dumps({"loss": loss, "tokens": count}))


def cmd_generate(args):
    """Greedy continuation of a byte prompt in float64 (the reference for `meshrun generate`)."""
    cfg, params = load_hf_gpt2(args.model, torch.float64)
    ids = list(args.prompt.encode("utf-8"))
    new = []
    with torch.no_grad():
        for _ in range(args.max_new_tokens):
            window = ids[-cfg.seq_len:]
            logits = gpt2_forward(params, torch.tensor([window]), cfg)[0, -1]
            nxt = int(torch.argmax(logits).item())
            new.append(nxt)
            ids.append(nxt)
    print(json.dumps({"tokens": new}))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fx = sub.add_parser("fixtures", help="write the numeric fixtures for the C++ tests")
    fx.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "fixtures", "gpt2_tiny.safetensors"))
    fx.add_argument("--grad-clip", type=float, default=None, help=argparse.SUPPRESS)
    fx.add_argument("--check-fp32", action="store_true",
                    help="also replay in float32 torch and print the relative errors")
    sc = sub.add_parser("score", help="mean loss of a Hugging Face GPT-2 dir over a token stream")
    sc.add_argument("--model", required=True, help="dir with model.safetensors + config.json")
    sc.add_argument("--tokens", required=True, help="text file/folder, llm.c .bin or nanoGPT .bin")
    sc.add_argument("--format", default="auto", choices=["auto", "text", "llmc", "nanogpt"])
    sc.add_argument("--seq-len", type=int, default=None, help="window length (default n_positions)")
    sc.add_argument("--threads", type=int, default=None)
    gn = sub.add_parser("generate", help="greedy continuation of a byte prompt")
    gn.add_argument("--model", required=True, help="dir with model.safetensors + config.json")
    gn.add_argument("--prompt", required=True)
    gn.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    try:
        {"fixtures": cmd_fixtures, "score": cmd_score, "generate": cmd_generate}[args.cmd](args)
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
