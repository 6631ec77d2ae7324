"""The tokenizer (text/) against HF tokenizers, bit for bit.

Reference tokenizers: the tokenizer.json files `make deps` builds with the
`tokenizers` library from llama.cpp's real vocabularies
(scripts/vocab_to_hf.py, build/ref/tokenizers, refdata.py; tok_ref.py):
Llama 2 (llama-spm: SentencePiece-style BPE, byte fallback, pair merges),
Llama 3 (llama-bpe: pair merges, ignore_merges, a BOS template) and Qwen2
(NFC, string merges, with Qwen2.5's added tokens, special and not), each
compared with HF tokenizers on a corpus. Every tokenizer built there
(Llama 2 and 3, Phi-3, Qwen2, Qwen3.5, GPT-2, MPT, StarCoder, DeepSeek LLM
and Coder, Falcon) is also run on llama.cpp's own tokenization vectors
(ggml-vocab-NAME.gguf.inp/.out, made with transformers). A small file
written here holds what Llama 2's published tokenizer.json has and the
built one lacks: "a b" string merges, three of them with a literal space.
Plus small tokenizers trained here and varied over the options
tokenizer.json can hold (normalizers, pre-tokenizers, decoders, added-token
flags, byte fallback), to reach the paths the real files do not.

Cases run in batches through build/tests/tok_tool (one process per
tokenizer); the CLI (`ferry tokenize` / `detokenize`) is checked separately.
Every comparison is exact: ids, decoded text, and the stream decode (ids
pushed one at a time) against the whole decode.
"""

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

import refdata
from conftest import assert_ferry_error, ferry_path

tokenizers = refdata.client("tokenizers")
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from tok_ref import BUILDERS, CORPUS, LLAMA3_REGEX, MIXED_PARTS, NAMES, SPECIALS, mixed_text  # noqa: E402


# ---- running ferry's tokenizer --------------------------------------------------

def tool_path():
    return Path(ferry_path()).resolve().parent / "tests" / "tok_tool"


class Ferry:
    """Cases for one tokenizer directory, answered by one tok_tool process."""

    def __init__(self, d):
        self.dir = Path(d)

    def run(self, cases):
        tool = tool_path()
        if not os.access(str(tool), os.X_OK):
            pytest.fail("%s not built (make unit or make integration builds it)" % tool)
        buf = bytearray()
        for c in cases:
            if c[0] == "E":
                text = c[3].encode() if isinstance(c[3], str) else c[3]
                buf += b"E %d %d %d\n" % (c[1], c[2], len(text)) + text + b"\n"
            else:
                buf += ("%s %d %d %s\n" % (c[0], c[1], len(c[2]), " ".join(map(str, c[2])))).encode()
        path = self.dir / "cases.bin"
        path.write_bytes(bytes(buf))
        p = subprocess.run([str(tool), str(self.dir), "--cases", str(path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=300)
        out = p.stdout.decode().splitlines()
        assert p.returncode == 0 and len(out) == len(cases), \
            "tok_tool rc=%d, %d answers for %d cases: %s %s" % (p.returncode, len(out), len(cases), out[:3],
                                                               p.stderr.decode()[-2000:])
        return out

    def encode(self, items):
        """items: (text, add_special, parse_special) -> list of id lists (or 'ERR ...')."""
        res = []
        for line in self.run([("E", int(a), int(p), t) for t, a, p in items]):
            res.append([int(x) for x in line.split()[1:]] if line.startswith("OK") else line)
        return res

    def decode(self, items, stream=True):
        """items: (ids, skip_special) -> list of (stream text, whole text) as bytes (or 'ERR ...')."""
        res = []
        for line in self.run([("S" if stream else "D", int(s), ids) for ids, s in items]):
            if not line.startswith("OK"):
                res.append(line)
                continue
            f = [b"" if x == "-" else bytes.fromhex(x) for x in line.split()[1:]]
            res.append((f[0], f[1]) if stream else (f[0], f[0]))
        return res


def hf_encode(tok, text, add_special, parse_special):
    tok.encode_special_tokens = not parse_special
    try:
        return tok.encode(text, add_special_tokens=add_special).ids
    finally:
        tok.encode_special_tokens = False


def check_encode(hf, fe, texts, label):
    items = [(t, a, p) for t in texts for a in (False, True) for p in (False, True)]
    got = fe.encode(items)
    bad = []
    for (t, a, p), g in zip(items, got):
        want = hf_encode(hf, t.decode("utf-8", "replace") if isinstance(t, bytes) else t, a, p)
        if g != want:
            bad.append("%s: encode(%r, add_special=%s, parse_special=%s)\n  ferry %s\n  hf    %s" % (
                label, t[:80], a, p, str(g)[:300], str(want)[:300]))
    assert not bad, "%d of %d encodes differ:\n%s" % (len(bad), len(items), "\n".join(bad[:8]))


def check_decode(hf, fe, id_lists, label):
    items = [(ids, s) for ids in id_lists for s in (False, True)]
    got = fe.decode(items)
    bad = []
    for (ids, s), g in zip(items, got):
        want = hf.decode(ids, skip_special_tokens=s).encode()
        if isinstance(g, str) or g[1] != want or g[0] != g[1]:
            bad.append("%s: decode(%s, skip_special=%s)\n  ferry  %r\n  stream %r\n  hf     %r" % (
                label, ids[:20], s, g if isinstance(g, str) else g[1][:200], "" if isinstance(g, str) else g[0][:200],
                want[:200]))
    assert not bad, "%d of %d decodes differ:\n%s" % (len(bad), len(items), "\n".join(bad[:8]))


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    cache = {}

    def get(name):
        if name not in cache:
            t0 = time.time()
            hf = BUILDERS[name](root / name)
            cache[name] = (hf, Ferry(root / name))
            print("built %s in %.2f s" % (name, time.time() - t0))
        return cache[name]
    return get


def corpus_for(name):
    sp = SPECIALS[name]
    return CORPUS + ["user text with %s in it" % s for s in sp] + ["".join(sp), " ".join(sp) + " "]


@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_hf(real, name):
    hf, fe = real(name)
    check_encode(hf, fe, corpus_for(name), name)


@pytest.mark.parametrize("name", NAMES)
def test_encode_invalid_utf8_as_replacement(real, name):
    """Raw bytes that are not UTF-8: ferry encodes what HF encodes for
    bytes.decode('utf-8', 'replace') (what a caller must pass HF)."""
    hf, fe = real(name)
    raw = [b"abc\xff\xfedef", b"\xe4\xb8 half", b"end\xf0\x9f\x98", b"\xc0\xaf overlong", b"\xed\xa0\x80 surrogate",
           b"\x80\x80\x80", b"ok \xe4\xb8\xad ok", b"\xf4\x90\x80\x80 beyond", b"\xe0\x80\x80"]
    check_encode(hf, fe, raw, name)


def byte_token_ids(hf, name):
    """Ids that decode to single bytes, for invalid UTF-8 in the output."""
    if name == "llama-spm":
        return {b: hf.token_to_id("<0x%02X>" % b) for b in range(256)}
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: hf.token_to_id(chr(c)) for b, c in zip(bs, cs)}


@pytest.mark.parametrize("name", NAMES)
def test_decode_and_stream_match_hf(real, name):
    hf, fe = real(name)
    lists = [hf_encode(hf, t, True, True) for t in corpus_for(name)]
    byte = byte_token_ids(hf, name)
    word = hf_encode(hf, " hello", False, False)
    # split UTF-8, invalid bytes, byte runs next to words and specials
    for seq in ([0xE4, 0xB8, 0xAD], [0xE4, 0xB8], [0xFF], [0x80, 0x41], [0xF0, 0x9F, 0x98, 0x80], [0xF0, 0x9F],
                [0xE4, 0xB8, 0x41, 0xAD], [0xC3], [0xED, 0xA0, 0x80], [0x20, 0x20]):
        ids = [byte[b] for b in seq]
        lists += [ids, word + ids, ids + word, ids + word + ids]
    specials = [hf.token_to_id(s) for s in SPECIALS[name]]
    lists += [specials, specials + word + specials, word + specials[:1] + [byte[0xE4]] + word]
    rnd = random.Random(1234)
    v = hf.get_vocab_size(with_added_tokens=True)
    lists += [[rnd.randrange(v) for _ in range(rnd.randrange(1, 16))] for _ in range(400)]
    lists += [[rnd.choice(specials + list(byte.values())) for _ in range(rnd.randrange(1, 12))] for _ in range(100)]
    check_decode(hf, fe, lists, name)


@pytest.mark.parametrize("name", NAMES)
def test_one_megabyte(real, name):
    """1 MB of mixed text: the same ids, and their decode (the encode's speed
    is measured by bench/tokenizer_bench.py)."""
    hf, fe = real(name)
    text = mixed_text(1 << 20, SPECIALS[name])
    want = hf_encode(hf, text, True, True)
    got = fe.encode([(text, True, True)])[0]
    assert got == want, "1 MB encode differs at token %d" % next(
        (i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    (stream, whole), = fe.decode([(want, False)])
    assert whole == stream == hf.decode(want, skip_special_tokens=False).encode()


def test_llama3_vocabulary_loads_whole(real):
    """The 128k-token Llama 3 file as one tok_tool process loads it: every
    id of the vocabulary, added tokens included, decodes to HF's text (in
    runs of 64 ids, with and without the specials, whole and streamed). Its
    load time is measured by bench/tokenizer_bench.py."""
    hf, fe = real("llama-bpe")
    v = hf.get_vocab_size(with_added_tokens=True)
    assert v > 128000, v
    check_decode(hf, fe, [list(range(i, min(i + 64, v))) for i in range(0, v, 64)], "llama-bpe vocabulary")


def test_wrong_merge_order_is_caught(real, tmp_path):
    """The comparison can fail: the same file with two merges swapped encodes
    differently somewhere in the corpus."""
    hf, fe = real("qwen2")
    j = json.loads((fe.dir / "tokenizer.json").read_text(encoding="utf-8"))
    m = j["model"]["merges"]
    i = m.index("Ġ t")
    k = m.index("h e")
    m[i], m[k] = m[k], m[i]
    d = tmp_path / "swapped"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(AssertionError):
        check_encode(hf, Ferry(d), ["the other then", " the theme"], "swapped")


# ---- llama.cpp's tokenization vectors --------------------------------------------------------

# every tokenizer scripts/vocab_to_hf.py builds (build/ref/tokenizers/NAME from ggml-vocab-NAME.gguf)
VECTOR_NAMES = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "qwen35", "gpt-2", "mpt", "starcoder", "deepseek-llm",
                "deepseek-coder", "falcon"]
VECTOR_SEP = "\n__ggml_vocab_test__\n"


def llama_cpp_vectors(name):
    """[(text, ids)]: the cases of ggml-vocab-NAME.gguf.inp (each ends with
    VECTOR_SEP) and the ids on the same line of .out, which llama.cpp's
    convert_hf_to_gguf_update.py wrote with transformers'
    encode(text, add_special_tokens=False)."""
    base = refdata.LLAMA_CPP / ("ggml-vocab-%s.gguf" % name)
    texts = refdata.need(str(base) + ".inp").read_text(encoding="utf-8").split(VECTOR_SEP)
    outs = refdata.need(str(base) + ".out").read_text(encoding="utf-8").split("\n")
    assert texts[-1] == "" and len(texts) == len(outs) and outs[-1] == "", "%s: .inp/.out do not pair up" % name
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts[:-1], outs[:-1])]


def test_vector_names_cover_every_built_tokenizer():
    built = sorted(p.name for p in refdata.need(refdata.TOKENIZERS).iterdir() if p.is_dir())
    assert built == sorted(VECTOR_NAMES)


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_llama_cpp_vectors(tmp_path, name):
    """ferry encodes every case of llama.cpp's vectors to exactly the ids
    transformers gave (special tokens parsed, none added, as
    encode(add_special_tokens=False) does), and decodes those ids - whole
    and streamed, special tokens kept and skipped - as HF tokenizers does."""
    src = refdata.tokenizer_dir(name)
    d = tmp_path / name
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((src / f).read_bytes())
    fe = Ferry(d)
    vectors = llama_cpp_vectors(name)
    got = fe.encode([(t, False, True) for t, _ in vectors])
    bad = ["%s case %d %r:\n  ferry %s\n  .out  %s" % (name, k, t[:120], g, w)
           for k, ((t, w), g) in enumerate(zip(vectors, got)) if g != w]
    assert not bad, "%d of %d cases differ from llama.cpp's vectors:\n%s" % (len(bad), len(vectors), "\n".join(bad))
    hf = Tokenizer.from_file(str(d / "tokenizer.json"))
    ids = [w for _, w in vectors]
    check_decode(hf, fe, ids + [sum(ids, [])], name)
    # where HF gives the text back, so does ferry (check_decode: ferry's decode is HF's)
    back = sum(hf.decode(w, skip_special_tokens=False) == t for t, w in vectors)
    print("%s: %d cases, %d decode back to their text" % (name, len(vectors), back))


# ---- Llama 2's published layout: "a b" string merges, three holding a space ---------------------

def test_string_merges_holding_a_space(tmp_path):
    """Llama 2's published tokenizer.json writes its merges as "a b" strings,
    three of them ("   ", "     ", "▁  ") for tokens holding a literal space,
    ambiguous in that form: HF tokenizers refuses the file, ferry skips those
    three (the normalizer turns every space into ▁, so no text reaches them;
    tokenizer.h). The built llama-spm file writes pairs and has none of this,
    so a small file in that layout is made here: ferry on it must be HF on
    the same file without the three merges."""
    j = train(False)
    m = j["model"]
    vocab = m["vocab"]
    for t in (" ", "  ", "    ", "▁ ", "<s>", "</s>"):
        vocab.setdefault(t, len(vocab))
    merges = ["%s %s" % (a, b) for a, b in m["merges"]]
    assert not any(" " in a or " " in b for a, b in m["merges"])
    spaced = ["   ", "     ", "▁  "]  # (" ", " "), ("  ", "  "), ("▁", " ")
    for k, sm in zip((3, 40, len(merges) // 2), spaced):
        merges.insert(k, sm)
    m.update(merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    j["added_tokens"] = [{"id": vocab[c], "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": True, "special": True} for c in ("<unk>", "<s>", "</s>")]
    text = json.dumps(j, ensure_ascii=False)
    with pytest.raises(Exception):
        Tokenizer.from_str(text)  # what ferry departs from: HF refuses the file
    hf_j = json.loads(text)
    hf_j["model"]["merges"] = [x for x in merges if x not in spaced]
    hf = Tokenizer.from_str(json.dumps(hf_j))
    d = tmp_path / "spaced"
    d.mkdir()
    (d / "tokenizer.json").write_text(text, encoding="utf-8")
    fe = Ferry(d)
    texts = CORPUS + ["   ", "a  b   c    d", "\u00a0 \u00a0\u00a0", " <s> x</s>", "hello  world  "]
    check_encode(hf, fe, texts, "string merges")
    space_ids = [vocab[t] for t in (" ", "  ", "    ", "▁ ")]
    word = hf_encode(hf, "hello world", False, False)
    check_decode(hf, fe, [hf_encode(hf, t, True, True) for t in texts] +
                 [space_ids, word + space_ids + word, [vocab["<s>"]] + space_ids[:2] + [vocab["</s>"]]],
                 "string merges")


# ---- small tokenizers over every option ---------------------------------------------------------

# no NUL: json.h refuses \u0000 in a string, so a vocabulary holding it cannot load
TRAIN = [t.replace("\x00", "") for t in CORPUS if t] + MIXED_PARTS + ["hello world hello there", "Hi HELLO hello hi", "mask MASK"]
WORDS = ["hello", "Hello", "world", " the", "fox", "日本", "мир", "123", "4567", "  ", " ", "\n", "\t", "é", "e\u0301",
         "👍🏽", "'s", "IT'S", ".", "!?", "ß", "ﬁ", "<tag>", "[MASK]", "hi", "x\u00a0y", "\u3000"]
ADDED = ["<tag>", "[MASK]", "hello", " sp", "Hi", "<|x|>", "ab", "▁tok"]


def train(byte_level):
    if byte_level:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tr = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                 show_progress=False)
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>"], show_progress=False)
    tok.train_from_iterator(TRAIN, tr)
    j = json.loads(tok.to_str())
    if not byte_level:
        vocab = j["model"]["vocab"]
        for b in range(256):
            vocab.setdefault("<0x%02X>" % b, len(vocab))
    j["added_tokens"] = []
    return j


def variant(base, byte_level, rnd):
    j = json.loads(json.dumps(base))
    m = j["model"]
    split = {"type": "Split", "pattern": rnd.choice([{"Regex": LLAMA3_REGEX}, {"Regex": r"\s+|\d"},
                                                     {"String": " "}, {"Regex": r"[\S]+"}, {"Regex": "x*"}]),
             "behavior": rnd.choice(["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]),
             "invert": rnd.random() < 0.3}
    norm = rnd.choice([None, {"type": "NFC"}, {"type": "NFKC"}, {"type": "NFD"}, {"type": "NFKD"},
                       {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True},
                       {"type": "Replace", "pattern": {"Regex": r"\d"}, "content": "#"},
                       {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}])
    if byte_level:
        bl = {"type": "ByteLevel", "add_prefix_space": rnd.random() < 0.3, "trim_offsets": True,
              "use_regex": rnd.random() < 0.5}
        pre = rnd.choice([bl, {"type": "Sequence", "pretokenizers": [split, dict(bl, use_regex=False)]}])
        dec = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        m["ignore_merges"] = rnd.random() < 0.5
    else:
        scheme = rnd.choice(["first", "always", "never"])
        meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": rnd.random() < 0.6}
        spm_norm = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                          {"type": "Replace", "pattern": {"String": " "},
                                                           "content": "▁"}]}
        pre = rnd.choice([meta, None, {"type": "Sequence", "pretokenizers": [split, meta]}])
        if pre is None:
            norm = spm_norm
        dec = rnd.choice([
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": True},
            {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                              {"type": "ByteFallback"}, {"type": "Fuse"},
                                              {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"},
                                              {"type": "Replace", "pattern": {"String": "▁▁"}, "content": "_"},
                                              {"type": "Strip", "content": "▁", "start": 2, "stop": 1}]},
            {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                              {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}]},
            {"type": "Sequence", "decoders": [{"type": "Fuse"},
                                              {"type": "Replace", "pattern": {"Regex": "▁+"}, "content": " "}]},
            None])
        m["byte_fallback"] = rnd.random() < 0.7
        m["fuse_unk"] = rnd.random() < 0.5
        m["unk_token"] = rnd.choice(["<unk>", "<unk>", None])
    j["normalizer"] = norm
    j["pre_tokenizer"] = pre
    j["decoder"] = dec
    bos = {"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": "<tag>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {"<tag>": {"id": "<tag>", "ids": [1], "tokens": ["<tag>"]}}}
    j["post_processor"] = rnd.choice([None, bos, {"type": "RobertaProcessing", "sep": ["</s>", 2],
                                                  "cls": ["<s>", 0], "trim_offsets": True,
                                                  "add_prefix_space": True},
                                      {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space":
                                                                           True, "trim_offsets": False,
                                                                           "use_regex": True}, bos]}])
    j["added_tokens"] = [{"id": 0, "content": c, "single_word": rnd.random() < 0.3, "lstrip": rnd.random() < 0.3,
                          "rstrip": rnd.random() < 0.3, "normalized": rnd.random() < 0.5,
                          "special": rnd.random() < 0.5} for c in rnd.sample(ADDED, rnd.randrange(0, 5))]
    return j


@pytest.mark.parametrize("byte_level", [True, False], ids=["byte-level", "sentencepiece"])
def test_options_match_hf(tmp_path, byte_level):
    base = train(byte_level)
    rnd = random.Random(99 if byte_level else 77)
    for n in range(24):
        j = variant(base, byte_level, rnd)
        d = tmp_path / ("v%d" % n)
        d.mkdir()
        (d / "tokenizer.json").write_text(json.dumps(j, ensure_ascii=False), encoding="utf-8")
        hf = Tokenizer.from_str(json.dumps(j))
        fe = Ferry(d)
        texts = ["".join(rnd.choice(WORDS + ADDED) for _ in range(rnd.randrange(1, 12))) for _ in range(30)]
        texts += ["", " ", "hello", " hello", "<tag>", " <tag> ", "hello<tag>hello", "Hi  [MASK]  x"]
        label = "variant %d %s" % (n, json.dumps({k: j[k] for k in ("normalizer", "pre_tokenizer", "decoder")})[:600])
        check_encode(hf, fe, texts, label)
        ids = [hf_encode(hf, t, True, True) for t in texts]
        v = hf.get_vocab_size(with_added_tokens=True)
        ids += [[rnd.randrange(v) for _ in range(rnd.randrange(1, 10))] for _ in range(40)]
        check_decode(hf, fe, ids, label)


# ---- the CLI ------------------------------------------------------------------------------------

def test_cli_tokenize_detokenize(ferry, real, work):
    hf, fe = real("llama-bpe")
    d = str(fe.dir)
    text = "Hello <|eot_id|> world, 123456 🦀"
    p = ferry.check("tokenize", "--model", d, "--text", text, "--json")
    assert json.loads(p.stdout) == {"ids": hf_encode(hf, text, False, True)}
    p = ferry.check("tokenize", "--model", d, "--text", text, "--add-special")
    assert [int(x) for x in p.stdout.split()] == hf_encode(hf, text, True, True)
    f = work / "in.txt"
    f.write_bytes("two lines\nof text\n".encode())
    p = ferry.check("tokenize", "--model", d, "--file", f, "--json")
    assert json.loads(p.stdout)["ids"] == hf_encode(hf, "two lines\nof text\n", False, True)
    ids = hf_encode(hf, text, True, True)
    p = ferry.check("detokenize", "--model", d, "--ids", ",".join(map(str, ids)), "--json")
    assert json.loads(p.stdout) == {"text": hf.decode(ids, skip_special_tokens=False)}
    p = ferry.check("detokenize", "--model", d, "--ids", ",".join(map(str, ids)))
    assert p.stdout.decode() == hf.decode(ids, skip_special_tokens=False) + "\n"
    p = ferry.check("tokenize", "--model", d, "--text", "")
    assert p.stdout == b"\n"


def test_cli_errors(ferry, real, work):
    hf, fe = real("qwen2")
    d = str(fe.dir)
    assert_ferry_error(ferry.run("tokenize", "--model", d), ["--text or --file"], rcs=(2,))
    assert_ferry_error(ferry.run("tokenize", "--model", d, "--text", "a", "--file", "x"), ["--text or --file"],
                       rcs=(2,))
    assert_ferry_error(ferry.run("detokenize", "--model", d, "--ids", "1,,2"), ["--ids"], rcs=(2,))
    assert_ferry_error(ferry.run("detokenize", "--model", d, "--ids", "1,999999999"), ["outside the vocabulary"],
                       rcs=(1,))
    assert_ferry_error(ferry.run("tokenize", "--model", str(work), "--text", "a"), ["tokenizer.json"], rcs=(1,))
    j = json.loads((fe.dir / "tokenizer.json").read_text(encoding="utf-8"))
    j["pre_tokenizer"] = {"type": "Digits", "individual_digits": True}
    (work / "tokenizer.json").write_text(json.dumps(j), encoding="utf-8")
    assert_ferry_error(ferry.run("tokenize", "--model", str(work), "--text", "a"),
                       ["pre_tokenizer type 'Digits' is not supported"], rcs=(1,))
    (work / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [', encoding="utf-8")
    assert_ferry_error(ferry.run("tokenize", "--model", str(work), "--text", "a"), ["tokenizer.json", "JSON"],
                       rcs=(1,))
