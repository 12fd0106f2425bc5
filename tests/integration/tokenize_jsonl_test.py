#!/usr/bin/env python3
"""`meshrun tokenize` at scale against the `tokenizers` library (docs/data.md "Making token files").

    tokenize_jsonl_test.py --meshrun BIN --source DIR --venv VENV --work DIR

For tokenizers trained at test time (GPT-2's ByteLevel regex, with and without a prefix space, and
Llama 3's Split regex + ByteLevel; tests/integration/tokenizer_test.py), the shards written from
a JSONL corpus (the fortunes cut into documents, generated multilingual lines and the hard cases
of tokenizer_test.py, over three files, records with other fields, empty texts and blank lines)
join to the library's ids of every non-empty record with the end-of-text token between them; the
fortunes as one text file, cut into small chunks, give the library's ids of the whole file.
Exits 77 (skipped) when the virtual environment cannot be made or the fortunes are missing.
"""
import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_test as tt  # noqa: E402


def shards(folder):
    ids = []
    for p in sorted(glob.glob(os.path.join(folder, "*.bin"))):
        ids.extend(tt.read_bin(p))
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["complete"] and manifest["tokens"] == len(ids), manifest["tokens"]
    return ids


def check(name, got, want):
    if got != want:
        i = tt.first_difference(got, want)
        raise AssertionError(f"{name}: {len(got)} vs {len(want)} ids, first difference at {i}: "
                             f"meshrun {got[i:i + 8]} vs tokenizers {want[i:i + 8]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshrun", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    if not os.path.isdir(tt.FORTUNES):
        tt.skip(f"{tt.FORTUNES} is missing (hint: scripts/setup installs the fortunes package)")
    python = os.path.join(a.venv, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(a.venv):
        make = subprocess.run([os.path.join(a.source, "tests/python/make-venv"), a.venv,
                               os.path.join(a.source, "tests/python/requirements-models.txt")],
                              capture_output=True, text=True)
        if make.returncode != 0:
            tt.skip("no Python environment: " + make.stderr.strip())
        os.execv(python, [python] + sys.argv)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    from tokenizers import Tokenizer
    folders = tt.train_tokenizers(a.work, tt.corpus(a.work))

    texts = tt.corpus(a.work)
    docs = [d for t in texts[:-1] for d in t.split("\n%\n")]
    docs += tt.multilingual_lines(random.Random(3), 500) + tt.held_out()
    rng = random.Random(4)
    rng.shuffle(docs)
    jsonl = os.path.join(a.work, "jsonl")
    os.makedirs(jsonl)
    records = []
    files = [open(os.path.join(jsonl, f"part{k}.jsonl"), "w", encoding="utf-8") for k in range(3)]
    for i, d in enumerate(docs):
        text = "" if i % 97 == 13 else d
        f = files[i * 3 // len(docs)]
        f.write(json.dumps({"id": i, "text": text, "lang": "x"}, ensure_ascii=i % 2 == 0) + "\n")
        if i % 50 == 0:
            f.write("\n")
        if text:
            records.append(text)
    for f in files:
        f.close()
    whole = os.path.join(a.work, "fortunes.txt")
    with open(whole, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(texts[:-1]))
    whole_text = open(whole, encoding="utf-8", newline="").read()

    for name, folder in folders.items():
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        eot = tok.token_to_id("<|endoftext|>" if name.startswith("gpt2") else "<|end_of_text|>")
        want = tt.expected_ids(tok, records, eot)
        for threads, chunk in ((1, 1 << 20), (2, 3000)):
            out = os.path.join(a.work, f"out-{name}-{threads}")
            r = tt.run([a.meshrun, "tokenize", "--tokenizer", folder, jsonl, "-o", out,
                        "--shard-tokens", "4099", "--threads", str(threads), "--chunk-bytes",
                        str(chunk)])
            check(f"{name} jsonl threads {threads}", shards(out), want)
        print(f"{name}: {len(records)} JSONL records, {len(want)} ids equal "
              f"({r.stderr.strip().splitlines()[-1]})")
        out = os.path.join(a.work, f"whole-{name}")
        tt.run([a.meshrun, "tokenize", "--tokenizer", folder, whole, "-o", out, "--shard-tokens",
                "10007", "--threads", "2", "--chunk-bytes", "500"])
        want = tok.encode(whole_text, add_special_tokens=False).ids
        check(f"{name} one text file in chunks", shards(out), want)
        print(f"{name}: one {len(whole_text.encode())}-byte text file in 500-byte chunks, "
              f"{len(want)} ids equal")
    shutil.rmtree(a.work, ignore_errors=True)
    print("PASSED")


if __name__ == "__main__":
    main()
