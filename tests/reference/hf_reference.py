#!/usr/bin/env python3
"""Independent Hugging Face references for meshrun's models (GPT-2 and Llama).

Built on transformers and torch.optim.AdamW from the published architectures and the training
rules of docs/ (data windows, learning-rate schedule, clipping, weight decay), never on
meshrun's code. Run with the tests' model venv (tests/python/requirements-models.txt):

  hf_reference.py make-llama DIR           a tiny LlamaForCausalLM (GQA, rope_theta 5e5 with
                                           llama3 scaling, untied head), save_pretrained
  hf_reference.py make-gpt2 DIR --layout prefixed|unprefixed
                                           a tiny GPT-2: GPT2LMHeadModel (transformer.* names)
                                           or the bare GPT2Model (wte.weight, h.0...: the
                                           published gpt2 checkpoint's layout)
  hf_reference.py tokens FILE --vocab V --count N --seed S
                                           an llm.c token file of N random ids below V
  hf_reference.py train DIR --tokens FILE --seq T --batch B --steps K [--lr ...]
                                           per-step losses of AdamW training from DIR (JSON)
  hf_reference.py eval DIR... --tokens FILE --seq T [--prompt TEXT --new-tokens N]
                                           mean loss over every window of FILE, per folder,
                                           and the greedy continuation of a byte prompt
  hf_reference.py prepare OUT              all of the above that tests/integration/
                                           hf_models_test.cc needs, in one start-up: OUT/llama,
                                           OUT/gpt2-prefixed, OUT/gpt2-unprefixed, OUT/data.bin,
                                           and the reference losses (JSON)
"""

import argparse
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers


def read_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        assert header[0] == 20240520, "not an llm.c token file"
        dtype = np.uint16 if header[1] == 1 else np.uint32
        return np.frombuffer(f.read(), dtype=dtype).astype(np.int64)


def write_tokens(path, ids):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(np.asarray(ids, dtype=np.uint16).tobytes())


def load(dir_):
    cfg = transformers.AutoConfig.from_pretrained(dir_)
    if cfg.model_type == "gpt2":
        cls = transformers.GPT2LMHeadModel
    else:
        cls = transformers.AutoModelForCausalLM
    model = cls.from_pretrained(dir_, dtype=torch.float32, attn_implementation="eager")
    model.eval()  # no dropout (the tiny configs have none anyway)
    return model


def init_weights(model, std):
    """Matrices N(0, std), vectors U(0.8, 1.2): larger than the 0.02 init, so that every path
    matters."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
            else:
                p.uniform_(0.8, 1.2)


def make_llama(args):
    torch.manual_seed(args.seed)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    model = transformers.LlamaForCausalLM(cfg)
    init_weights(model, 0.08)
    model.save_pretrained(args.dir, safe_serialization=True)


def make_gpt2(args):
    torch.manual_seed(args.seed)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  activation_function="gelu_new")
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    if args.layout == "unprefixed":
        model.transformer.save_pretrained(args.dir, safe_serialization=True)
        # The bare model's config says GPT2Model; the weights are the LM's (tied head).
    else:
        model.save_pretrained(args.dir, safe_serialization=True)


def windows(tokens, seq):
    n = (len(tokens) - 1) // seq
    return n, lambda j: tokens[j * seq: j * seq + seq + 1]


def lr_at(k, args):
    # docs/model.md: linear warmup, then cosine to min_lr.
    if k < args.warmup:
        return args.lr * (k + 1) / args.warmup
    progress = (k - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (args.lr - args.min_lr)


def batch_loss(model, batch):
    x = torch.tensor(batch[:, :-1])
    y = torch.tensor(batch[:, 1:])
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def train(args):
    json.dump({"losses": train_losses(args.dir, args)}, sys.stdout)
    print()


def train_losses(dir_, args, loss_fn=batch_loss, check_first_batch=None):
    """Per-step losses of AdamW training from dir_ on args.tokens (the windows, schedule,
    clipping and weight decay of docs/), with loss_fn(model, batch); check_first_batch(model,
    batch), when given, runs on the first batch before any update."""
    torch.manual_seed(0)
    model = load(dir_)
    tokens = read_tokens(args.tokens)
    n_windows, window = windows(tokens, args.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    losses = []
    for k in range(args.steps):
        batch = np.stack([window((k * args.batch + i) % n_windows) for i in range(args.batch)])
        if k == 0 and check_first_batch is not None:
            check_first_batch(model, batch)
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(k, args)
        opt.step()
        losses.append(loss.item())
    return losses


def eval_loss(dir_, tokens_path, seq):
    model = load(dir_)
    tokens = read_tokens(tokens_path)
    n_windows, window = windows(tokens, seq)
    total, count = 0.0, 0
    with torch.no_grad():
        for j in range(n_windows):
            loss = batch_loss(model, np.stack([window(j)]))
            total += loss.item() * seq
            count += seq
    return {"loss": total / count, "tokens": count}


def greedy(dir_, prompt, n):
    model = load(dir_)
    ids = torch.tensor([list(prompt.encode("utf-8"))])
    # Exactly n tokens, as meshrun generate makes them: no stop at an end-of-text id.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0].tolist()[ids.shape[1]:]


def evaluate(args):
    results = []
    for d in args.dirs:
        r = eval_loss(d, args.tokens, args.seq)
        if args.prompt:  # the greedy continuation of a byte-level prompt, as generate() does it
            r["generated"] = greedy(d, args.prompt, args.new_tokens)
        results.append(r)
    json.dump(results, sys.stdout)
    print()


def prepare(args):
    import os
    out = args.out
    make_llama(argparse.Namespace(dir=os.path.join(out, "llama"), seed=1))
    for layout in ("prefixed", "unprefixed"):
        make_gpt2(argparse.Namespace(dir=os.path.join(out, "gpt2-" + layout), layout=layout,
                                     seed=2))
    rng = np.random.default_rng(3)
    data = os.path.join(out, "data.bin")
    write_tokens(data, rng.integers(0, 300, size=4000))
    args.tokens = data
    result = {"llama": train_losses(os.path.join(out, "llama"), args)}
    first = argparse.Namespace(**vars(args))
    first.steps = 1
    for layout in ("prefixed", "unprefixed"):
        result["gpt2-" + layout] = train_losses(os.path.join(out, "gpt2-" + layout), first)
    json.dump(result, sys.stdout)
    print()


def add_train_args(p, steps):
    """The training options of train_losses (the schedule of the tests' specs)."""
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", dest="min_lr", type=float, default=3e-5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--weight-decay", dest="weight_decay", type=float, default=0.1)
    p.add_argument("--grad-clip", dest="grad_clip", type=float, default=1.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-llama")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("make-gpt2")
    p.add_argument("dir")
    p.add_argument("--layout", choices=["prefixed", "unprefixed"], default="prefixed")
    p.add_argument("--seed", type=int, default=2)
    p = sub.add_parser("tokens")
    p.add_argument("file")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--seed", type=int, default=3)
    for name in ("train", "eval", "prepare"):
        p = sub.add_parser(name)
        if name == "eval":
            p.add_argument("dirs", nargs="+")
            p.add_argument("--prompt", default="")
            p.add_argument("--new-tokens", dest="new_tokens", type=int, default=8)
        elif name == "prepare":
            p.add_argument("out")
        else:
            p.add_argument("dir")
        if name != "prepare":
            p.add_argument("--tokens", required=True)
        add_train_args(p, steps=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "make-llama":
        make_llama(args)
    elif args.cmd == "make-gpt2":
        make_gpt2(args)
    elif args.cmd == "tokens":
        rng = np.random.default_rng(args.seed)
        write_tokens(args.file, rng.integers(0, args.vocab, size=args.count))
    elif args.cmd == "train":
        train(args)
    elif args.cmd == "prepare":
        prepare(args)
    else:
        evaluate(args)


if __name__ == "__main__":
    main()
