#!/usr/bin/env python3
"""meshrun's Hugging Face tokenizers against the `tokenizers` library (docs/data.md "Tokenizers").

    tokenizer_test.py CASE --meshrun BIN --source DIR --venv VENV --work DIR

CASE is one of:
  parity    `meshrun tokenize` gives the library's ids for tokenizers it trains at test time (the
            GPT-2 ByteLevel regex, with and without a prefix space, and a Llama 3 Split regex +
            ByteLevel(use_regex=False)) on held-out text with non-ASCII, emoji, CRLF, tabs,
            runs of spaces and special tokens inside the text.
  train     training on a text folder with data.tokenizer gives the losses of training on the
            token file `meshrun tokenize` wrote; the cache is reused, and rebuilt when the text
            or the tokenizer changes; vocabulary mismatches are exit 2 naming both sizes.
  generate  `meshrun generate` from an exported model gives transformers' greedy continuation.
  padded    a Qwen2 folder with more embedding rows than tokenizer ids fine-tunes from text with
            data.tokenizer (validate and train note the padding once); a larger tokenizer is
            exit 2.
  spm       SentencePiece-style BPE files (Llama 2 Metaspace, Mistral normalizer Sequence,
            Gemma Replace; byte fallback, unk, with and without <s> added) give the library's
            ids on held-out text, and `meshrun generate` its decoded text.

The corpus: the Debian fortunes text plus generated multilingual lines. Exits 77 (skipped) when
the virtual environment cannot be made or the fortunes are not installed.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

FORTUNES = "/usr/share/games/fortunes"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SKIP = 77


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def run(cmd, expect=0, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if expect is not None and r.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)}: exit {r.returncode}, wanted {expect}\n"
                             f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}")
    return r


WORDS = {
    "fr": "été déjà garçon où être Noël forêt naïve cœur".split(),
    "de": "Größe Straße Übung schön Mädchen Fußball".split(),
    "ru": "привет мир спасибо книга хорошо жизнь".split(),
    "el": "γειά κόσμος ευχαριστώ θάλασσα".split(),
    "zh": "你好 世界 谢谢 学习 中文 北京".split(),
    "ja": "こんにちは ありがとう 東京 カタカナ".split(),
    "ar": "مرحبا عالم شكرا كتاب".split(),
    "hi": "नमस्ते दुनिया धन्यवाद".split(),
    "emoji": "🙂 🚀 👍🏽 🇫🇷 ❤️ 🤖".split(),
}


def multilingual_lines(rng, n):
    lines = []
    keys = sorted(WORDS)
    for _ in range(n):
        words = [rng.choice(WORDS[rng.choice(keys)]) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, len(words)), str(rng.randint(0, 1000000)))
        lines.append(" ".join(words))
    return lines


def corpus(work):
    """Training text: the fortunes files plus generated lines; returns the list of texts."""
    texts = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if os.path.islink(path) or not os.path.isfile(path) or "." in name:
            continue
        try:
            texts.append(open(path, encoding="utf-8").read())
        except UnicodeDecodeError:
            continue
    texts.append("\n".join(multilingual_lines(random.Random(1), 3000)))
    return texts


def held_out():
    """Held-out documents with the hard cases, plus generated lines of another seed."""
    rng = random.Random(2)
    docs = [
        "Hello world!  Don't panic; it's 42.\r\nWe'll see   you're   there\t\ttabs\t end.\r\n",
        "Ünïcödé façade — naïve café… «quotes» “curly” ‘single’ ½ ≠ ∞\n\n\n   trailing   \n",
        "emoji 🙂🙂 🚀🚀🚀 👍🏽👍🏽 family 👨‍👩‍👧 flag 🇯🇵 ❤️\u200d🔥 end",
        "special <|endoftext|> inside<|endoftext|>and\n<|end_of_text|> and <|begin_of_text|>x",
        "numbers 1 12 123 1234 12345 3.14159 1,000,000 2024-05-20 0x1F\n",
        "CAPS I'LL WE'VE THEY'RE it'S 'quoted' \"double\" (paren) [bracket] {brace}\n",
        "    indented code:\n\tif (x) {\r\n\t\treturn y;  // comment\r\n\t}\n" + " " * 17 + "\n",
        "\n".join(multilingual_lines(rng, 200)),
        "mixed\u00a0nbsp\u3000ideographic\u2009thin space\u2028line sep\u0085nel end",
    ]
    return docs


def train_tokenizers(work, texts, only=None):
    """Trains byte-level BPE tokenizers with the library (three, or those named in `only`);
    returns {name: folder}."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    out = {}
    specs = {
        "gpt2": (pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                 ["<|endoftext|>"]),
        "gpt2_prefix": (pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                        ["<|endoftext|>"]),
        "llama3": (pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ["<|begin_of_text|>", "<|end_of_text|>"]),
    }
    for name, (pre, special) in specs.items():
        if only and name not in only:
            continue
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        if name == "gpt2":
            tok.add_tokens(["[[user]]"])  # an added token that is not special
        folder = os.path.join(work, "tok-" + name)
        os.makedirs(folder, exist_ok=True)
        tok.save(os.path.join(folder, "tokenizer.json"))
        out[name] = folder
    return out


def read_bin(path):
    import numpy as np
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520, header[:3]
    dtype = "<u2" if header[1] == 1 else "<u4"
    tokens = np.frombuffer(raw[1024:], dtype=dtype)
    assert len(tokens) == header[2], (len(tokens), header[2])
    return [int(t) for t in tokens]


def expected_ids(tok, texts, eot):
    ids = []
    for i, t in enumerate(texts):
        if i:
            ids.append(eot)
        ids.extend(tok.encode(t, add_special_tokens=False).ids)
    return ids


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def case_parity(a, work):
    from tokenizers import Tokenizer
    folders = train_tokenizers(work, corpus(work))
    docs = held_out()
    doc_dir = os.path.join(work, "held-out")
    os.makedirs(doc_dir, exist_ok=True)
    paths = []
    for i, d in enumerate(docs):
        p = os.path.join(doc_dir, f"doc{i:02d}.txt")
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(d + ("[[user]] hi" if i == 1 else ""))
        paths.append(p)
    texts = [open(p, encoding="utf-8", newline="").read() for p in paths]
    for name, folder in folders.items():
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        eot = tok.token_to_id("<|endoftext|>" if name.startswith("gpt2") else "<|end_of_text|>")
        # Each document alone, then the folder (end-of-text between files).
        for p, t in zip(paths, texts):
            out = os.path.join(work, "one.bin")
            run([a.meshrun, "tokenize", "--tokenizer", folder, p, "-o", out])
            got, want = read_bin(out), tok.encode(t, add_special_tokens=False).ids
            if got != want:
                i = first_difference(got, want)
                raise AssertionError(f"{name} {p}: ids differ at {i}: meshrun {got[i:i + 8]} vs "
                                     f"tokenizers {want[i:i + 8]} "
                                     f"({tok.decode(want[max(0, i - 3):i + 5])!r})")
        out = os.path.join(work, "all.bin")
        r = run([a.meshrun, "tokenize", "--tokenizer", folder, doc_dir, "-o", out])
        want = expected_ids(tok, texts, eot)
        assert read_bin(out) == want, f"{name}: folder ids differ"
        print(f"{name}: {len(want)} ids equal ({r.stderr.strip()})")
    # The fortunes themselves (held in: a bulk check of the threads), as a folder (its .dat
    # indexes and .u8 aliases skipped) and as the list of its text files.
    tok = Tokenizer.from_file(os.path.join(folders["llama3"], "tokenizer.json"))
    files = [os.path.join(FORTUNES, n) for n in sorted(os.listdir(FORTUNES)) if "." not in n
             and not os.path.islink(os.path.join(FORTUNES, n))]
    texts = [open(p, encoding="utf-8", newline="").read() for p in files]
    want = expected_ids(tok, texts, tok.token_to_id("<|end_of_text|>"))
    for inputs in ([FORTUNES], files):
        out = os.path.join(work, "fortunes.bin")
        run([a.meshrun, "tokenize", "--tokenizer", folders["llama3"], *inputs, "-o", out])
        got = read_bin(out)
        assert got == want, f"fortunes: {len(got)} vs {len(want)} ids, first difference at " \
                            f"{first_difference(got, want)}"
    print(f"fortunes (llama3): {len(want)} ids equal")


def spec_file(work, name, **over):
    spec = {
        "name": name,
        "model": {"arch": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32,
                  "vocab_size": over.get("vocab", 256)},
        "parallelism": {"dp_replicate_size": 1, "dp_shard_size": 1, "cp_size": 1, "tp_size": 1},
        "train": {"steps": over.get("steps", 3), "global_batch_size": 4, "micro_batch_size": 2,
                  "lr": over.get("lr", 1.0e-3), "min_lr": over.get("lr", 1.0e-3) / 10, "warmup_steps": 1},
        "data": {"train": over["train"], "format": "auto"},
        "checkpoint": {"dir": over.get("ckpt", ""), "every": 0, "resume": "never"},
    }
    if over.get("tokenizer"):
        spec["data"]["tokenizer"] = over["tokenizer"]
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(spec, f)  # JSON is YAML
    return path


def losses(r):
    return json.loads(r.stdout.strip().splitlines()[-1])["losses"]


def text_folder(work):
    d = os.path.join(work, "text")
    os.makedirs(d, exist_ok=True)
    docs = held_out()
    for i, doc in enumerate(docs[:6]):
        with open(os.path.join(d, f"t{i}.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(doc * 3)
    shutil.copy(os.path.join(FORTUNES, "science"), os.path.join(d, "t9-science.txt"))
    return d


def case_train(a, work):
    from tokenizers import Tokenizer
    folders = train_tokenizers(work, corpus(work), only=["gpt2"])
    gpt2 = folders["gpt2"]
    vocab = Tokenizer.from_file(os.path.join(gpt2, "tokenizer.json")).get_vocab_size()
    data = text_folder(work)
    ckpt = os.path.join(work, "ck-text")
    text_spec = spec_file(work, "text", train=data, tokenizer=gpt2, vocab=vocab, ckpt=ckpt)
    first = run([a.meshrun, "train", "-f", text_spec, "--nproc", "1", "-o", "json"])
    assert "tokenized into the cache" in first.stderr, first.stderr
    cache_dir = os.path.join(ckpt, "token-cache")
    caches = os.listdir(cache_dir)
    assert len(caches) == 1, caches
    cache = os.path.join(cache_dir, caches[0])
    mtime = os.stat(cache).st_mtime_ns

    # The same stream from `meshrun tokenize`: the same losses, bit for bit.
    tokens = os.path.join(work, "text.bin")
    run([a.meshrun, "tokenize", "--tokenizer", gpt2, data, "-o", tokens])
    assert read_bin(tokens) == read_bin(cache), "tokenize and the training cache differ"
    bin_spec = spec_file(work, "bin", train=tokens, vocab=vocab, ckpt=os.path.join(work, "ck-b"))
    from_bin = run([a.meshrun, "train", "-f", bin_spec, "--nproc", "1", "-o", "json"])
    assert losses(first) == losses(from_bin), (losses(first), losses(from_bin))
    print("losses equal:", losses(first))

    # Second run: the cache is read, not rewritten; two ranks read it too.
    again = run([a.meshrun, "train", "-f", text_spec, "--nproc", "2", "--set",
                 "parallelism.dp_shard_size=2", "-o", "json"])
    assert "read from the cache" in again.stderr, again.stderr
    assert os.stat(cache).st_mtime_ns == mtime
    assert losses(again) == losses(first) or all(
        abs(x - y) < 1e-4 * abs(y) for x, y in zip(losses(again), losses(first)))
    # Changed text: rebuilt under a new key.
    with open(os.path.join(data, "t0.txt"), "a", encoding="utf-8") as f:
        f.write("one more line\n")
    changed = run([a.meshrun, "train", "-f", text_spec, "--nproc", "1", "-o", "json"])
    assert "tokenized into the cache" in changed.stderr, changed.stderr
    assert len(os.listdir(cache_dir)) == 2
    # Changed tokenizer (same vocabulary size, other merges): rebuilt again.
    other = os.path.join(work, "tok-other")
    shutil.copytree(gpt2, other)
    j = json.load(open(os.path.join(other, "tokenizer.json")))
    j["model"]["merges"] = j["model"]["merges"][:-50]
    json.dump(j, open(os.path.join(other, "tokenizer.json"), "w"))
    other_spec = spec_file(work, "text", train=data, tokenizer=other, vocab=vocab, ckpt=ckpt)
    rebuilt = run([a.meshrun, "train", "-f", other_spec, "--nproc", "1", "-o", "json"])
    assert "tokenized into the cache" in rebuilt.stderr, rebuilt.stderr
    assert len(os.listdir(cache_dir)) == 3
    print("cache: reused, rebuilt on text and tokenizer changes")

    # Vocabulary mismatches: exit 2 naming both sizes, from validate, train and submit.
    cases = [
        (spec_file(work, "m1", train=data, vocab=50257), ["50257", "256"]),
        (spec_file(work, "m2", train=data, tokenizer=gpt2, vocab=vocab - 7),
         [str(vocab - 7), str(vocab)]),
        (spec_file(work, "m3", train=tokens, vocab=256), ["vocab_size(256)", "token id"]),
    ]
    for spec, sizes in cases:
        for cmd in (["validate", "-f", spec], ["train", "-f", spec, "--nproc", "1"],
                    ["submit", "-f", spec, "--coordinator", "127.0.0.1:1"]):
            r = run([a.meshrun] + cmd, expect=2)
            assert "error: model.vocab_size: " in r.stderr, r.stderr
            for s in sizes:
                assert s in r.stderr, (cmd, s, r.stderr)
    print("mismatches: exit 2 naming both sizes")


def case_generate(a, work):
    import torch
    from tokenizers import Tokenizer
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
    folders = train_tokenizers(work, corpus(work), only=["gpt2"])
    gpt2 = folders["gpt2"]
    vocab = Tokenizer.from_file(os.path.join(gpt2, "tokenizer.json")).get_vocab_size()
    with open(os.path.join(gpt2, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    data = text_folder(work)
    ckpt = os.path.join(work, "ck")
    # A seeded random model (lr 0; a briefly trained one continues with newlines only, whatever
    # the prompt), continuing three prompts: each continuation differs from the others.
    spec = spec_file(work, "gen", train=data, tokenizer=gpt2, vocab=vocab, ckpt=ckpt, steps=1,
                     lr=0.0)
    run([a.meshrun, "train", "-f", spec, "--nproc", "1", "-o", "json"])
    model_dir = os.path.join(work, "hf")
    run([a.meshrun, "export", ckpt, "-o", model_dir])
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(model_dir, f)), f"export did not copy {f}"
    new = 12

    def meshrun_ids(prompt, *flags):
        r = run([a.meshrun, "generate", *flags, "--prompt", prompt, "--max-new-tokens", str(new),
                 "-o", "json"])
        return json.loads(r.stdout)

    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = GPT2LMHeadModel.from_pretrained(model_dir).eval()
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    seen = set()
    for prompt in ["Hello world!  Don't panic; it's", "Ünïcödé café 🙂\r\n\tx", "<|endoftext|>12345"]:
        exported = meshrun_ids(prompt, "--model", model_dir)
        ids = tok(prompt, return_tensors="pt").input_ids
        assert exported["prompt_tokens"] == ids[0].tolist(), (exported["prompt_tokens"], ids)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 do_sample=False, pad_token_id=0)
        want = out[0, ids.shape[1]:].tolist()
        assert exported["tokens"] == want, (prompt, exported["tokens"], want)
        if not seen:  # the checkpoint's data.tokenizer, and an explicit --tokenizer: the same
            assert meshrun_ids(prompt, "--checkpoint", ckpt)["tokens"] == want
            assert meshrun_ids(prompt, "--model", model_dir, "--tokenizer", gpt2)["tokens"] == want
        decoded = raw.decode(want)
        if "\ufffd" not in decoded:  # whole characters: the texts agree too
            assert exported["text"] == decoded, (exported["text"], decoded)
        seen.update(want)
        print("generate:", repr(prompt), "->", want)
    assert len(seen) > 2, f"continuations {seen} too uniform to tell anything apart"


def case_padded(a, work):
    """A Qwen2 folder whose embedding (config.json vocab_size) is larger than its tokenizer (as
    every Qwen2/Qwen2.5 checkpoint: 151,936 rows for 151,665 ids) fine-tunes from text with
    data.tokenizer; validate and train say so once as a note. A tokenizer larger than the
    model stays exit 2 naming both sizes."""
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM
    gpt2 = train_tokenizers(work, corpus(work), only=["gpt2"])["gpt2"]
    vocab = Tokenizer.from_file(os.path.join(gpt2, "tokenizer.json")).get_vocab_size()
    padded = (vocab + 63) // 64 * 64 + 64  # ids vocab … padded-1 are padding
    data = text_folder(work)

    def qwen2(name, rows):
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=rows, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=64, tie_word_embeddings=False,
                          use_sliding_window=False)
        folder = os.path.join(work, name)
        Qwen2ForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
        shutil.copy(os.path.join(gpt2, "tokenizer.json"), folder)
        return folder

    def spec(name, model):
        path = os.path.join(work, name + ".yaml")
        with open(path, "w") as f:
            json.dump({"name": name, "model": {"init_from": model, "seq_len": 32},
                       "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2,
                                 "lr": 1.0e-3, "min_lr": 1.0e-4, "warmup_steps": 1},
                       "data": {"train": data, "tokenizer": model},
                       "checkpoint": {"dir": os.path.join(work, "ck-" + name),
                                      "resume": "never"}}, f)
        return path

    note = (f"note: model.vocab_size {padded} > the tokenizer's {vocab} ids: ids {vocab}\u2013"
            f"{padded - 1} are padding, never produced")
    ok = spec("padded", qwen2("qwen2-padded", padded))
    r = run([a.meshrun, "validate", "-f", ok])
    assert r.stderr.count(note) == 1, r.stderr
    r = run([a.meshrun, "train", "-f", ok, "--nproc", "1", "-o", "json"])
    assert r.stderr.count(note) == 1, r.stderr
    got = losses(r)
    assert len(got) == 2 and all(x == x and x > 0 for x in got), got
    print("padded:", note, "losses", got)
    small = spec("small", qwen2("qwen2-small", vocab - 8))
    for cmd in (["validate", "-f", small], ["train", "-f", small, "--nproc", "1"]):
        r = run([a.meshrun] + cmd, expect=2)
        assert f"error: model.vocab_size: {vocab - 8}, but data.tokenizer" in r.stderr, r.stderr
        assert f"has a vocabulary of {vocab}" in r.stderr and "hint:" in r.stderr, r.stderr
    print("a tokenizer larger than the model: exit 2")


def spm_tokenizers(work, texts):
    """SentencePiece-style BPE tokenizer.json files as Llama 2, Mistral 7B v0.1 and Gemma ship
    them, built and trained with the library (none can be downloaded here): byte fallback
    (<0x00>…<0xFF> in the vocabulary), fuse_unk, <unk>/<s>/</s>, the decoder Replace,
    ByteFallback, Fuse, Strip; Llama 2's newer files with the Metaspace pre-tokenizer
    (prepend_scheme first, always, never; split), Mistral/older Llama 2 files with the normalizer
    Sequence [Prepend("▁"), Replace(" ", "▁")] and no pre-tokenizer, Gemma's Replace with its
    Split(" ", MergedWithPrevious) that finds nothing left to split;
    with and without the post-processor adding <s>. Returns {name: folder}."""
    from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    special = ["<unk>", "<s>", "</s>"]
    # Train once (Metaspace, split): the merges and vocabulary every variant shares. Unknown
    # characters stay out of the vocabulary: limit_alphabet keeps the rarest (CJK, emoji) out,
    # so they take the byte fallback.
    base = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=special + byte_tokens,
                                  limit_alphabet=120, show_progress=False)
    base.train_from_iterator(texts, trainer=trainer)
    trained = json.loads(base.to_str())
    decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                 decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    out = {}

    def make(name, normalizer=None, pre=None, bos=False, normalized_specials=False,
             no_fallback=False):
        m = dict(trained["model"])
        if no_fallback:  # unk only: fused runs of unknown characters
            m["byte_fallback"] = False
        tok = Tokenizer(models.BPE(vocab=m["vocab"], merges=[tuple(x.split(" ", 1)) if
                                   isinstance(x, str) else tuple(x) for x in m["merges"]],
                                   unk_token="<unk>", byte_fallback=not no_fallback,
                                   fuse_unk=True))
        tok.add_special_tokens([AddedToken(t, normalized=normalized_specials, special=True)
                                for t in special])
        if normalizer is not None:
            tok.normalizer = normalizer
        if pre is not None:
            tok.pre_tokenizer = pre
        tok.decoder = decoder
        if bos:
            tok.post_processor = processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
        folder = os.path.join(work, "spm-" + name)
        os.makedirs(folder, exist_ok=True)
        tok.save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "</s>", "bos_token": "<s>", "add_bos_token": bos}, f)
        out[name] = folder

    mistral = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    make("llama2_first", pre=pre_tokenizers.Metaspace("▁", "first", split=False), bos=True)
    make("llama2_first_nobos", pre=pre_tokenizers.Metaspace("▁", "first", split=False))
    make("metaspace_always_split", pre=pre_tokenizers.Metaspace("▁", "always", split=True))
    make("metaspace_never_split", pre=pre_tokenizers.Metaspace("▁", "never", split=True))
    make("mistral", normalizer=mistral, bos=True)
    make("mistral_nobos", normalizer=mistral)
    make("mistral_normalized_specials", normalizer=mistral, normalized_specials=True)
    make("gemma_replace", normalizer=normalizers.Replace(" ", "▁"),
         pre=pre_tokenizers.Split(" ", "merged_with_previous"))
    make("mistral_unk_only", normalizer=mistral, no_fallback=True)
    return out


def case_spm(a, work):
    from tokenizers import Tokenizer
    folders = spm_tokenizers(work, corpus(work))
    docs = held_out() + [
        "unknown chars \u0378\U0010fffd \ufffd\u200b end",
        "  leading spaces, then\ttabs\t\tand\n\nnewlines   \n trailing  ",
        "<s>starts with bos</s> and <s> inside </s><unk> unk  <s>  spaced",
        "漢字とかなカナ混じり文、한국어 텍스트 🧪🧬🦀 and ɐɔɘ ǅ ﬁ",
        " ",
    ]
    doc_dir = os.path.join(work, "held-out")
    os.makedirs(doc_dir, exist_ok=True)
    paths = []
    for i, d in enumerate(docs):
        p = os.path.join(doc_dir, f"doc{i:02d}.txt")
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(d)
        paths.append(p)
    texts = [open(p, encoding="utf-8", newline="").read() for p in paths]
    for name, folder in folders.items():
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        fallback = 0
        for p, t in zip(paths, texts):
            out = os.path.join(work, "one.bin")
            run([a.meshrun, "tokenize", "--tokenizer", folder, p, "-o", out])
            # As for Llama 3's <|begin_of_text|>: the post-processor is not applied (decision
            # 0016), so the ids are encode(add_special_tokens=False) with or without add_bos.
            got, want = read_bin(out), tok.encode(t, add_special_tokens=False).ids
            fallback += sum(1 for i in want if 3 <= i < 259)
            if got != want:
                i = first_difference(got, want)
                raise AssertionError(f"{name} {p}: ids differ at {i}: meshrun {got[i:i + 8]} vs "
                                     f"tokenizers {want[i:i + 8]} "
                                     f"({tok.decode(want[max(0, i - 3):i + 5])!r})")
        if "unk_only" not in name:
            assert fallback > 20, f"{name}: only {fallback} byte-fallback ids: nothing tested"
        out = os.path.join(work, "all.bin")
        run([a.meshrun, "tokenize", "--tokenizer", folder, doc_dir, "-o", out])
        want = expected_ids(tok, texts, tok.token_to_id("</s>"))
        assert read_bin(out) == want, f"{name}: folder ids differ"
        print(f"{name}: {len(want)} ids equal ({fallback} byte-fallback ids)")

    # Decoding, as `meshrun generate` does: a model trained on text read with the Mistral-style
    # tokenizer, exported, continues prompts; its text is the library's decode of its ids.
    folder = folders["mistral"]
    vocab = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).get_vocab_size()
    ckpt = os.path.join(work, "ck")
    spec = spec_file(work, "gen", train=text_folder(work), tokenizer=folder, vocab=vocab,
                     ckpt=ckpt, steps=1, lr=0.0)
    run([a.meshrun, "train", "-f", spec, "--nproc", "1", "-o", "json"])
    raw = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    for prompt in ["Hello world!  Don't", "Ünïcödé café 🙂\n\tx", "漢字 🧪"]:
        r = run([a.meshrun, "generate", "--checkpoint", ckpt, "--prompt", prompt,
                 "--max-new-tokens", "12", "-o", "json"])
        got = json.loads(r.stdout)
        assert got["prompt_tokens"] == raw.encode(prompt, add_special_tokens=False).ids, got
        assert got["text"] == raw.decode(got["tokens"]), (got["text"], raw.decode(got["tokens"]))
        print("generate:", repr(prompt), "->", repr(got["text"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["parity", "train", "generate", "padded", "spm"])
    p.add_argument("--meshrun", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    if not os.path.isdir(FORTUNES):
        skip(f"{FORTUNES} is missing (hint: scripts/setup installs the fortunes package)")
    python = os.path.join(a.venv, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(a.venv):
        make = subprocess.run([os.path.join(a.source, "tests/python/make-venv"), a.venv,
                               os.path.join(a.source, "tests/python/requirements-models.txt")],
                              capture_output=True, text=True)
        if make.returncode != 0:
            skip("no Python environment: " + make.stderr.strip())
        os.execv(python, [python] + sys.argv)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    {"parity": case_parity, "train": case_train, "generate": case_generate,
     "padded": case_padded, "spm": case_spm}[a.case](a, a.work)
    shutil.rmtree(a.work, ignore_errors=True)
    print("PASSED")


if __name__ == "__main__":
    main()
