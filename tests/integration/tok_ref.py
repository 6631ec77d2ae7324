"""Reference tokenizers for tests/integration/test_tokenizer.py and
bench/tokenizer_bench.py: HF tokenizers objects and the tokenizer.json
files ferry reads, built from the data in ../shared/tokenizers.

    llama2  the real tokenizer.json (HF reads a copy without the three
            merges holding a space, which it refuses; ferry skips them)
    llama3  encoder.json + vocab.bpe, the Split regex + ByteLevel, ignore_merges,
            special tokens 128000-128255, a <|begin_of_text|> template
    qwen2   vocab.json + merges.txt, NFC, Qwen's regex + ByteLevel, the added
            tokens of tokenizer_config.json, merges written as "a b" strings
Each is laid out as the HF files are: built with the `tokenizers` library and
saved by it.
"""

import json
import random
import shutil
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

SHARED = Path(__file__).resolve().parents[3] / "shared" / "tokenizers"

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
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


def build_llama3(out):
    vocab = json.loads((SHARED / "llama3" / "encoder.json").read_text(encoding="utf-8"))
    lines = (SHARED / "llama3" / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    special = json.loads((SHARED / "llama3" / "special_tokens_llama3.1-3.2_hf.json").read_text())
    tok.add_special_tokens([AddedToken(special[str(i)], special=True, normalized=False)
                            for i in range(128000, 128256)])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", 128000)])])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
        "chat_template": (SHARED / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja").read_text()}))
    return Tokenizer.from_file(str(out / "tokenizer.json"))


def build_qwen2(out):
    vocab = json.loads((SHARED / "qwen2" / "vocab.json").read_text(encoding="utf-8"))
    lines = (SHARED / "qwen2" / "merges.txt").read_text(encoding="utf-8").split("\n")
    merges = [tuple(l.split(" ")) for l in lines if l and not l.startswith("#version")]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    cfg = json.loads((SHARED / "qwen2" / "tokenizer_config.json").read_text())
    dec = cfg["added_tokens_decoder"]
    tok.add_tokens([AddedToken(dec[i]["content"], single_word=dec[i]["single_word"], lstrip=dec[i]["lstrip"],
                               rstrip=dec[i]["rstrip"], normalized=dec[i]["normalized"], special=dec[i]["special"])
                    for i in sorted(dec, key=int)])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    # Qwen's own file writes merges as "a b" strings: test that form here
    j = json.loads(path.read_text(encoding="utf-8"))
    j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
    j["model"]["continuing_subword_prefix"] = ""
    j["model"]["end_of_word_suffix"] = ""
    path.write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    shutil.copy(str(SHARED / "qwen2" / "tokenizer_config.json"), str(out / "tokenizer_config.json"))
    return Tokenizer.from_file(str(path))


def build_llama2(out):
    """ferry reads the real file; HF refuses its three merges that hold a space
    (see engine/text/tokenizer.h), so HF reads a copy without them."""
    out.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(str(SHARED / "llama2" / f), str(out / f))
    j = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    j["model"]["merges"] = [m for m in j["model"]["merges"] if m.count(" ") == 1]
    return Tokenizer.from_str(json.dumps(j))


BUILDERS = {"llama2": build_llama2, "llama3": build_llama3, "qwen2": build_qwen2}
SPECIALS = {
    "llama2": ["<s>", "</s>", "<unk>"],
    "llama3": ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|reserved_special_token_5|>", "<|python_tag|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>"],
}
