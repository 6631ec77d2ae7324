#!/usr/bin/env python3
"""Writes config/demo-tokenizer/: the tokenizer of `make run`'s demo model.

A small byte-level BPE tokenizer (vocabulary 3072) in Hugging Face's
tokenizer.json format, built the way Qwen2's is (NFC, the Qwen2 split
regex, byte-level BPE, no BOS), and a tokenizer_config.json with a
ChatML chat template and <|im_end|> as its eos token. It is trained with
the `tokenizers` library on ferry's own text (README.md and docs/ as they
were at commit SOURCE_REV), so the output depends on nothing outside this
repository's history: run it again and the files come out byte for byte
the same (the script checks that by training twice).

    build/venv/bin/python scripts/make_demo_tokenizer.py [--out config/demo-tokenizer]

Merges are written as "a b" strings, the form most checkpoints ship.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread: the same merges every run
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOURCE_REV = "9110be8"  # ferry's text the vocabulary is learnt from (a commit, so later edits change nothing)
SOURCES = ["README.md", "docs/quantization.md", "bench/RESULTS.md", "tests/fuzz/README.md"]
VOCAB = 3072
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer regex (transformers' PRETOKENIZE_REGEX for Qwen2)
SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def source_text():
    texts = []
    for path in SOURCES:
        out = subprocess.run(["git", "-C", str(REPO), "show", "%s:%s" % (SOURCE_REV, path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
        texts.append(out.stdout.decode("utf-8"))
    return texts


def train(texts):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # one line at a time: paragraphs would weight long lines
    tok.train_from_iterator([line for t in texts for line in t.splitlines(keepends=True)], trainer=trainer)
    obj = json.loads(tok.to_str())
    # as Qwen2's tokenizer.json writes them (the Python constructors' defaults differ, to no effect)
    for k in ("decoder", "post_processor"):
        obj[k].update({"add_prefix_space": False, "trim_offsets": False, "use_regex": False})
    obj["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in obj["model"]["merges"]]
    return obj


def tokenizer_config(obj):
    added = {str(t["id"]): {"content": t["content"], "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True} for t in obj["added_tokens"]}
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 2048,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def dump(obj):
    return json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=False) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "config" / "demo-tokenizer"))
    args = ap.parse_args()
    texts = source_text()
    first, second = dump(train(texts)), dump(train(texts))
    if first != second:
        sys.exit("make_demo_tokenizer: two trainings differ: the output would not be reproducible")
    obj = json.loads(first)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(first, encoding="utf-8")
    (out / "tokenizer_config.json").write_text(dump(tokenizer_config(obj)), encoding="utf-8")
    # a check with the reference implementation: the file loads and round-trips
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    sample = "ferry serves <|im_start|>user\nHello, wörld!<|im_end|>\n"
    ids = tok.encode(sample).ids
    assert tok.decode(ids, skip_special_tokens=False) == sample, "round trip failed"
    print("%s: vocabulary %d, %d merges, %d bytes" % (out / "tokenizer.json", tok.get_vocab_size(),
                                                     len(obj["model"]["merges"]), len(first.encode())))


if __name__ == "__main__":
    main()
