#!/usr/bin/env python3
"""Hugging Face tokenizer folders built from llama.cpp's vocabularies.

    python scripts/vocab_to_hf.py LLAMA_CPP_MODELS_DIR OUT_DIR

For each tokenizer below, reads LLAMA_CPP_MODELS_DIR/ggml-vocab-NAME.gguf
with the `gguf` package (tokens, token types, merges or SentencePiece
scores, BOS/EOS/UNK ids, add_bos_token) and writes OUT_DIR/NAME/
tokenizer.json (built and saved by the `tokenizers` library, laid out as
the model's own Hugging Face file is) and tokenizer_config.json.

    llama-spm       Llama 2 (SentencePiece, 32000): BPE with byte fallback, unk
                    <unk>, fuse_unk, merges derived from the vocabulary and
                    scores as transformers' SentencePieceExtractor does,
                    Prepend("▁") + Replace(" ", "▁"), the Replace/ByteFallback/
                    Fuse/Strip decoder, "<s> $A"; add_bos_token
    phi-3           Phi-3 (the Llama 2 layout with its added tokens)
    llama-bpe       Llama 3: its Split regex + ByteLevel, ignore_merges, special
                    tokens 128000-128255, "<|begin_of_text|> $A", the Llama 3.1
                    chat template
    qwen2           Qwen2 (Qwen1.5's vocabulary and control tokens): NFC, Qwen's
                    regex + ByteLevel, merges written as "a b" strings as Qwen's
                    file does, the Qwen2.5 chat template
    qwen35          Qwen3.5's regex (letters with their marks) on the same vocabulary
    gpt-2           GPT-2: ByteLevel with its built-in regex
    mpt             GPT-NeoX's vocabulary (MPT): ByteLevel, the runs of spaces
                    as added tokens
    starcoder       StarCoder: digits split one by one, then ByteLevel
    deepseek-llm    DeepSeek LLM: its sequence of Split regexes + ByteLevel
    deepseek-coder  DeepSeek Coder: likewise
    falcon          Falcon: punctuation runs, ByteLevel, digit groups of three

Pre-tokenizer regexes are those of the models' own tokenizer.json, as
llama.cpp's src/llama-vocab.cpp quotes them per pre-tokenizer type (where
llama.cpp splits with several regexes in turn, a Sequence of Split
pre-tokenizers does the same). Tokens of type control (3) or user-defined
(4) become added tokens (special for control); the "[PADn]" fillers a
converter appends up to the model's vocabulary size are left out.

The check: every case of ggml-vocab-NAME.gguf.inp (cases end with
"\\n__ggml_vocab_test__\\n"), encoded by HF tokenizers from the written
tokenizer.json with add_special_tokens=False (as llama.cpp's
convert_hf_to_gguf_update.py made the vectors with transformers), must give
the ids of the same line of .gguf.out. A mismatch exits non-zero naming the
tokenizer and the case, so a wrong reference is never built.

The script writes into OUT_DIR only (scripts/fetch_refdata.sh renames it
into place).
"""

import json
import sys
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

SEP = "\n__ggml_vocab_test__\n"

# the models' tokenizer.json regexes (llama-vocab.cpp quotes them; it runs adapted forms)
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM_REGEXES = [
    "[\r\n]",
    ("\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
     "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
     "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
     "\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
     "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
     "\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
     "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
     "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
     "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
     "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
     "\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"),
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
]
DEEPSEEK_CODER_REGEXES = ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
                          "\\p{N}"]

CONTROL, USER_DEFINED = 3, 4


class Mismatch(Exception):
    pass


def read_gguf(path):
    r = gguf.GGUFReader(str(path))

    def get(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()
    return {
        "model": get("tokenizer.ggml.model"), "pre": get("tokenizer.ggml.pre"),
        "tokens": get("tokenizer.ggml.tokens"), "types": get("tokenizer.ggml.token_type"),
        "scores": get("tokenizer.ggml.scores"), "merges": get("tokenizer.ggml.merges"),
        "bos": get("tokenizer.ggml.bos_token_id"), "eos": get("tokenizer.ggml.eos_token_id"),
        "unk": get("tokenizer.ggml.unknown_token_id"), "pad": get("tokenizer.ggml.padding_token_id"),
        "add_bos": get("tokenizer.ggml.add_bos_token"), "add_eos": get("tokenizer.ggml.add_eos_token"),
    }


def is_filler(tok, i):
    return tok == "[PAD%d]" % i


def kept_ids(g):
    """Token ids that are real tokens (no [PADn] fillers)."""
    return [i for i, t in enumerate(g["tokens"]) if not is_filler(t, i)]


def added_tokens(g, normalized=False, skip=()):
    """Control and user-defined tokens as AddedTokens (control ones special)."""
    out = []
    for i in kept_ids(g):
        ty = g["types"][i]
        if ty in (CONTROL, USER_DEFINED) and i not in skip:
            out.append(AddedToken(g["tokens"][i], special=ty == CONTROL, normalized=normalized or ty == USER_DEFINED,
                                  single_word=False, lstrip=False, rstrip=False))
    return out


def spm_merges(vocab, scores):
    """The merges transformers' SentencePieceExtractor derives from a
    SentencePiece vocabulary: every split of a piece into two pieces of the
    vocabulary, ordered by the piece's score, highest first, ties by the ids
    of the left and then the right half (the order of the extractor that
    wrote Llama 2's published tokenizer.json, which this reproduces merge
    for merge; later extractors order ties by the merged piece's id)."""
    merges = []
    for piece, score in scores:
        if not score:  # the extractor skips score 0 (<unk>, <s>, </s>, bytes)
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-score, vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: m[:3])
    return [(m[3], m[4]) for m in merges]


def build_spm(g):
    ids = kept_ids(g)
    # the SentencePiece model's own pieces: everything up to the first added
    # token appended after it (Phi-3's <|endoftext|>, ...)
    n_sp = len(g["tokens"])
    for i in range(len(g["tokens"]) - 1, -1, -1):
        if g["types"][i] in (1, 6):
            n_sp = i + 1
            break
    vocab = {g["tokens"][i]: i for i in ids if i < n_sp}
    merges = spm_merges(vocab, [(g["tokens"][i], g["scores"][i]) for i in range(n_sp)])
    unk = g["tokens"][g["unk"]] if g["unk"] is not None else None
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    # Llama 2's file: <unk>, <s>, </s> special, with normalized true
    first = [i for i in range(3) if g["types"][i] in (2, CONTROL, USER_DEFINED)]
    tok.add_special_tokens([AddedToken(g["tokens"][i], special=True, normalized=True) for i in first])
    tok.add_tokens(added_tokens(g, skip=set(first)))
    bos = g["tokens"][g["bos"]]
    if g["add_bos"]:
        tok.post_processor = processors.TemplateProcessing(single="%s $A" % bos, pair="%s $A %s $B:1" % (bos, bos),
                                                           special_tokens=[(bos, g["bos"])])
    return tok


def byte_level(g, pre, normalizer=None, ignore_merges=False, bos_template=False):
    ids = kept_ids(g)
    vocab = {g["tokens"][i]: i for i in ids}
    merges = []
    for m in g["merges"]:
        a, sp, b = m.partition(" ")
        if not sp or " " in b or not a:
            raise Mismatch("merge %r does not split at one space" % m)
        merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_tokens(added_tokens(g))
    if bos_template:
        bos = g["tokens"][g["bos"]]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(single="%s $A" % bos, pair="%s $A %s:1 $B:1" % (bos, bos),
                                          special_tokens=[(bos, g["bos"])])])
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    return tok


def split(regex, behavior="isolated"):
    return pre_tokenizers.Split(Regex(regex), behavior, invert=False)


def bl(use_regex):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=use_regex)


def build_llama3(g):
    return byte_level(g, pre_tokenizers.Sequence([split(LLAMA3_REGEX), bl(False)]), ignore_merges=True,
                      bos_template=True)


def build_qwen2(g):
    return byte_level(g, pre_tokenizers.Sequence([split(QWEN2_REGEX), bl(False)]), normalizer=normalizers.NFC())


def build_qwen35(g):
    # no normalizer: the vectors keep e + U+0301 as two pieces
    return byte_level(g, pre_tokenizers.Sequence([split(QWEN35_REGEX), bl(False)]))


def build_gpt2(g):
    return byte_level(g, bl(True))


def build_starcoder(g):
    # StarCoder's file: Digits(individual_digits) + ByteLevel; the same split as a regex
    return byte_level(g, pre_tokenizers.Sequence([split(r"\p{N}"), bl(True)]))


def build_deepseek_llm(g):
    return byte_level(g, pre_tokenizers.Sequence([split(r) for r in DEEPSEEK_LLM_REGEXES] + [bl(False)]))


def build_deepseek_coder(g):
    return byte_level(g, pre_tokenizers.Sequence([split(r) for r in DEEPSEEK_CODER_REGEXES] + [bl(False)]))


def build_falcon(g):
    # Falcon's file: Punctuation(contiguous), ByteLevel, Digits, Split([0-9]{3}) - as regexes
    return byte_level(g, pre_tokenizers.Sequence([
        split(r"[\p{P}!-/:-@\[-`{-~]+"), bl(True), split(r"[0-9]+"), split(r"[0-9][0-9][0-9]")]))


def qwen_layout(path):
    """Qwen's own file: merges as "a b" strings, "" for the subword prefix
    and suffix."""
    j = json.loads(path.read_text(encoding="utf-8"))
    j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
    j["model"]["continuing_subword_prefix"] = ""
    j["model"]["end_of_word_suffix"] = ""
    path.write_text(json.dumps(j, ensure_ascii=False, indent=2), encoding="utf-8")


# name: (builder, chat template in models/templates, tokenizer.json rewrite)
RECIPES = {
    "llama-spm": (build_spm, None, None),
    "phi-3": (build_spm, None, None),
    "llama-bpe": (build_llama3, "meta-llama-Llama-3.1-8B-Instruct.jinja", None),
    "qwen2": (build_qwen2, "Qwen-Qwen2.5-7B-Instruct.jinja", qwen_layout),
    "qwen35": (build_qwen35, None, qwen_layout),
    "gpt-2": (build_gpt2, None, None),
    "mpt": (build_gpt2, None, None),
    "starcoder": (build_starcoder, None, None),
    "deepseek-llm": (build_deepseek_llm, None, None),
    "deepseek-coder": (build_deepseek_coder, None, None),
    "falcon": (build_falcon, None, None),
}


def added_token_json(t):
    return {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
            "single_word": t.single_word, "special": t.special}


def token_or_none(g, key):
    i = g[key]
    return g["tokens"][i] if i is not None and 0 <= i < len(g["tokens"]) else None


def config(name, g, tok, models_dir, template):
    spm = g["model"] == "llama"
    add_bos = g["add_bos"]
    if add_bos is None:  # llama.cpp: llama-bpe adds BOS, as HF's Llama 3 file does; the others do not
        add_bos = g["pre"] in ("llama-bpe", "llama3")
    cfg = {
        "add_bos_token": bool(add_bos),
        "add_eos_token": bool(g["add_eos"]),
        "added_tokens_decoder": {str(i): added_token_json(t) for i, t in sorted(tok.get_added_tokens_decoder().items())},
        "bos_token": token_or_none(g, "bos"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token_or_none(g, "eos"),
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": token_or_none(g, "pad"),
        "tokenizer_class": "LlamaTokenizer" if spm else "PreTrainedTokenizerFast",
        "unk_token": token_or_none(g, "unk"),
    }
    if spm:  # Llama 2's file writes them as AddedToken objects
        for k in ("bos_token", "eos_token", "unk_token"):
            if cfg[k] is not None:
                cfg[k] = {"__type": "AddedToken", "content": cfg[k], "lstrip": False, "normalized": True,
                          "rstrip": False, "single_word": False}
    if template:
        cfg["chat_template"] = (models_dir / "templates" / template).read_text(encoding="utf-8")
    return cfg


def cases(models_dir, name):
    base = models_dir / ("ggml-vocab-%s.gguf" % name)
    texts = (base.parent / (base.name + ".inp")).read_text(encoding="utf-8").split(SEP)
    outs = (base.parent / (base.name + ".out")).read_text(encoding="utf-8").split("\n")
    if texts[-1] != "" or len(texts) != len(outs):
        raise Mismatch("%s: %d cases in .inp, %d lines in .out" % (name, len(texts) - 1, len(outs) - 1))
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts[:-1], outs[:-1])]


def check(name, path, models_dir):
    hf = Tokenizer.from_file(str(path))
    vectors = cases(models_dir, name)
    for k, (text, want) in enumerate(vectors):
        got = hf.encode(text, add_special_tokens=False).ids
        if got != want:
            raise Mismatch("%s: case %d %r: HF tokenizers gives %s, %s.out says %s" % (
                name, k, text[:200], got, name, want))
    return len(vectors)


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    models_dir, out = Path(argv[1]), Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for name, (build, template, rewrite) in RECIPES.items():
        g = read_gguf(models_dir / ("ggml-vocab-%s.gguf" % name))
        tok = build(g)
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        path = d / "tokenizer.json"
        tok.save(str(path))
        if rewrite:
            rewrite(path)
        cfg = config(name, g, tok, models_dir, template)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=2) + "\n",
                                                 encoding="utf-8")
        try:
            n = check(name, path, models_dir)
        except Mismatch as e:
            print("vocab_to_hf: %s" % e, file=sys.stderr)
            return 1
        print("vocab_to_hf: %s: %d tokens, %d cases of llama.cpp's vectors match" % (
            name, tok.get_vocab_size(with_added_tokens=True), n), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
