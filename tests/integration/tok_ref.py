"""Reference tokenizers for tests/integration/test_tokenizer.py and
bench/tokenizer_bench.py: HF tokenizers objects and the tokenizer.json
files ferry reads, from the folders `make deps` builds out of llama.cpp's
vocabularies (scripts/vocab_to_hf.py, build/ref/tokenizers; refdata.py).
Each is laid out as the model's HF files are, built with the `tokenizers`
library and saved by it; vocab_to_hf.py checks each against llama.cpp's
tokenization vectors.

    llama-spm  Llama 2: SentencePiece-style BPE with byte fallback, merges
               as [a, b] pairs (Llama 2's published file writes them as
               "a b" strings, three of them holding a literal space;
               test_tokenizer.py covers that form with a small file of its own)
    llama-bpe  Llama 3: the Split regex + ByteLevel, ignore_merges, special
               tokens 128000-128255, a <|begin_of_text|> template
    qwen2      Qwen2: NFC, Qwen's regex + ByteLevel, merges as "a b" strings;
               here with Qwen2.5's added tokens appended (ids 151646-151664,
               special and not, as Qwen2.5's files have them on the same
               vocabulary) in tokenizer.json and tokenizer_config.json
"""

import json
import random
import shutil

from tokenizers import Tokenizer

from refdata import tokenizer_dir

NAMES = ["llama-spm", "llama-bpe", "qwen2"]

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It's John's book; they'll say we'd've known, "
    "I'm sure you're right and I've seen it.",
    " leading space", "trailing space ", "  two  spaces  ", "\n", "\n\n\n", "line1\nline2\r\nline3\r",
    "\t\tdef f(x):\n\t\t\treturn x  # tab-indented\n    four spaces\n        eight\n\n",
    "if (a && b) { return c->d[0] + 0x1F; } // C code\n#include <stdio.h>\n",
    "0 1 12 123 1234 12345 123456 1234567 12345678901234567890", "3.14159, -2.5e10, 1,000,000 $5 50%",
    "日本語のテキストです。東京タワー", "中文测试，你好世界！", "한국어 텍스트 입니다",
    "Привет, мир! Как дела?", "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "Ελληνικά γράμματα", "हिन्दी पाठ",
    "👨‍👩‍👧‍👦 family 👍🏽 🏳️‍🌈 flags 🇯🇵🇫🇷 ❤️", "e\u0301 vs \u00e9 (NFC/NFD)", "ﬁ ligature ＦＵＬＬＷＩＤＴＨ ①②",
    "İstanbul ΣΊΣΥΦΟΣ Straße", "it's IT'S it'ſ We'RE THEY'LL",
    "\u00a0nbsp\u2009thin\u3000ideographic\u0085nel\u180emvs\u200bzwsp",
    "<<|eot_id|>> <|eot_id <s> </s> <unk> [INST] <|im_start|>user<|im_end|>", "",
    "a" * 3000, " " * 50 + "x", "!!!???...,,,;;;   ---", "café naïve résumé", "\x00nul\x01ctrl\x7f",
    "mixed日本Русский123abc", "ʼ modifier ʻokina", "x" + "\n" * 5 + " " * 5 + "y\t\t\n \n",
]

MIXED_PARTS = [
    "The quick brown fox jumps over the lazy dog. It's been a long day, isn't it? ",
    "def main(argc, argv):\n\tfor i in range(10):\n\t\tprint(f\"{i:04d}\")  # comment\n    return 0\n",
    "東京は日本の首都です。今日はいい天気ですね。", "Привет, как дела? Всё хорошо. ", "مرحبا بالعالم، كيف حالك؟ ",
    "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ", "3.14159 2718281828 42 1000000 ", "    \n\n   \t\t  ",
]


def mixed_text(n_bytes, specials=(), seed=7):
    rnd = random.Random(seed)
    parts = MIXED_PARTS + [" %s " % s for s in specials]
    out, n = [], 0
    while n < n_bytes:
        p = rnd.choice(parts)
        out.append(p)
        n += len(p.encode())
    return "".join(out)


def copy_built(name, out):
    """build/ref/tokenizers/NAME copied to out."""
    src = tokenizer_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(str(src / f), str(out / f))
    return out


def build_plain(name):
    def build(out):
        copy_built(name, out)
        return Tokenizer.from_file(str(out / "tokenizer.json"))
    return build


# Qwen2.5's added tokens after Qwen2's <|endoftext|>, <|im_start|>, <|im_end|>:
# (content, special); the ones that are not special are matched in any text
QWEN25_ADDED = [("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
                ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
                ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False)]


def build_qwen2(out):
    copy_built("qwen2", out)
    path = out / "tokenizer.json"
    j = json.loads(path.read_text(encoding="utf-8"))
    assert all(isinstance(m, str) for m in j["model"]["merges"]), "qwen2's merges are \"a b\" strings"
    cfg = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    first = max(t["id"] for t in j["added_tokens"]) + 1
    for k, (content, special) in enumerate(QWEN25_ADDED):
        t = {"id": first + k, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": special}
        j["added_tokens"].append(t)
        cfg["added_tokens_decoder"][str(first + k)] = {x: t[x] for x in t if x != "id"}
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2), encoding="utf-8")
    return Tokenizer.from_file(str(path))


BUILDERS = {"llama-spm": build_plain("llama-spm"), "llama-bpe": build_plain("llama-bpe"), "qwen2": build_qwen2}
SPECIALS = {
    "llama-spm": ["<s>", "</s>", "<unk>"],
    "llama-bpe": ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|reserved_special_token_5|>", "<|reserved_special_token_250|>"],  # Llama 3.0's names
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>"],
}
