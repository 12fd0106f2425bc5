#!/usr/bin/env python3
"""A documentation test of docs/data.md's order of windows.

This file implements "Windows and order", "The shuffled order, exactly" and "Mixtures" of
docs/data.md from their text alone (nothing here is taken from the C++), reproduces the token
ids of the global batch of a step (shuffled and sequential, one source and a 0.7/0.3 mixture of
a nanoGPT file and llm.c shards, one rank and four dp ranks), and compares them with what the
engine's sampler fills (data_order_dump, the MixtureSampler the trainer reads through).

It fails when the code changes the order (the ids differ) and when the documented order changes
(the docs' section is pinned by DOC_SHA256: whoever edits the section re-reads this file against
the new text, fixes it, and updates the hash; the failure message says so).

    data_order_doc_test.py --dump BUILD/tests/data_order_dump --source SRC [--venv BUILD/model-venv]
                           [--work DIR]

Runs with the test venv's python when --venv names one (the code needs only the standard library).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

# The sha-256 of the rules this file implements, as docs/data.md words them (doc_section): the
# slot rule of "Windows and order", "The shuffled order, exactly" and the schedule of "Mixtures",
# whitespace runs folded to one space. The rest of data.md may change freely.
DOC_SHA256 = "489bd38bd27e2690a86254aa5bdb33e8842c7b47ece18bfbbe52c5962128251f"

MASK64 = (1 << 64) - 1


# --- docs/data.md, "The shuffled order, exactly" -------------------------------------------

def mix(z):
    """Step 1: splitmix64's output function."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def epoch_permutation_at(n_w, seed, epoch, i):
    """pi_e(i) for i in [0, n_w), seed S = train.seed (+ j for source j) mod 2^64."""
    s = seed & MASK64
    key = mix(s) ^ mix((epoch + 0x632BE59BD9B4E019) & MASK64)  # step 2
    round_keys = [mix((key + (r + 1) * 0x9E3779B97F4A7C15) & MASK64) for r in range(6)]  # step 3
    h = 1  # step 4
    while 4 ** h < n_w:
        h += 1
    m = (1 << h) - 1

    def cipher(x):  # step 5
        left, right = x >> h, x & m
        for k in round_keys:
            left, right = right, left ^ (mix(right ^ k) & m)
        return (left << h) | right

    y = cipher(i)  # step 6
    while y >= n_w:
        y = cipher(y)
    return y


# --- "Windows and order" -------------------------------------------------------------------

def window_of_counter(n_w, seed, order, c):
    """The window a one-source run reads at its slot (or a source's counter) c."""
    if order == "sequential":
        return c % n_w
    return epoch_permutation_at(n_w, seed, c // n_w, c % n_w)


# --- "Mixtures" ----------------------------------------------------------------------------

def quotas(weights):
    total = 0.0
    for w in weights:
        total += w
    return [int((2 ** 30 * w / total) + 0.5) for w in weights]  # round half away from zero (> 0)


def mixture_slots(weights, upto):
    """For each slot s < upto: (source j, its count c_j before s)."""
    q = quotas(weights)
    big_q = sum(q)
    errors = [0] * len(q)
    counts = [0] * len(q)
    out = []
    for _ in range(upto):
        best = 0
        for j in range(len(q)):
            errors[j] += q[j]
        for j in range(len(q)):
            if errors[j] > errors[best]:
                best = j
        out.append((best, counts[best]))
        errors[best] -= big_q
        counts[best] += 1
    return out


def global_batch(streams, weights, seq_len, batch, seed, order, step):
    """[(source, window, inputs, targets)] of the global batch of `step`."""
    first = step * batch
    if len(streams) == 1:
        slots = [(0, s) for s in range(first, first + batch)]
    else:
        slots = mixture_slots(weights, first + batch)[first:]
    out = []
    for j, c in slots:
        tokens = streams[j]
        n_w = (len(tokens) - 1) // seq_len
        w = window_of_counter(n_w, seed + j, order, c)
        begin = w * seq_len
        out.append((j, w, tokens[begin:begin + seq_len], tokens[begin + 1:begin + 1 + seq_len]))
    return out


# --- data and the comparison ---------------------------------------------------------------

def lcg_ids(n, state, vocab):
    ids = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
        ids.append((state >> 33) % vocab)
    return ids


def write_nanogpt(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<%dH" % len(ids), *ids))


def write_llmc_shards(folder, ids, cuts):
    os.makedirs(folder, exist_ok=True)
    for k in range(len(cuts) - 1):
        part = ids[cuts[k]:cuts[k + 1]]
        header = [20240520, 1, len(part)] + [0] * 253
        with open(os.path.join(folder, "shard_%06d.bin" % k), "wb") as f:
            f.write(struct.pack("<256i", *header))
            f.write(struct.pack("<%dH" % len(part), *part))


# (first words, the words after the last) of each piece of docs/data.md this file implements.
DOC_PIECES = [
    ("The global batch of step k (0-based", "The batch depends only on"),
    ("### The shuffled order, exactly", "A checkpoint records the rule"),
    ("Which source slot s (= k·B + i", "To reproduce sequence i of step k"),
]


def doc_section(source):
    with open(os.path.join(source, "docs", "data.md"), encoding="utf-8") as f:
        text = f.read()
    pieces = []
    for first, after in DOC_PIECES:
        start = text.find(first)
        end = text.find(after, start)
        if start < 0 or end < 0:
            return "(missing: a piece from %r to %r)" % (first, after)
        pieces.append(" ".join(text[start:end].split()))
    return "\n".join(pieces)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--venv", default="")
    ap.add_argument("--work", default="")
    ap.add_argument("--print-doc-hash", action="store_true")
    args = ap.parse_args()
    venv_python = os.path.join(args.venv, "bin", "python") if args.venv else ""
    if venv_python and os.path.exists(venv_python) and os.environ.get("DATA_ORDER_IN_VENV") != "1":
        os.environ["DATA_ORDER_IN_VENV"] = "1"
        os.execv(venv_python, [venv_python] + sys.argv)

    failures = []
    digest = hashlib.sha256(doc_section(args.source).encode("utf-8")).hexdigest()
    if args.print_doc_hash:
        print(digest)
        return 0
    if digest != DOC_SHA256:
        failures.append(
            "docs/data.md's order (the pieces of DOC_PIECES) changed (sha-256 %s, this test was "
            "written from %s): re-read it, make this file implement the new text, then set "
            "DOC_SHA256 (--print-doc-hash)" % (digest, DOC_SHA256))

    work = args.work or tempfile.mkdtemp(prefix="data_order_doc_")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # Source 0: 5,203 ids in a nanoGPT file (N_w = 325 at T = 16); source 1: 337 ids in three
    # unequal llm.c shards (N_w = 21), so windows cross shard boundaries and source 1 wraps
    # round through several of its epochs.
    web = lcg_ids(5203, 1, 50257)
    code = lcg_ids(337, 2, 50257)
    write_nanogpt(os.path.join(work, "web.bin"), web)
    write_llmc_shards(os.path.join(work, "code"), code, [0, 100, 101, 337])
    web_path = os.path.join(work, "web.bin")
    code_glob = os.path.join(work, "code", "shard_*.bin")

    # (sources as (path, weight), streams, seed, order, step, dp ranks); step 40 of one source
    # straddles epochs 0 and 1 (slots 320–327 with N_w = 325).
    cases = [
        ([(web_path, None)], [web], 1337, "shuffled", 40, 1),
        ([(web_path, None)], [web], 1337, "shuffled", 40, 4),
        ([(web_path, None)], [web], 2 ** 64 - 5, "shuffled", 123, 2),
        ([(web_path, 0.7), (code_glob, 0.3)], [web, code], 7, "shuffled", 25, 1),
        ([(web_path, 0.7), (code_glob, 0.3)], [web, code], 7, "shuffled", 25, 4),
        ([(web_path, 0.7), (code_glob, 0.3)], [web, code], 7, "sequential", 25, 2),
    ]
    seq_len, batch = 16, 8
    for sources, streams, seed, order, step, dp in cases:
        name = "%s seed %d step %d over %d source(s) on %d dp rank(s)" % (
            order, seed, step, len(sources), dp)
        cmd = [args.dump, "--seq-len", str(seq_len), "--batch", str(batch), "--seed",
               str(seed), "--order", order, "--step", str(step), "--dp", str(dp),
               "--format", "auto"]
        cmd += [p if w is None else "%s=%s" % (p, w) for p, w in sources]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            failures.append("%s: data_order_dump exit %d: %s" % (name, run.returncode, run.stderr))
            continue
        engine = json.loads(run.stdout)
        weights = [1.0 if w is None else w for _, w in sources]
        expect = global_batch(streams, weights, seq_len, batch, seed, order, step)
        for i, (j, w, inputs, targets) in enumerate(expect):
            got = (engine["windows"][i], engine["inputs"][i], engine["targets"][i])
            if got != ([j, w], inputs, targets):
                failures.append("%s, sequence %d: docs/data.md gives source %d window %d "
                                "(inputs %s…), the engine source %d window %d (inputs %s…)" % (
                                    name, i, j, w, inputs[:4], got[0][0], got[0][1], got[1][:4]))
        if not failures:
            print("ok: %s: windows %s" % (name, [tuple(x) for x in engine["windows"]]))
    # The example in the docs' text.
    example = [epoch_permutation_at(10, 1337, 0, i) for i in range(10)]
    if ", ".join(map(str, example)) not in doc_section(args.source):
        failures.append("docs/data.md's example (S = 1337, N_w = 10, epoch 0) is not %s" % example)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
