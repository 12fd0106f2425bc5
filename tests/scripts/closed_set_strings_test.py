#!/usr/bin/env python3
"""engine/ never compares a spec string against a closed-set value (decision 0050).

The closed sets are read from AllowedValues in common/job_spec.cc, so a new set is guarded as
soon as it is listed there. A comparison `== "v"` / `!= "v"` (either side) in engine/ whose v is
one of those values fails, unless its file and line text are on ALLOWED below: strings that are
not the job spec's but share a value (a file's JSON keys, a tokenizer's own options).
Usage: closed_set_strings_test.py [REPO_ROOT]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])

# (file under engine/, text the line contains): why it is not a spec closed set.
ALLOWED = [
    # tokenizer.json's own pre_tokenizer prepend_scheme (always | first | never), read from the file.
    ("engine/data/sentencepiece_bpe.cc", "scheme"),
    # data.chat_template names and message roles of instruction data (not in AllowedValues yet).
    ("engine/data/instruction.cc", ""),
    # config.json's model_type read from a Hugging Face folder, and export's --dtype flag.
    ("engine/model/hf_checkpoint.cc", "type =="),
    ("engine/model/hf_checkpoint.cc", "name =="),
    # The planner's device profiles by GPU name (cpu | a100 | h100 | h200 | l40s), not resources.device.
    ("engine/train/planner.cc", 'name == "cpu"'),
]


def closed_values():
    text = (ROOT / "common/job_spec.cc").read_text()
    body = text[text.index("AllowedValues(std::string_view section"):]
    body = body[: body.index("\n}\n")]
    values = set()
    for braces in re.findall(r"return \{([^}]*)\};", body):
        values.update(re.findall(r'"([^"]+)"', braces))
    if len(values) < 10:
        sys.exit(f"error: read only {sorted(values)} from AllowedValues in common/job_spec.cc")
    return values


def main():
    values = closed_values()
    alt = "|".join(re.escape(v) for v in sorted(values))
    pattern = re.compile(rf'(?:==|!=)\s*"(?:{alt})"|"(?:{alt})"\s*(?:==|!=)')
    bad = []
    for path in sorted((ROOT / "engine").rglob("*")):
        if path.suffix not in (".cc", ".h", ".cu", ".cuh") or not path.is_file():
            continue
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if not pattern.search(line):
                continue
            if any(rel == f and text in line for f, text in ALLOWED):
                continue
            bad.append(f"{rel}:{n}: {line.strip()}")
    if bad:
        print("error: engine/ compares a string with a closed spec set's value; read the enum "
              "from common/job_spec.h instead (hint: DeviceOf, PrecisionOf, CheckpointingOf, ...; "
              "decision 0050):")
        print("\n".join(bad))
        return 1
    print(f"ok: no comparison with {len(values)} closed-set values in engine/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
