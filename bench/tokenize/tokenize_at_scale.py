#!/usr/bin/env python3
"""`meshrun tokenize` at scale (issue #34): a JSONL corpus of --mb megabytes generated at bench
time (fortunes documents and random words; never committed), tokenized into shards by
`meshrun tokenize` on one core (--threads 1) and on all cores, beside the `tokenizers` library's
encode_batch on all cores (its Rayon pool) over the same records, ids compared token by token
(every record unless --library-mb), and on one core (RAYON_NUM_THREADS=1, a child process) over
the first --library-1-mb MB;
then a run killed with SIGKILL mid-way and run again, its files compared byte for byte with the
uninterrupted run's. Prints a table and one JSON line. Run with the model venv's python:

    build/model-venv/bin/python bench/tokenize/tokenize_at_scale.py --meshrun build/bin/meshrun \
        [--mb 1024] [--work DIR] [--keep] [--library-mb M] [--library-1-mb M]
"""
import argparse
import filecmp
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenize_hf  # noqa: E402

FORTUNES = "/usr/share/games/fortunes"


def fortune_docs():
    docs = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if os.path.islink(path) or not os.path.isfile(path) or "." in name:
            continue
        try:
            docs += [d for d in open(path, encoding="utf-8").read().split("\n%\n") if d.strip()]
        except UnicodeDecodeError:
            continue
    return docs


# Words of other scripts (Greek, Cyrillic, CJK, Arabic, Hebrew, Devanagari, Thai, accented
# Latin, emoji) mixed into some records, so multi-byte UTF-8 and \uXXXX escapes are tokenized too.
MULTILINGUAL = ("καλημέρα κόσμε λόγος θάλασσα здравствуй мир данные обучение 数据 训练 模型 "
                "東京 こんにちは 世界 トークン 한국어 데이터 مرحبا بالعالم بيانات שלום עולם "
                "नमस्ते दुनिया ภาษาไทย Grüße Straße naïve café año señor ødegaard "
                "🙂 🚀 ✓ €100 ½").split()


def make_corpus(path, mb, docs):
    """~mb MB of JSONL: records drawn from a pool of the fortunes and 50,000 runs of random words
    from them, one in five with words of other scripts mixed in (drawn, so generating a gigabyte
    takes seconds, not an hour). JSON escapes non-ASCII every other record (ensure_ascii)."""
    rng = random.Random(34)
    words = " ".join(docs).split()
    mixed = words + MULTILINGUAL * max(1, len(words) // (4 * len(MULTILINGUAL)))
    pool = [json.dumps({"text": d, "source": "fortunes"}) + "\n" for d in docs]
    for i in range(50000):
        multilingual = i % 5 == 0
        text = " ".join(rng.choices(mixed if multilingual else words,
                                    k=rng.randint(20, 600)))
        text = text.replace(". ", ".\n", rng.randint(0, 3))
        pool.append(json.dumps({"text": text, "source": "words"}, ensure_ascii=i % 2 == 0)
                    + "\n")
    target = mb * 1000000
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            batch = "".join(rng.choices(pool, k=1000))
            f.write(batch)
            written += len(batch.encode())
    return written


def shard_ids(folder):
    for p in sorted(glob.glob(os.path.join(folder, "*.bin"))):
        raw = np.memmap(p, dtype=np.uint8, mode="r")
        header = raw[:1024].view("<i4")
        dtype = "<u2" if header[1] == 1 else "<u4"
        yield raw[1024:].view(dtype)


def tokenize(meshrun, tok_dir, corpus, out, threads):
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    r = subprocess.run([meshrun, "tokenize", "--tokenizer", tok_dir, corpus, "-o", out,
                        "--shard-tokens", "16777216", "--threads", str(threads), "-q"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return time.perf_counter() - start


def library(tok_json, corpus, eot, meshrun_out, limit_bytes):
    """encode_batch over batches of records (those in the first limit_bytes of the corpus);
    compares with meshrun's shards as it goes (their prefix, when limited)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_json)
    stream = shard_ids(meshrun_out)
    pending = np.zeros(0, np.uint32)
    seconds = 0.0
    tokens = 0
    equal = True
    first = True

    def compare(ids):
        nonlocal pending, equal
        ids = np.asarray(ids, dtype=np.uint32)
        while len(pending) < len(ids):
            nxt = next(stream, None)
            if nxt is None:
                break
            pending = np.concatenate([pending, np.asarray(nxt, dtype=np.uint32)])
        if len(pending) < len(ids) or not np.array_equal(pending[:len(ids)], ids):
            equal = False
        pending = pending[len(ids):]

    read = 0
    with open(corpus, encoding="utf-8") as f:
        while read < limit_bytes:
            lines = [line for _, line in zip(range(20000), f)]
            if not lines:
                break
            read += sum(len(line.encode()) for line in lines)
            batch = [json.loads(line)["text"] for line in lines]
            start = time.perf_counter()
            enc = tok.encode_batch(batch, add_special_tokens=False)
            seconds += time.perf_counter() - start
            for e in enc:
                ids = e.ids if first else [eot] + e.ids
                first = False
                tokens += len(ids)
                compare(ids)
    if read >= os.path.getsize(corpus) and (len(pending) or next(stream, None) is not None):
        equal = False
    return seconds, tokens, equal, read


def library_one_thread(tok_json, corpus, eot, meshrun_out, limit_bytes):
    """library() in a child process whose Rayon pool has one thread (RAYON_NUM_THREADS is read
    when the library starts, so it cannot be changed in this process)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import tokenize_at_scale as t; "
            "print(json.dumps(t.library(*json.loads(sys.argv[2]))))")
    args = json.dumps([tok_json, corpus, eot, meshrun_out, limit_bytes])
    r = subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__)),
                        args], env=dict(os.environ, RAYON_NUM_THREADS="1"), capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--meshrun", required=True)
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--work", default="/tmp/meshrun-bench-tokenize")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--library-mb", type=int, default=0,
                   help="run the library on the first M MB of records only (0: all)")
    p.add_argument("--library-1-mb", type=int, default=100,
                   help="run the library on one core over the first M MB of records (0: skip)")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    docs = fortune_docs()
    tok_dir = os.path.join(a.work, "tok")
    if not os.path.exists(os.path.join(tok_dir, "gpt2", "tokenizer.json")):
        tokenize_hf.train(tok_dir, docs)
    tok_dir = os.path.join(tok_dir, "gpt2")
    corpus = os.path.join(a.work, "corpus.jsonl")
    if not os.path.exists(corpus) or os.path.getsize(corpus) < a.mb * 1000000:
        make_corpus(corpus, a.mb, docs)
    size = os.path.getsize(corpus)
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]

    t1 = tokenize(a.meshrun, tok_dir, corpus, os.path.join(a.work, "one"), 1)
    shutil.rmtree(os.path.join(a.work, "one"), ignore_errors=True)
    print(f"(meshrun --threads 1: {t1:.1f} s)", file=sys.stderr, flush=True)
    tall = tokenize(a.meshrun, tok_dir, corpus, os.path.join(a.work, "all"), 0)
    print(f"(meshrun all cores: {tall:.1f} s)", file=sys.stderr, flush=True)
    eot = json.load(open(os.path.join(tok_dir, "tokenizer.json")))["added_tokens"][0]["id"]
    lib_s, lib_tokens, equal, lib_bytes = library(
        os.path.join(tok_dir, "tokenizer.json"), corpus, eot, os.path.join(a.work, "all"),
        a.library_mb * 1000000 if a.library_mb else os.path.getsize(corpus))

    print(f"(tokenizers: {lib_s:.1f} s, ids equal {equal})", file=sys.stderr, flush=True)
    lib1_s, lib1_tokens, equal1, lib1_bytes = 0.0, 0, True, 0
    if a.library_1_mb:
        lib1_s, lib1_tokens, equal1, lib1_bytes = library_one_thread(
            os.path.join(tok_dir, "tokenizer.json"), corpus, eot, os.path.join(a.work, "all"),
            a.library_1_mb * 1000000)
        equal = equal and equal1
        print(f"(tokenizers, 1 thread: {lib1_s:.1f} s, ids equal {equal1})", file=sys.stderr,
              flush=True)
    # Kill -9 mid-way (after the first shard, at a random point of the run), run again.
    out = os.path.join(a.work, "resumed")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [a.meshrun, "tokenize", "--tokenizer", tok_dir, corpus, "-o", out, "--shard-tokens",
           "16777216", "--threads", "0", "-q"]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    while not glob.glob(os.path.join(out, "*.bin")) and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(random.uniform(0.2, 0.6) * tall)
    killed_mid_way = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    shards_before = len(glob.glob(os.path.join(out, "*.bin")))
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    rerun = time.perf_counter() - start
    # The output: the shards and the manifest. `.meshrun.lock` (the folder's lock, which names the
    # process that held it: its pid and start time) differs between any two runs by design.
    def outputs(folder):
        return sorted(n for n in os.listdir(folder) if not n.startswith("."))

    names = outputs(os.path.join(a.work, "all"))
    same = r.returncode == 0 and names == outputs(out) and all(
        filecmp.cmp(os.path.join(a.work, "all", n), os.path.join(out, n), shallow=False)
        for n in names)

    manifest = json.load(open(os.path.join(a.work, "all", "manifest.json")))
    tokens = manifest["tokens"]
    mb = size / 1e6
    rows = [("meshrun tokenize", 1, t1, mb), ("meshrun tokenize", cores, tall, mb),
            ("tokenizers encode_batch", cores, lib_s, lib_bytes / 1e6)]
    if a.library_1_mb:
        rows.insert(2, ("tokenizers encode_batch", 1, lib1_s, lib1_bytes / 1e6))
    print(f"corpus: {mb:.0f} MB JSONL, {tokens:,} tokens, {len(manifest['shards'])} shards; "
          f"{cores} cores, load average {load:.1f} at the start")
    print(f"{'engine':<24} {'threads':>7} {'MB':>7} {'seconds':>8} {'MB/s':>7} {'MB/s/core':>9}")
    for name, th, s, m in rows:
        print(f"{name:<24} {th:>7} {m:>7.0f} {s:>8.1f} {m / s:>7.2f} {m / s / th:>9.2f}")
    print(f"ids equal to the library's: {equal} ({lib_tokens:,} ids of the library over "
          f"{lib_bytes / 1e6:.0f} MB of records; meshrun {tokens:,} over all)")
    print(f"killed mid-way: {killed_mid_way} with {shards_before} shards written; rerun "
          f"{rerun:.1f} s; same files byte for byte: {same}")
    print(json.dumps({"bench": "tokenize_at_scale", "corpus_mb": round(mb, 1), "tokens": tokens,
                      "cores": cores, "load_average": round(load, 1),
                      "meshrun_1_thread_s": round(t1, 2), "meshrun_all_s": round(tall, 2),
                      "tokenizers_all_s": round(lib_s, 2),
                      "tokenizers_mb": round(lib_bytes / 1e6, 1),
                      "tokenizers_1_thread_s": round(lib1_s, 2),
                      "tokenizers_1_thread_mb": round(lib1_bytes / 1e6, 1), "ids_equal": equal,
                      "killed_mid_way": killed_mid_way, "shards_before_kill": shards_before,
                      "rerun_s": round(rerun, 2), "resumed_same": same,
                      "load_average_end": round(os.getloadavg()[0], 1)}))
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)
    sys.exit(0 if equal and same else 1)


if __name__ == "__main__":
    main()
