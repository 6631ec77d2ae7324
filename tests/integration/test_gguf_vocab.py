"""A GGUF file's tokenizer as Hugging Face files (engine/weights/gguf_vocab.c):
the tokenizer.json and tokenizer_config.json that build/tests/gguf_tool
--hf-file writes from the tokenizer.ggml.* metadata.

The references, none of them ferry's: llama.cpp's tokenization vectors
(ggml-vocab-NAME.gguf.inp/.out, made with transformers), which ferry's
tokenizer (build/tests/tok_tool) and HF tokenizers must both reproduce from
the written files; scripts/vocab_to_hf.py's files (build/ref/tokenizers),
which the written ones must equal; SmolLM2's tokenizer as
scripts/gguf_to_hf.py converted it (build/smollm2-135m-instruct), which the
one written from its GGUF must tokenize like on real text. Then small files
the `gguf` package writes, each wrong in one way, refused naming the key.
"""

import importlib
import json
import struct
import sys

import pytest

import refdata
from test_gguf import layout, run_tool, write_gguf
from test_tokenizer import Ferry, check_decode, hf_encode, llama_cpp_vectors
from tok_ref import CORPUS, mixed_text

tokenizers = refdata.client("tokenizers")
from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, str(refdata.REPO / "scripts"))
vocab_to_hf = importlib.import_module("vocab_to_hf")

# every ggml-vocab-NAME.gguf of build/ref/llama.cpp: built and checked on its vectors,
VECTOR_NAMES = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "qwen35", "gpt-2", "mpt", "starcoder", "deepseek-llm",
                "deepseek-coder", "falcon", "command-r", "refact"]
# built, with no vectors to check (llama.cpp ships none for it),
UNCHECKED = ["baichuan"]
# or refused, the message naming why
REFUSED = {
    "aquila": "tokenizer.ggml.pre is missing",     # llama.cpp's "default" regexes: no HF file has them
    "gpt-neox": "tokenizer.ggml.pre is missing",
    "bert-bge": "tokenizer.ggml.model 'bert' is not supported",   # WordPiece
    "nomic-bert-moe": "tokenizer.ggml.model 't5' is not supported",  # Unigram
    "gemma-4": "tokenizer.ggml.model 'gemma4' is not supported",
}
FILES = ("tokenizer.json", "tokenizer_config.json")


def vocab_gguf(name):
    return refdata.need(refdata.LLAMA_CPP / ("ggml-vocab-%s.gguf" % name))


def smollm2_gguf():
    return next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))


def gguf_string(path, key):
    """A string value of a GGUF file, found by walking its layout as the
    format says (GGUFReader takes seconds on SmolLM2's file)."""
    data = path.read_bytes()
    at = layout(data)["type:" + key]
    assert struct.unpack_from("<I", data, at)[0] == 8, key
    (n,) = struct.unpack_from("<Q", data, at + 4)
    return data[at + 12:at + 12 + n].decode("utf-8")


def hf_file(path, name, out):
    """gguf_tool --hf-file: (exit status, stderr)."""
    p = run_tool("--hf-file", path, name, out)
    return p.returncode, p.stderr.decode("utf-8", "replace")


def hf_dir(path, d):
    """Both files for the GGUF at path, written into the folder d."""
    d.mkdir(parents=True, exist_ok=True)
    for f in FILES:
        rc, err = hf_file(path, f, d / f)
        assert rc == 0, (path, f, err)
    return d


def read_json(path):
    return json.loads(path.read_text(encoding="utf-8"))


# ---- llama.cpp's vocabularies ----------------------------------------------------

def test_every_vocab_gguf_is_written_or_refused(tmp_path):
    names = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in refdata.LLAMA_CPP.glob("ggml-vocab-*.gguf"))
    assert names == sorted(VECTOR_NAMES + UNCHECKED + list(REFUSED)), names
    for name, why in REFUSED.items():
        for f in FILES:
            rc, err = hf_file(vocab_gguf(name), f, tmp_path / f)
            assert rc == 1 and err.startswith("ERR invalid: ") and why in err and err.count("\n") == 1, (name, err)
            assert not (tmp_path / f).exists()


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_llama_cpp_vectors(tmp_path, name):
    """Every case of llama.cpp's vectors, encoded from the written files as
    the vectors were made (special tokens parsed, none added): ferry's
    tokenizer and HF tokenizers both give the .out ids. ferry decodes them
    as HF does."""
    d = hf_dir(vocab_gguf(name), tmp_path / name)
    vectors = llama_cpp_vectors(name)
    got = Ferry(d).encode([(t, False, True) for t, _ in vectors])
    bad = ["case %d %r:\n  ferry %s\n  .out  %s" % (k, t[:120], g, w)
           for k, ((t, w), g) in enumerate(zip(vectors, got)) if g != w]
    assert not bad, "%s: %d of %d cases differ:\n%s" % (name, len(bad), len(vectors), "\n".join(bad))
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    bad = [k for k, (t, w) in enumerate(vectors) if hf.encode(t, add_special_tokens=False).ids != w]
    assert not bad, "%s: HF tokenizers differs from .out on cases %s" % (name, bad)
    ids = [w for _, w in vectors]
    check_decode(hf, Ferry(d), ids + [sum(ids, [])], name)


@pytest.mark.parametrize("name", sorted(p for p in VECTOR_NAMES if p not in ("command-r", "refact")))
def test_same_files_as_vocab_to_hf(tmp_path, name):
    """The files equal scripts/vocab_to_hf.py's (built with `tokenizers`),
    but for what the GGUF says that script leaves out: DeepSeek's
    add_bos_token (a BOS template), the GGUF's own chat template (the script
    takes llama.cpp's templates/ files) and its context length."""
    d = hf_dir(vocab_gguf(name), tmp_path / name)
    ref = refdata.tokenizer_dir(name)
    got, want = read_json(d / "tokenizer.json"), read_json(ref / "tokenizer.json")
    if name.startswith("deepseek"):
        bos = got["post_processor"]["processors"][1]
        assert bos["single"][0] == {"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, bos
        got["post_processor"] = got["post_processor"]["processors"][0]
    assert got == want
    got, want = read_json(d / "tokenizer_config.json"), read_json(ref / "tokenizer_config.json")
    for k in ("chat_template", "model_max_length"):
        got.pop(k, None)
        want.pop(k, None)
    assert got == want


def test_sentencepiece_without_vectors_loads(tmp_path):
    """Baichuan's SentencePiece vocabulary (no vectors): ferry and HF read
    the written file alike."""
    d = hf_dir(vocab_gguf("baichuan"), tmp_path / "baichuan")
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = CORPUS[:20]
    got = Ferry(d).encode([(t, True, True) for t in texts])
    assert got == [hf_encode(hf, t, True, True) for t in texts]
    assert got[0][0] == 1  # add_bos_token: llama.cpp's default for SentencePiece, the file has no key


# ---- SmolLM2: the whole model's tokenizer ------------------------------------------------

def chat_text():
    turns = [("system", "You are a helpful assistant."), ("user", "Write `fib(n)` in C, then say 你好 and 🦀."),
             ("assistant", "int fib(int n) {\n    return n < 2 ? n : fib(n - 1) + fib(n - 2);\n}\n你好 🦀")]
    return "".join("<|im_start|>%s\n%s<|im_end|>\n" % t for t in turns) + "<|im_start|>assistant\n"


def test_smollm2_tokenizes_as_its_converted_checkpoint(tmp_path):
    """SmolLM2's GGUF written here and its checkpoint's tokenizer.json
    (scripts/gguf_to_hf.py) are the same file, and ferry gives the same ids
    from both on a few kB of code, prose, scripts, emoji and chat markup -
    as HF tokenizers does from the written file."""
    d = hf_dir(smollm2_gguf(), tmp_path / "smollm2")
    ref = refdata.smollm2()
    assert read_json(d / "tokenizer.json") == read_json(ref / "tokenizer.json")
    texts = CORPUS + [chat_text(), mixed_text(6000, ["<|im_start|>", "<|im_end|>", "<|endoftext|>"])]
    items = [(t, a, p) for t in texts for a in (False, True) for p in (False, True)]
    got = Ferry(d).encode(items)
    assert got == Ferry(ref).encode(items)
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert got == [hf_encode(hf, t, a, p) for t, a, p in items]
    assert len(got[-4]) > 1000


def test_smollm2_config(tmp_path):
    """tokenizer_config.json: the GGUF's chat template, and every field the
    converted checkpoint's file also has the same but tokenizer_class (the
    written file names the generic fast class: tokenizer.json says all)."""
    d = hf_dir(smollm2_gguf(), tmp_path / "smollm2")
    got, want = read_json(d / "tokenizer_config.json"), read_json(refdata.smollm2() / "tokenizer_config.json")
    template = gguf_string(smollm2_gguf(), "tokenizer.chat_template")
    assert got["chat_template"] == template and "<|im_start|>" in template
    assert (got["bos_token"], got["eos_token"], got["pad_token"]) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert got["tokenizer_class"] == "PreTrainedTokenizerFast" and want["tokenizer_class"] == "GPT2Tokenizer"
    both = (set(got) & set(want)) - {"tokenizer_class"}
    assert {k for k in both if got[k] != want[k]} == set()
    assert {"add_bos_token", "eos_token", "added_tokens_decoder", "chat_template", "model_max_length"} <= both


# ---- small files, one thing changed ---------------------------------------------------------

BPE = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
       "tokenizer.ggml.tokens": ["a", "b", "ab", "<|endoftext|>", "[PAD4]"],
       "tokenizer.ggml.token_type": [1, 1, 1, 3, 4],
       "tokenizer.ggml.merges": ["a b"],
       "tokenizer.ggml.bos_token_id": 3, "tokenizer.ggml.eos_token_id": 3}

# SentencePiece: pieces with scores (ties, a two-byte character), then an added token
SPM_TOKENS = ["<unk>", "<s>", "</s>", "▁", "a", "b", "é", "▁a", "ab", "▁ab", "aé", "éb", "▁aé", "<|end|>"]
SPM_SCORES = [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -3.0, -4.0, -4.0, -5.0, -4.0, -6.0, -7.0, 0.0]
SPM = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": SPM_TOKENS, "tokenizer.ggml.scores": SPM_SCORES,
       "tokenizer.ggml.token_type": [2, 3, 3] + [1] * 10 + [3],
       "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0}


def small(tmp_path, base, **changes):
    """A GGUF of base's metadata with changes (a key "x.y" given as x__y;
    None removes it)."""
    kv = dict(base)
    for k, v in changes.items():
        k = k.replace("__", ".")
        if v is None:
            kv.pop(k)
        else:
            kv[k] = v
    return write_gguf(tmp_path / "t.gguf", [], kv)


def refused(path, *words):
    for f in FILES:
        out = path.parent / ("out-" + f)
        rc, err = hf_file(path, f, out)
        assert rc == 1 and err.startswith("ERR invalid: %s: " % path) and err.count("\n") == 1, (f, err)
        for w in words:
            assert w in err, (w, err)
        assert not out.exists()


def test_small_byte_level_file(tmp_path):
    """The good file: the [PAD4] filler left out, <|endoftext|> special,
    gpt-2's ByteLevel, no BOS (llama.cpp adds none for gpt-2)."""
    d = hf_dir(small(tmp_path, BPE), tmp_path / "t")
    j = read_json(d / "tokenizer.json")
    assert j["model"]["vocab"] == {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}
    assert j["model"]["merges"] == [["a", "b"]]
    assert [(t["id"], t["content"], t["special"]) for t in j["added_tokens"]] == [(3, "<|endoftext|>", True)]
    cfg = read_json(d / "tokenizer_config.json")
    assert (cfg["add_bos_token"], cfg["bos_token"], cfg["unk_token"]) == (False, "<|endoftext|>", None)
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = ["ab", "abab<|endoftext|>ba", "ba"]
    assert Ferry(d).encode([(t, True, True) for t in texts]) == [hf_encode(hf, t, True, True) for t in texts]
    assert hf_encode(hf, "ab<|endoftext|>", True, True) == [2, 3]
    # a merge given twice: llama.cpp ranks it by the first, so only that one is written
    d = hf_dir(small(tmp_path, BPE, tokenizer__ggml__merges=["a b", "a b"]), tmp_path / "twice")
    assert read_json(d / "tokenizer.json")["model"]["merges"] == [["a", "b"]]
    # add_bos_token and add_eos_token: a template
    d = hf_dir(small(tmp_path, BPE, tokenizer__ggml__add_bos_token=True, tokenizer__ggml__add_eos_token=True),
               tmp_path / "bos")
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert hf_encode(hf, "ab", True, True) == [3, 2, 3] == Ferry(d).encode([("ab", True, True)])[0]


def test_sentencepiece_merges_are_vocab_to_hf_s(tmp_path):
    """The merges derived from the scores, in order (ties by id), are what
    vocab_to_hf.py's spm_merges derives; <|end|> after the pieces is an
    added token at its GGUF id; without tokenizer.ggml.add_space_prefix no
    "▁" is prepended (and none stripped when decoding)."""
    d = hf_dir(small(tmp_path, SPM), tmp_path / "spm")
    j = read_json(d / "tokenizer.json")
    vocab = {t: i for i, t in enumerate(SPM_TOKENS[:-1])}
    assert j["model"]["vocab"] == vocab
    want = vocab_to_hf.spm_merges(vocab, list(zip(SPM_TOKENS, SPM_SCORES))[:-1])
    assert [tuple(m) for m in j["model"]["merges"]] == want and len(want) == 8, (j["model"]["merges"], want)
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    texts = ["ab", " aé ab", "aéb<|end|>ab", "xyz"]
    got = Ferry(d).encode([(t, True, True) for t in texts])
    assert got == [hf_encode(hf, t, True, True) for t in texts]
    assert got[0] == [1, 9] and got[2] == [1, 7, 11, 13, 9]  # <s> ▁ab; <s> ▁a éb <|end|> ▁ab
    d = hf_dir(small(tmp_path, SPM, tokenizer__ggml__add_space_prefix=False), tmp_path / "bare")
    j = read_json(d / "tokenizer.json")
    assert j["normalizer"]["type"] == "Replace" and "Strip" not in json.dumps(j["decoder"])
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    assert Ferry(d).encode([("ab", True, True)])[0] == hf_encode(hf, "ab", True, True) == [1, 8]


def test_refused_naming_the_key(tmp_path):
    """Each file wrong in one way: exit status 1, one line on stderr naming
    the file, the key and the value, nothing written."""
    def bpe(**kw):
        return small(tmp_path, BPE, **kw)

    refused(bpe(tokenizer__ggml__pre="no-such-pre"), "tokenizer.ggml.pre 'no-such-pre' is not a pre-tokenizer")
    refused(bpe(tokenizer__ggml__pre=None), "tokenizer.ggml.pre is missing")
    refused(bpe(tokenizer__ggml__model="bert"), "tokenizer.ggml.model 'bert' is not supported")
    refused(bpe(tokenizer__ggml__model=None), "tokenizer.ggml.model is missing")
    refused(bpe(tokenizer__ggml__token_type=[1, 1, 1, 3]), "tokenizer.ggml.token_type has 4 entries for 5 tokens")
    refused(bpe(tokenizer__ggml__token_type=["1"] * 5), "tokenizer.ggml.token_type is an array of string")
    refused(bpe(tokenizer__ggml__bos_token_id=5), "tokenizer.ggml.bos_token_id 5 is not a token id (5 tokens)")
    refused(bpe(tokenizer__ggml__eos_token_id=4), "tokenizer.ggml.eos_token_id 4 is '[PAD4]', which the tokenizer "
                                                  "leaves out")
    refused(bpe(tokenizer__ggml__bos_token_id="3"), "tokenizer.ggml.bos_token_id")
    refused(bpe(tokenizer__ggml__merges=["ab"]), "tokenizer.ggml.merges[0] 'ab' does not split at one space")
    refused(bpe(tokenizer__ggml__merges=["a b", "a  b"]), "tokenizer.ggml.merges[1] 'a  b' does not split")
    refused(bpe(tokenizer__ggml__merges=["a x"]), "tokenizer.ggml.merges[0] 'a x': its second half is not in")
    refused(bpe(tokenizer__ggml__merges=["b a"]), "tokenizer.ggml.merges[0] 'b a': the merged token is not in")
    refused(bpe(tokenizer__ggml__merges=None), "tokenizer.ggml.merges is missing")
    refused(bpe(tokenizer__ggml__tokens=["a", "b", "ab", "a", "c"]), "tokenizer.ggml.tokens[0] and [3] are both 'a'")
    refused(bpe(tokenizer__ggml__tokens=["a", "b", "ab", "", "c"]), "tokenizer.ggml.tokens[3] '' is empty")
    refused(bpe(tokenizer__ggml__tokens=["a", "b", "ab", b"\xff\xfe", "c"]),
            "tokenizer.ggml.tokens[3] '\\xff\\xfe' is not UTF-8")
    refused(bpe(tokenizer__ggml__add_bos_token=1), "tokenizer.ggml.add_bos_token is a uint32, not a bool")
    refused(bpe(tokenizer__ggml__bos_token_id=None, tokenizer__ggml__add_bos_token=True),
            "tokenizer.ggml.bos_token_id is missing")

    def spm(**kw):
        return small(tmp_path, SPM, **kw)

    refused(spm(tokenizer__ggml__scores=None), "tokenizer.ggml.scores is missing")
    refused(spm(tokenizer__ggml__scores=SPM_SCORES[:-1]), "tokenizer.ggml.scores has 13 entries for 14 tokens")
    refused(spm(tokenizer__ggml__scores=[float("nan")] * 14), "tokenizer.ggml.scores[0] is not a number")
    refused(spm(tokenizer__ggml__unknown_token_id=13), "tokenizer.ggml.unknown_token_id 13 '<|end|>' is not one of "
                                                       "the SentencePiece pieces")
    refused(spm(tokenizer__ggml__remove_extra_whitespaces=True), "tokenizer.ggml.remove_extra_whitespaces")
    # a token after the pieces that is neither added nor a piece: <|end|> would not keep its id
    refused(spm(tokenizer__ggml__tokens=SPM_TOKENS[:-1] + ["<unused>", "<|end|>"],
                tokenizer__ggml__scores=SPM_SCORES + [0.0], tokenizer__ggml__token_type=[2, 3, 3] + [1] * 10 + [5, 3]),
            "tokenizer.ggml.tokens[14] '<|end|>' (type 3) would be id 13 in a tokenizer.json")
