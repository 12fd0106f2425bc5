#!/usr/bin/env python3
"""Source models for tests/integration/hf_export_test.cc and the checks of their exports.

Run with the tests' model venv (tests/python/requirements-models.txt):

  hf_export_check.py prepare OUT        OUT/llama3: a tiny LlamaForCausalLM in bfloat16 shaped
                                        like Llama 3's folder (bos 1, end-of-text 0 in
                                        config.json, eos [0, 5] in generation_config.json, no
                                        pad); OUT/mistral: a tiny MistralForCausalLM in float16
                                        (bos 1, eos 2, pad 0); OUT/data.bin: random token ids
  hf_export_check.py check SRC OUT --dtype D
                                        OUT (a `meshrun export` of a model trained from SRC)
                                        loads in transformers with SRC's model_type,
                                        architecture, special token ids and generation config,
                                        its weights in D; and generate stops at SRC's eos
Prints what it compared; exits 1 with the first difference.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import transformers

VOCAB = 320


def write_tokens(path, ids):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(np.asarray(ids, dtype=np.uint16).tobytes())


def prepare(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=False)
    llama = transformers.LlamaConfig(bos_token_id=1, eos_token_id=0, pad_token_id=None,
                                     rope_theta=500000.0, **common)
    model = transformers.LlamaForCausalLM(llama).to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=1, eos_token_id=[0, 5], do_sample=True, temperature=0.6, top_p=0.9)
    model.save_pretrained(os.path.join(out, "llama3"))
    mistral = transformers.MistralConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                         sliding_window=None, **common)
    transformers.MistralForCausalLM(mistral).to(torch.float16).save_pretrained(
        os.path.join(out, "mistral"))
    rng = np.random.default_rng(0)
    write_tokens(os.path.join(out, "data.bin"), rng.integers(0, VOCAB, size=4096))
    print(json.dumps({"made": ["llama3", "mistral", "data.bin"]}))


def fail(what):
    print("FAIL: " + what)
    sys.exit(1)


def expect(what, got, want):
    print(f"{what}: {got!r} (source {want!r})")
    if got != want:
        fail(f"{what} is {got!r}, the source's is {want!r}")


def check(src, out, dtype):
    source = transformers.AutoConfig.from_pretrained(src)
    exported = transformers.AutoConfig.from_pretrained(out)
    expect("model_type", exported.model_type, source.model_type)
    expect("architectures", exported.architectures, source.architectures)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"):
        expect("config " + key, getattr(exported, key, None), getattr(source, key, None))
    source_gen = transformers.GenerationConfig.from_pretrained(src)
    gen = transformers.GenerationConfig.from_pretrained(out)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "do_sample", "temperature",
                "top_p"):
        expect("generation_config " + key, getattr(gen, key, None),
               getattr(source_gen, key, None))
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    expect("class", type(model).__name__, source.architectures[0])
    weights = {p.dtype for p in model.parameters()}
    expect("weights' dtype", weights, {getattr(torch, dtype)})
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    expect("config dtype", written.get("dtype", written.get("torch_dtype")), dtype)

    # Generate stops at the source's end of text: force it as the third new token (greedy,
    # 10 new tokens at most); the output ends there, and only there.
    eos = source_gen.eos_token_id
    first_eos = eos[0] if isinstance(eos, list) else eos

    class ForceAt(transformers.LogitsProcessor):
        def __init__(self, start, token):
            self.start, self.token = start, token

        def __call__(self, input_ids, scores):
            if input_ids.shape[1] == self.start + 2:
                scores[:, :] = -float("inf")
                scores[:, self.token] = 0
            else:
                scores[:, list(eos) if isinstance(eos, list) else [eos]] = -float("inf")
            return scores

    prompt = torch.tensor([[7, 8, 9]])
    model = model.float()
    tokens = model.generate(prompt, max_new_tokens=10, do_sample=False,
                            logits_processor=[ForceAt(prompt.shape[1], first_eos)])
    new = tokens[0, prompt.shape[1]:].tolist()
    print(f"generate: {new}")
    if len(new) != 3 or new[-1] != first_eos:
        fail(f"generate did not stop at the forced end of text {first_eos}: {new}")
    print("OK")


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out")
    c = sub.add_parser("check")
    c.add_argument("src")
    c.add_argument("out")
    c.add_argument("--dtype", required=True)
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    if args.cmd == "prepare":
        prepare(args.out)
    else:
        check(args.src, args.out, args.dtype)


if __name__ == "__main__":
    main()
