#!/usr/bin/env python3
"""Independent references for meshrun's attention masks (tests/integration/attention_masks_test.cc).

Built on transformers and torch from the published architectures, never on meshrun's code. Run
with the tests' model venv (tests/python/requirements-models.txt):

  mask_reference.py prepare OUT     writes OUT/mistral (a tiny MistralForCausalLM with
                                    sliding_window 11 < seq_len 32), OUT/llama-doc and
                                    OUT/gpt2-doc (tiny Llama and GPT-2 whose eos_token_id is 2),
                                    OUT/data.bin (random ids below 300 with id 2, the end of a
                                    document, every few tokens), and prints the per-step losses
                                    of AdamW training on them (JSON):
                                      mistral: transformers' own sliding-window mask;
                                      llama-doc, gpt2-doc: a block-diagonal causal mask (4D, no
                                      attention across the end-of-text token that ends a
                                      document) with position_ids restarting at each document,
                                      checked against running every document on its own.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402  (the data windows, schedule and AdamW settings of docs/)

EOT = 2


def make_mistral(dir_):
    torch.manual_seed(5)
    cfg = transformers.MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False, rope_theta=10000.0,
        sliding_window=11, bos_token_id=1, eos_token_id=EOT)
    model = transformers.MistralForCausalLM(cfg)
    hf_reference.init_weights(model, 0.08)
    model.save_pretrained(dir_, safe_serialization=True)


def make_llama(dir_):
    torch.manual_seed(6)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=128, tie_word_embeddings=False, rope_theta=10000.0,
        bos_token_id=1, eos_token_id=EOT)
    model = transformers.LlamaForCausalLM(cfg)
    hf_reference.init_weights(model, 0.08)
    model.save_pretrained(dir_, safe_serialization=True)


def make_gpt2(dir_):
    torch.manual_seed(7)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  activation_function="gelu_new", bos_token_id=EOT,
                                  eos_token_id=EOT)
    model = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.save_pretrained(dir_, safe_serialization=True)


def document_ids(x):
    """Per token, the index of its document: the end-of-text token ends the document it is in."""
    ends = (x == EOT).long()
    return torch.cumsum(ends, dim=1) - ends


def document_loss(model, batch):
    """Block-diagonal causal attention and positions restarting per document (4D mask)."""
    x = torch.tensor(batch[:, :-1])
    y = torch.tensor(batch[:, 1:])
    doc = document_ids(x)
    T = x.shape[1]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = causal[None] & (doc[:, :, None] == doc[:, None, :])
    mask = torch.zeros(allowed.shape, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    first = torch.zeros_like(doc)  # each document's first position in the window
    for b in range(x.shape[0]):
        for t in range(1, T):
            first[b, t] = first[b, t - 1] if doc[b, t] == doc[b, t - 1] else t
    position_ids = torch.arange(T)[None] - first
    logits = model(input_ids=x, attention_mask=mask[:, None], position_ids=position_ids).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


def document_loss_split(model, batch):
    """The same loss with every document run through the model on its own."""
    total, count = 0.0, 0
    for row in batch:
        x, y = row[:-1], row[1:]
        start = 0
        for t in range(len(x)):
            if x[t] == EOT or t == len(x) - 1:
                seg = torch.tensor(x[start:t + 1])[None]
                logits = model(input_ids=seg).logits[0]
                total += F.cross_entropy(logits.float(), torch.tensor(y[start:t + 1]),
                                         reduction="sum").item()
                count += t + 1 - start
                start = t + 1
    return total / count


def check_document_loss(model, batch):
    """The 4D mask gives the loss of running every document on its own."""
    with torch.no_grad():
        a, b = document_loss(model, batch).item(), document_loss_split(model, batch)
    assert abs(a - b) <= 1e-6 * abs(b), f"4D mask {a} != documents one by one {b}"


def train_losses(dir_, args, loss_fn):
    """hf_reference.train_losses with another loss (its windows, schedule and AdamW)."""
    check = check_document_loss if loss_fn is document_loss else None
    return hf_reference.train_losses(dir_, args, loss_fn, check)


def prepare(args):
    out = args.out
    make_mistral(os.path.join(out, "mistral"))
    make_llama(os.path.join(out, "llama-doc"))
    make_gpt2(os.path.join(out, "gpt2-doc"))
    rng = np.random.default_rng(8)
    ids = rng.integers(3, 300, size=4000)
    ids[rng.random(4000) < 0.12] = EOT  # documents of about 8 tokens, some windows start in one
    data = os.path.join(out, "data.bin")
    hf_reference.write_tokens(data, ids)
    args.tokens = data
    result = {
        "mistral": train_losses(os.path.join(out, "mistral"), args, hf_reference.batch_loss),
        "llama-doc": train_losses(os.path.join(out, "llama-doc"), args, document_loss),
        "gpt2-doc": train_losses(os.path.join(out, "gpt2-doc"), args, document_loss),
        # The same models without document masking: the masks must change the loss.
        "llama-causal": train_losses(os.path.join(out, "llama-doc"),
                                     argparse.Namespace(**{**vars(args), "steps": 1}),
                                     hf_reference.batch_loss),
    }
    json.dump(result, sys.stdout)
    print()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    hf_reference.add_train_args(p, steps=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    prepare(args)


if __name__ == "__main__":
    main()
