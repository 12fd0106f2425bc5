#!/usr/bin/env python3
"""The `tokenizers` side of bench/tokenize (run with the model venv's python).

    tokenize_hf.py train OUT_DIR DOCS_JSON      trains gpt2/ and llama3/ byte-level BPE tokenizers
    tokenize_hf.py measure TOKENIZER_JSON DOCS_JSON ITERS
                                                 one JSON line: best seconds of encode_batch over
                                                 the documents, the id count and their hash

Threads: `tokenizers` runs encode_batch on its Rayon pool; the caller sets RAYON_NUM_THREADS
(1 for one core). The tokenizer object is reused between iterations (its word cache warm).
"""
import json
import os
import sys
import time

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(out_dir, docs):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    pres = {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "llama3": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }
    for name, pre in pres.items():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(docs, trainer=trainer)
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        tok.save(os.path.join(out_dir, name, "tokenizer.json"))


def ids_hash(batches):
    """sum of id_i · 1000003^i mod 2^64 over all ids in order (bench/tokenize computes the same)."""
    import numpy as np
    ids = np.concatenate([np.asarray(e.ids, dtype=np.uint64) for e in batches] or
                         [np.zeros(0, np.uint64)])
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(ids), 1000003, dtype=np.uint64)) if len(ids) else ids
        powers = np.concatenate([np.ones(1, np.uint64), powers[:-1]]) if len(ids) else ids
        return int(np.sum(ids * powers, dtype=np.uint64)), int(len(ids))


def measure(tokenizer_json, docs, iters):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    best = float("inf")
    out = None
    for _ in range(iters):
        start = time.perf_counter()
        out = tok.encode_batch(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - start)
    h, n = ids_hash(out)
    print(json.dumps({"seconds": best, "tokens": n, "hash": str(h)}))


def main():
    cmd = sys.argv[1]
    if cmd == "train":
        train(sys.argv[2], json.load(open(sys.argv[3], encoding="utf-8")))
    elif cmd == "measure":
        measure(sys.argv[2], json.load(open(sys.argv[3], encoding="utf-8")), int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
