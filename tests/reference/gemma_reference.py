#!/usr/bin/env python3
"""Independent Hugging Face reference for meshrun's Gemma (tests/integration/gemma_test.cc).

Built on transformers' GemmaForCausalLM and hf_reference.py's training loop (torch.optim.AdamW
and the rules of docs/), never on meshrun's code. Run with the tests' model venv:

  gemma_reference.py prepare OUT     OUT/gemma: a tiny random GemmaForCausalLM (GeGLU with the
                                     tanh GELU, (1 + w) RMSNorm, embeddings × √hidden_size,
                                     head_dim 16 ≠ hidden_size/heads = 12, grouped-query
                                     attention, tied head), OUT/data.bin, and the reference's
                                     per-step losses (JSON)
  gemma_reference.py eval DIR... --tokens FILE --seq T
                                     hf_reference.py's eval (mean loss over every window)
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402


def make_gemma(dir_, seed):
    torch.manual_seed(seed)
    cfg = transformers.GemmaConfig(
        vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=128, rope_theta=10000.0, hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True, attention_bias=False)
    model = transformers.GemmaForCausalLM(cfg)
    # Matrices N(0, 0.08), the norms' stored w U(0.8, 1.2) (so x·(1 + w) and x·w differ).
    hf_reference.init_weights(model, 0.08)
    model.save_pretrained(dir_, safe_serialization=True)


def prepare(args):
    out = args.out
    make_gemma(os.path.join(out, "gemma"), seed=5)
    rng = np.random.default_rng(6)
    data = os.path.join(out, "data.bin")
    hf_reference.write_tokens(data, rng.integers(0, 300, size=4000))
    args.tokens = data
    args.steps = 2
    json.dump({"gemma": hf_reference.train_losses(os.path.join(out, "gemma"), args)}, sys.stdout)
    print()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    hf_reference.add_train_args(p, steps=2)
    p = sub.add_parser("eval")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--tokens", required=True)
    p.add_argument("--prompt", default="")
    p.add_argument("--new-tokens", dest="new_tokens", type=int, default=8)
    hf_reference.add_train_args(p, steps=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "prepare":
        prepare(args)
    else:
        hf_reference.evaluate(args)


if __name__ == "__main__":
    main()
