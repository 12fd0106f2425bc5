#!/usr/bin/env python3
"""Instruction data and loss masks against transformers (docs/data.md "Instruction data").

    instruction_test.py CASE --meshrun BIN --source DIR --venv VENV --work DIR

CASE is one of:
  templates  for each chat template family meshrun renders without a Jinja engine (Qwen2's
             ChatML, Llama 2 [INST] <<SYS>>, Mistral v0.1 [INST], Llama 3 headers), written into a
             tokenizer_config.json made at test time, `meshrun tokenize` gives the ids of
             transformers' apply_chat_template (plus the end-of-text token), and its .mask marks
             exactly the assistant tokens (content and end marker); a spelled-out data.template
             too; unknown templates are exit 2 naming the fix.
  loss       training on the JSONL with train.loss_on: completion: the first-step loss equals a
             PyTorch reference that sets every other target to -100 (<= 1e-5) on one rank, and
             every mesh (dp, dp_shard, tp, cp allgather and ring, cp ring x tp, gradient
             accumulation) gives the losses of one rank; training from the token file and mask
             that `meshrun tokenize --seq-len` wrote gives the same losses as from the JSONL.
  packed     samples packed into windows with data.attention: document: the first-step loss
             equals a PyTorch reference with a block-diagonal causal mask per sample and -100
             targets (<= 1e-5) and the loss of one sample per window (causal), also with a
             tokenizer whose eos_token (<|im_end|>) ends every turn: one rank, the .bin + .mask
             of `meshrun tokenize --pack`, dp_shard 2 x tp 2, cp 2 ring x tp 2, cp 2 allgather;
             evaluation of the packed .bin + .mask (data.val) equals the reference too.

Exits 77 (skipped) when the virtual environment cannot be made.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SKIP = 77
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>",
           "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# The templates as the models ship them in tokenizer_config.json.
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}"
          "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
          "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
          "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
          "{% else %}{% set content = message['content'] %}{% endif %}"
          "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
          "{% endif %}{% endfor %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}"
           "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
           "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
           "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
           "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
           "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
           "{% endif %}{% endfor %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")
# family: (chat_template, bos, eos, system allowed, the end marker after assistant content,
# characters before the content that belong to the assistant's part)
FAMILIES = {
    "chatml": (QWEN2, None, "<|endoftext|>", True, "<|im_end|>", 0),
    "llama2": (LLAMA2, "<s>", "</s>", True, " </s>", 1),
    "mistral": (MISTRAL, "<s>", "</s>", False, "</s>", 0),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|end_of_text|>", True, "<|eot_id|>", 0),
}
CUSTOM = "### Question:\n{prompt}\n### Answer:\n{completion}\n"


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


def run(cmd, expect=0, timeout=300):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if expect is not None and r.returncode != expect:
        raise AssertionError(f"{' '.join(cmd)}: exit {r.returncode}, wanted {expect}\n"
                             f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}")
    return r


def corpus():
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
             "boxing matches question answer capital france paris add two numbers please "
             "explain why sky blue light scatters assistant user system helpful").split()
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(12)))
    return lines


def make_tokenizer(work):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    folder = os.path.join(work, "tok-base")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    return folder


def family_folder(work, base, family, eos_override=None):
    tmpl, bos, eos, _, _, _ = FAMILIES[family]
    if eos_override:
        eos = eos_override
    folder = os.path.join(work, "tok-" + family + ("-eos" if eos_override else ""))
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(base, "tokenizer.json"), folder)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": tmpl,
              "eos_token": eos, "clean_up_tokenization_spaces": False}
    if bos:
        config["bos_token"] = bos
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return folder


def conversations(family):
    system_ok = FAMILIES[family][3]
    convs = [
        [{"role": "user", "content": "What is the capital of France?"},
         {"role": "assistant", "content": "Paris is the capital."}],
        [{"role": "user", "content": "add two numbers: 3 and 4"},
         {"role": "assistant", "content": "7"},
         {"role": "user", "content": "  and why?  "},
         {"role": "assistant", "content": " because three plus four is seven.\n"}],
        [{"role": "user", "content": "explain why the sky is blue"},
         {"role": "assistant", "content": "light scatters"}],
    ]
    if system_ok:
        convs.append([{"role": "system", "content": "You are a quiet judge."},
                      {"role": "user", "content": "the lazy dog?"},
                      {"role": "assistant", "content": "jumps over the fox"}])
    return convs


def records(family):
    recs = [{"messages": c} for c in conversations(family)]
    recs.append({"prompt": "quick question: brown fox?", "completion": "a quick brown fox"})
    return recs


def as_messages(rec):
    if "messages" in rec:
        return rec["messages"]
    return [{"role": "user", "content": rec["prompt"]},
            {"role": "assistant", "content": rec["completion"]}]


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def read_bin(path):
    import numpy as np
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520, header[:3]
    dtype = "<u2" if header[1] == 1 else "<u4"
    return [int(t) for t in np.frombuffer(raw[1024:], dtype=dtype)]


def read_mask(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"MRMASK01", raw[:8]
    version = int.from_bytes(raw[8:12], "little")
    seq_len = int.from_bytes(raw[12:16], "little")
    assert version == 1, version
    return list(raw[16:]), seq_len


def expected_sample(tok, family, messages, eot):
    """The ids apply_chat_template gives (plus the end-of-text token) and, independently of
    meshrun, which are targets: tokens that start inside an assistant message's content or its
    end marker (found in the rendered text), and the end-of-text token appended."""
    tmpl = FAMILIES[family] if family in FAMILIES else None
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = tok.apply_chat_template(messages, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = list(ids)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    # Target character ranges.
    spans, at = [], 0
    for m in messages:
        content = m["content"]
        if family in ("llama2", "llama3"):
            content = content.strip()
        start = text.find(content, at)
        assert start >= 0, (content, text)
        end = start + len(content)
        at = end
        if m["role"] == "assistant":
            marker, lead = tmpl[4], tmpl[5]
            assert text.startswith(marker, end), (family, text[end:end + 10])
            spans.append((start - lead, end + len(marker)))
    # Each token's start: the decoded lengths before it (ASCII text).
    starts, pos = [], 0
    for i in ids:
        starts.append(pos)
        pos += len(tok.decode([i], clean_up_tokenization_spaces=False))
    assert pos == len(text), (pos, len(text))
    targets = [any(a <= s < b for a, b in spans) for s in starts]
    if ids[-1] != eot:
        ids.append(eot)
        targets.append(any(targets))
    return ids, targets


def flags_targets(flags):
    return [bool(f & 1) for f in flags]


def case_templates(a, work):
    import transformers
    base = make_tokenizer(work)
    for family in FAMILIES:
        folder = family_folder(work, base, family)
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        eot = tok.convert_tokens_to_ids(FAMILIES[family][2])
        recs = records(family)
        data = os.path.join(work, family + ".jsonl")
        write_jsonl(data, recs)
        out = os.path.join(work, family + ".bin")
        run([a.meshrun, "tokenize", "--tokenizer", folder, "--template", "tokenizer", data,
             "-o", out, "-q"])
        got_ids = read_bin(out)
        got_flags, seq_len = read_mask(out[:-4] + ".mask")
        assert seq_len == 0 and len(got_flags) == len(got_ids)
        want_ids, want_targets = [], []
        for r in recs:
            ids, targets = expected_sample(tok, family, as_messages(r), eot)
            want_ids += ids
            want_targets += targets
        assert got_ids == want_ids, f"{family}: ids differ\nmeshrun {got_ids}\nwant    {want_ids}"
        got_targets = flags_targets(got_flags)
        assert got_targets == want_targets, \
            f"{family}: targets differ at {[i for i, (g, w) in enumerate(zip(got_targets, want_targets)) if g != w][:10]}"
        # Sample starts: the first token of each record.
        starts = [i for i, f in enumerate(got_flags) if f & 2]
        lengths, at = [], 0
        for r in recs:
            lengths.append(at)
            at += len(expected_sample(tok, family, as_messages(r), eot)[0])
        assert starts == lengths, (family, starts, lengths)
        # The family named in the spec renders the same.
        named = os.path.join(work, family + "-named.bin")
        run([a.meshrun, "tokenize", "--tokenizer", folder, "--template", family, data, "-o", named,
             "-q"])
        if family != "chatml":  # named, ChatML has no default system turn (docs/data.md)
            assert read_bin(named) == got_ids, family
        else:
            assert len(read_bin(named)) < len(got_ids), family
        print(f"{family}: {len(got_ids)} ids and {sum(got_targets)} targets equal transformers'")

    # A spelled-out template: prompt part, then completion and what follows it as targets.
    folder = family_folder(work, base, "chatml")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    recs = [{"prompt": "brown fox?", "completion": "quick fox"},
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}]
    data = os.path.join(work, "custom.jsonl")
    write_jsonl(data, recs)
    out = os.path.join(work, "custom.bin")
    run([a.meshrun, "tokenize", "--tokenizer", folder, "--template", CUSTOM, data, "-o", out, "-q"])
    want_ids, want_targets = [], []
    for r in recs:
        ms = as_messages(r)
        parts = []
        for i in range(0, len(ms), 2):
            parts.append((CUSTOM.split("{completion}")[0].replace("{prompt}", ms[i]["content"]),
                          False))
            parts.append((ms[i + 1]["content"] + CUSTOM.split("{completion}")[1], True))
        text = "".join(p for p, _ in parts)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        starts, pos = [], 0
        for i in ids:
            starts.append(pos)
            pos += len(tok.decode([i], clean_up_tokenization_spaces=False))
        bounds, at = [], 0
        for p, t in parts:
            bounds.append((at, at + len(p), t))
            at += len(p)
        targets = [any(t and b0 <= s < b1 for b0, b1, t in bounds) for s in starts]
        want_ids += ids + [eot]
        want_targets += targets + [True]
    assert read_bin(out) == want_ids, "custom template ids"
    assert flags_targets(read_mask(out[:-4] + ".mask")[0]) == want_targets, "custom targets"
    print(f"custom template: {len(want_ids)} ids and {sum(want_targets)} targets")

    # What cannot be rendered without Jinja is refused, naming the fix.
    odd = os.path.join(work, "tok-odd")
    os.makedirs(odd, exist_ok=True)
    shutil.copy(os.path.join(base, "tokenizer.json"), odd)
    with open(os.path.join(odd, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}",
                   "eos_token": "<|endoftext|>"}, f)
    r = run([a.meshrun, "tokenize", "--tokenizer", odd, "--template", "tokenizer",
             os.path.join(work, "chatml.jsonl"), "-o", os.path.join(work, "odd.bin")], expect=2)
    assert "none of the families" in r.stderr and "hint:" in r.stderr, r.stderr
    r = run([a.meshrun, "tokenize", "--tokenizer", odd, "--template", "{completion} first",
             os.path.join(work, "chatml.jsonl"), "-o", os.path.join(work, "odd.bin")], expect=2)
    assert "{prompt} followed by {completion}" in r.stderr, r.stderr
    print("unrecognised templates refused")


# ---- loss: a tiny Llama made at test time, fine-tuned on the JSONL.

SEQ = 32


def make_model(work, vocab):
    import torch
    import transformers
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False, rope_theta=10000.0)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            else:
                p.uniform_(0.8, 1.2)
    folder = os.path.join(work, "model")
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def loss_records():
    recs = []
    for i in range(12):
        recs.append({"prompt": f"question {i}: the quick brown fox?" + " please" * (i % 3),
                     "completion": "answer: a lazy dog" + " jumps" * (i % 4)})
    recs.append({"messages": [{"role": "system", "content": "be helpful"},
                              {"role": "user", "content": "why sky blue"},
                              {"role": "assistant", "content": "light scatters"},
                              {"role": "user", "content": "and?"},
                              {"role": "assistant", "content": "seven wizards"}]})
    return recs


def windows_of(samples, seq, eot):
    """docs/data.md "Windows of samples": one sample per window (not packed), padding after."""
    ids, flags = [], []
    for s_ids, s_targets in samples:
        if len(ids) % seq:
            pad = seq - len(ids) % seq
            ids += [eot] * pad
            flags += [None] * pad
        ids += s_ids
        flags += [("start" if i == 0 else t) for i, t in enumerate(s_targets)]
    pad = (seq - len(ids) % seq) % seq + 1
    ids += [eot] * pad
    flags += [None] * pad
    return ids, flags


def spec_file(work, name, data, tokenizer, model, **over):
    spec = {
        "name": name,
        "model": {"arch": "llama", "seq_len": SEQ, "init_from": model},
        "parallelism": {"dp_replicate_size": 1, "dp_shard_size": 1, "cp_size": 1, "tp_size": 1},
        "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2, "lr": 1.0e-2,
                  "min_lr": 1.0e-3, "warmup_steps": 1, "loss_on": "completion", "seed": 3},
        "data": {"train": data, "tokenizer": tokenizer, "order": "sequential"},
        "resources": {"threads": 1},
    }
    for k, v in over.items():
        section, key = k.split("__")
        spec[section][key] = v
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def train(a, spec, nproc=1, sets=()):
    cmd = [a.meshrun, "train", "-f", spec, "--nproc", str(nproc), "-o", "json"]
    for s in sets:
        cmd += ["--set", s]
    r = run(cmd, timeout=600)
    return json.loads(r.stdout.strip().splitlines()[-1])["losses"]


def case_loss(a, work):
    import torch
    import torch.nn.functional as F
    import transformers
    base = make_tokenizer(work)
    folder = family_folder(work, base, "chatml")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    vocab = (len(tok) + 7) // 8 * 8 + 8  # a padded embedding, divisible by tp
    model_dir = make_model(work, vocab)
    recs = loss_records()
    data = os.path.join(work, "sft.jsonl")
    write_jsonl(data, recs)

    # The reference: the samples (ids and targets from transformers' rendering), one per window,
    # prompt tokens, padding and sample starts at -100; the mean over the targets of the batch.
    samples = [expected_sample(tok, "chatml", as_messages(r), eot) for r in recs]
    ids, flags = windows_of(samples, SEQ, eot)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    B = 4
    x = torch.tensor([ids[j * SEQ:j * SEQ + SEQ] for j in range(B)])
    labels = torch.tensor([[ids[j * SEQ + t + 1] if flags[j * SEQ + t + 1] is True else -100
                            for t in range(SEQ)] for j in range(B)])
    with torch.no_grad():
        logits = model(input_ids=x).logits
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100).item()
    everything = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(
        [[ids[j * SEQ + t + 1] for t in range(SEQ)] for j in range(B)]).reshape(-1)).item()
    spec = spec_file(work, "one", data, folder, model_dir)
    one = train(a, spec)
    print(f"one rank: losses {one}; reference first step {want:.7f} (all tokens {everything:.4f})")
    assert abs(one[0] - want) <= 1e-5, (one[0], want)
    assert abs(one[0] - everything) > 1e-3  # the mask matters

    # The token file and mask that `meshrun tokenize --seq-len` writes train the same.
    out = os.path.join(work, "sft.bin")
    run([a.meshrun, "tokenize", "--tokenizer", folder, data, "-o", out, "--seq-len", str(SEQ),
         "-q"])
    assert read_bin(out) == ids, "tokenize --seq-len lays the samples out as the trainer does"
    from_bin = train(a, spec, sets=["data.train=" + out])
    assert all(abs(p - q) <= 1e-6 for p, q in zip(from_bin, one)), (from_bin, one)
    print(f"from tokenize's .bin + .mask: {from_bin}")

    meshes = {
        "dp2": (2, ["parallelism.dp_replicate_size=2"]),
        "dp_shard2": (2, ["parallelism.dp_shard_size=2"]),
        "tp2": (2, ["parallelism.tp_size=2"]),
        "cp2": (2, ["parallelism.cp_size=2"]),
        "cp2-ring-tp2": (4, ["parallelism.cp_size=2", "parallelism.tp_size=2",
                             "parallelism.cp_comm_strategy=ring"]),
        "dp2-accumulate": (2, ["parallelism.dp_shard_size=2", "train.micro_batch_size=1"]),
    }
    for name, (nproc, sets) in meshes.items():
        got = train(a, spec, nproc, sets)
        diff = max(abs(p - q) for p, q in zip(got, one))
        print(f"{name}: losses {got} (max difference {diff:.2e})")
        assert diff <= 1e-5, (name, got, one)

    # loss_on completion without marked completions is refused.
    text = os.path.join(work, "plain.txt")
    with open(text, "w") as f:
        f.write("\n".join(corpus()))
    r = run([a.meshrun, "train", "-f", spec, "--set", "data.train=" + text], expect=2)
    assert "train.loss_on" in r.stderr and "hint:" in r.stderr, r.stderr


def packed_windows(samples, seq, eot):
    """docs/data.md "Windows of samples", packed: a sample goes on in the current window when it
    fits in what is left of it. Returns the ids, the flags (as windows_of) and per token the
    index of its sample (-1 for padding)."""
    ids, flags, sample_of = [], [], []
    for n, (s_ids, s_targets) in enumerate(samples):
        used = len(ids) % seq
        if used and len(s_ids) > seq - used:
            pad = seq - used
            ids += [eot] * pad
            flags += [None] * pad
            sample_of += [-1] * pad
        ids += s_ids
        flags += [("start" if i == 0 else t) for i, t in enumerate(s_targets)]
        sample_of += [n] * len(s_ids)
    pad = (seq - len(ids) % seq) % seq + 1
    ids += [eot] * pad
    flags += [None] * pad
    sample_of += [-1] * pad
    return ids, flags, sample_of


def masked_loss(model, ids, flags, seq, windows, docs=None):
    """The mean cross-entropy over the completion targets (every other label -100) of the given
    windows; with `docs` (per token, the index of its document) a block-diagonal causal mask
    (4D, no attention across documents) and positions restarting at each document's first token
    in the window, as transformers' packed position_ids do."""
    import torch
    import torch.nn.functional as F
    x = torch.tensor([ids[j * seq:j * seq + seq] for j in windows])
    labels = torch.tensor([[ids[j * seq + t + 1] if flags[j * seq + t + 1] is True else -100
                            for t in range(seq)] for j in windows])
    kwargs = {}
    if docs is not None:
        doc = torch.tensor([docs[j * seq:j * seq + seq] for j in windows])
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        allowed = causal[None] & (doc[:, :, None] == doc[:, None, :])
        mask = torch.zeros(allowed.shape, dtype=torch.float32)
        mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
        first = torch.zeros_like(doc)  # each document's first position in the window
        for b in range(len(windows)):
            for t in range(1, seq):
                first[b, t] = first[b, t - 1] if doc[b, t] == doc[b, t - 1] else t
        kwargs = {"attention_mask": mask[:, None], "position_ids": torch.arange(seq)[None] - first}
    with torch.no_grad():
        logits = model(input_ids=x, **kwargs).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100).item()


def case_packed(a, work):
    """Packed samples with document attention: a block-diagonal mask per sample, also where the
    turns end with the end-of-text token itself (Qwen2.5-Instruct's eos is <|im_end|>): a
    sample's turns are one document (its starts come from the flags, not the eos token)."""
    base = make_tokenizer(work)
    for eos in (None, "<|im_end|>"):
        sub = os.path.join(work, "eos-" + ("im_end" if eos else "default"))
        os.makedirs(sub)
        print(f"eos_token: {eos or FAMILIES['chatml'][2]}")
        packed_case(a, sub, family_folder(sub, base, "chatml", eos), meshes=eos is not None)


def packed_case(a, work, folder, meshes):
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    eot = tok.convert_tokens_to_ids(tok.eos_token)
    model_dir = make_model(work, (len(tok) + 7) // 8 * 8 + 8)
    recs = loss_records()
    data = os.path.join(work, "sft.jsonl")
    write_jsonl(data, recs)
    seq = 128  # room for two or three samples per window
    samples = [expected_sample(tok, "chatml", as_messages(r), eot) for r in recs]
    # With eos <|im_end|> every turn of a sample ends with the eos token.
    assert any(eot in s_ids[:-1] for s_ids, _ in samples) == meshes, "eos inside the samples"
    packed_ids, packed_flags, sample_of = packed_windows(samples, seq, eot)
    unpacked_ids, unpacked_flags = windows_of(samples, seq, eot)

    # `meshrun tokenize` lays the samples out as the reference does, its .mask flagging each
    # sample's first token.
    outs = {}
    for name, extra in (("unpacked", []), ("packed", ["--pack"])):
        out = os.path.join(work, name + ".bin")
        run([a.meshrun, "tokenize", "--tokenizer", folder, data, "-o", out, "--seq-len", str(seq),
             "-q"] + extra)
        outs[name] = out
    assert read_bin(outs["unpacked"]) == unpacked_ids, "unpacked layout"
    assert read_bin(outs["packed"]) == packed_ids, "packed layout"
    got_flags, _ = read_mask(outs["packed"][:-4] + ".mask")
    assert [i for i, f in enumerate(got_flags) if f & 2] == \
        [i for i, f in enumerate(packed_flags) if f == "start"], "sample starts"
    n_packed, n_unpacked = (len(packed_ids) - 1) // seq, (len(unpacked_ids) - 1) // seq
    assert n_packed < n_unpacked, (n_packed, n_unpacked)

    # The references: packed windows with a block-diagonal mask per sample (padding tokens
    # apart); the same samples one per window with causal attention; and, to show that the
    # test can fail, the mask cut at every eos token.
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    per_sample = [d if d >= 0 else -2 - i for i, d in enumerate(sample_of)]

    def reference(windows):
        return masked_loss(model, packed_ids, packed_flags, seq, windows, per_sample)

    want = reference(list(range(n_packed)))
    unpacked_want = masked_loss(model, unpacked_ids, unpacked_flags, seq,
                                list(range(n_unpacked)))
    ends, count = [], 0  # per token, the eos tokens before it: its document cut at eos
    for t in packed_ids:
        ends.append(count)
        count += t == eot
    at_eos = masked_loss(model, packed_ids, packed_flags, seq, list(range(n_packed)), ends)
    print(f"reference: packed per sample {want:.7f}, one sample per window {unpacked_want:.7f}, "
          f"cut at every eos {at_eos:.7f}")
    assert abs(want - unpacked_want) <= 1e-5, (want, unpacked_want)
    if meshes:
        assert abs(at_eos - want) > 1e-3, "the eos tokens inside the samples must matter"

    spec = spec_file(work, "packed", data, folder, model_dir, model__seq_len=seq)

    def batch(n, micro=None):
        return [f"train.global_batch_size={n}", f"train.micro_batch_size={micro or n}"]

    unpacked = train(a, spec, 1, ["data.attention=causal"] + batch(n_unpacked))
    print(f"unpacked, causal: {n_unpacked} windows, first-step loss {unpacked[0]:.7f}")
    assert abs(unpacked[0] - unpacked_want) <= 1e-5, (unpacked, unpacked_want)
    runs = [("packed, one rank", 1, [], n_packed, None),
            ("packed, from tokenize's .bin + .mask", 1, ["data.train=" + outs["packed"]],
             n_packed, None)]
    if meshes:
        even = n_packed + n_packed % 2  # dp 2 takes as many windows on each rank
        runs += [
            ("dp_shard 2 x tp 2", 4, ["parallelism.dp_shard_size=2", "parallelism.tp_size=2"],
             even, even // 2),
            ("cp 2 ring x tp 2", 4, ["parallelism.cp_size=2", "parallelism.tp_size=2",
                                     "parallelism.cp_comm_strategy=ring"], n_packed, None),
            ("cp 2 allgather", 2, ["parallelism.cp_size=2",
                                   "parallelism.cp_comm_strategy=allgather"], n_packed, None),
        ]
    for name, nproc, sets, n, micro in runs:
        got = train(a, spec, nproc, sets + ["data.attention=document"] + batch(n, micro))
        # Sequential order: slot s reads window s mod N_w.
        ref = want if n == n_packed else reference([s % n_packed for s in range(n)])
        print(f"{name}: {n} windows, first-step loss {got[0]:.7f} (reference {ref:.7f})")
        assert abs(got[0] - ref) <= 1e-5, (name, got, ref)
        if n == n_packed:
            assert abs(got[0] - unpacked[0]) <= 1e-5, (name, got, unpacked)
    if not meshes:
        return
    # Evaluation reads the documents from the flags too: data.val = the packed .bin + .mask,
    # with lr 0 (the weights as loaded) the eval loss is the reference's over every window.
    for name, nproc, sets in (("one rank", 1, []),
                              ("cp 2 ring x tp 2", 4, ["parallelism.cp_size=2",
                                                       "parallelism.tp_size=2",
                                                       "parallelism.cp_comm_strategy=ring"])):
        cmd = [a.meshrun, "train", "-f", spec, "--nproc", str(nproc), "-o", "json"]
        for s in sets + ["data.attention=document", "data.val=" + outs["packed"],
                         "data.eval_every=1", "train.steps=1", "train.lr=0", "train.min_lr=0"] + \
                batch(n_packed):
            cmd += ["--set", s]
        events = [json.loads(line) for line in run(cmd, timeout=600).stdout.splitlines()
                  if line.startswith("{")]
        got = [e["loss"] for e in events if e.get("event") == "eval"]
        print(f"eval, {name}: {got} (reference {want:.7f})")
        assert len(got) == 1 and abs(got[0] - want) <= 1e-5, (name, got, want)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["templates", "loss", "packed"])
    p.add_argument("--meshrun", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
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
    {"templates": case_templates, "loss": case_loss, "packed": case_packed}[a.case](a, a.work)
    print("OK")


if __name__ == "__main__":
    main()
