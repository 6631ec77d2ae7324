"""The OpenAI-compatible API (/v1), driven by the official `openai` client.

Servers (the real binary, one per module fixture): `l2` - a random tiny
model with Llama 2's tokenizer (SentencePiece BPE, BOS added); `qchat` -
the same tokenizer with ChatML's control tokens added and Qwen2.5's chat
template; `demo` - the repository's demo tokenizer (byte-level BPE, a
ChatML template), --max-body 64KiB, --request-memory 16MiB; `bare` - no tokenizer at all; `slow` -
a model streamed from disk at --batch 1 --max-queued 1, for requests that
must still run while the test acts.

What is checked against independent references: the text of every answer
is HF tokenizers' decode of ids that `ferry generate --prompt-ids` gives
for HF tokenizers' encoding of the prompt (greedy, so the same ids); chat
prompts are Python jinja2's rendering of the template, and usage counts
their tokens; streamed text concatenated equals the whole answer; stop
strings (one spanning a token boundary) end the text before them, in the
stream as well; errors are OpenAI's error object with the right status.
"""

import concurrent.futures
import http.client
import json
import time

import openai
import pytest

from test_http import REQ_TIMEOUT, hang_up, metrics, msum, serve
from text_util import (DEMO_TOKENIZER, chat_tokenizer_dir, greedy_text, hf_chat_ids, hf_render, hf_tokenizer,
                       stop_ids, text_model, tokenizer_dir, until_stop)

M_GENERATED = "ferry_generated_tokens_total"
M_SEQUENCES = "ferry_sequences_total"


# --------------------------------------------------------------------------
# models and servers
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tdir(tmp_path_factory):
    return tmp_path_factory.mktemp("oai")


@pytest.fixture(scope="module")
def m_l2(ferry, tdir):
    return text_model(ferry, tdir / "l2", tokenizer_dir("llama-spm"), seed=11)


@pytest.fixture(scope="module")
def m_qchat(ferry, tdir):
    return text_model(ferry, tdir / "qchat", chat_tokenizer_dir(tdir / "qchat-tok"), arch="qwen2", seed=12)


@pytest.fixture(scope="module")
def m_demo(ferry, tdir):
    return text_model(ferry, tdir / "demo", DEMO_TOKENIZER, seed=13)


@pytest.fixture(scope="module")
def srv_l2(ferry_bin, m_l2):
    yield from serve(ferry_bin, m_l2, "--batch", 4, name="l2")


@pytest.fixture(scope="module")
def srv_qchat(ferry_bin, m_qchat):
    yield from serve(ferry_bin, m_qchat, "--batch", 4, name="qchat")


@pytest.fixture(scope="module")
def srv_demo(ferry_bin, m_demo):
    yield from serve(ferry_bin, m_demo, "--batch", 4, "--max-body", "64KiB", "--request-memory", "16MiB", name="demo")


@pytest.fixture(scope="module")
def srv_bare(ferry_bin, models):
    yield from serve(ferry_bin, models.get("llama", seed=14), "--batch", 2, name="bare")


@pytest.fixture(scope="module")
def m_slow(ferry, tdir):
    return text_model(ferry, tdir / "slow", DEMO_TOKENIZER, preset="small", seed=15, extra=("--layers", 8))


@pytest.fixture(scope="module")
def srv_slow(ferry_bin, m_slow, tdir):
    yield from serve(ferry_bin, m_slow, "--batch", 1, "--max-queued", 1, "--max-memory", "device=0,host=0",
                     "--offload-dir", tdir / "slow-offload", name="slow")


def client(srv):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="unused", max_retries=0,
                         timeout=REQ_TIMEOUT)


def cli_ids(ferry, model, ids, n):
    """What `ferry generate --prompt-ids` generates (greedy) for ids."""
    out, _ = ferry.generate(model, ids, n)
    return out


def expected_text(ferry, model, prompt_ids, n):
    """(text, ids, finish_reason) a greedy text endpoint must give."""
    text, ids = greedy_text(ferry, model, prompt_ids, n)
    finish = "stop" if ids and ids[-1] in stop_ids(model) else "length"
    return text, ids, finish


def stream_text(chunks, chat):
    """The text of a streamed answer (one choice), and its chunks' finish reasons."""
    text, finishes = [], []
    for c in chunks:
        for ch in c.choices:
            text.append((ch.delta.content or "") if chat else ch.text)
            finishes.append(ch.finish_reason)
    return "".join(text), finishes


# --------------------------------------------------------------------------
# /v1/models
# --------------------------------------------------------------------------

def test_models(srv_l2):
    models = client(srv_l2).models.list()
    ids = [m.id for m in models.data]
    assert ids == ["l2"], ids
    assert models.data[0].object == "model" and models.data[0].owned_by == "ferry"


# --------------------------------------------------------------------------
# completions
# --------------------------------------------------------------------------

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "ferry: 3 + 4 = ", "Grüße aus Zürich 🚢"]


@pytest.mark.parametrize("which", ["l2", "demo"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_greedy_equals_cli(request, ferry, which, prompt):
    srv = request.getfixturevalue("srv_" + which)
    model = request.getfixturevalue("m_" + which)
    n = 12
    r = client(srv).completions.create(model=srv.name, prompt=prompt, max_tokens=n, temperature=0)
    ids = hf_tokenizer(model).encode(prompt).ids  # with BOS where the tokenizer adds one
    text, gen, finish = expected_text(ferry, model, ids, n)
    ch = r.choices[0]
    assert ch.text == text, "server %r, HF decode of `ferry generate` ids %r (ids %r)" % (ch.text, text, gen)
    assert ch.finish_reason == finish and ch.index == 0
    assert r.usage.prompt_tokens == len(ids), (r.usage, ids)
    assert r.usage.completion_tokens == len(gen) and r.usage.total_tokens == len(ids) + len(gen)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == srv.name
    assert abs(r.created - time.time()) < 300


def test_stop_token_ids_text_left_out(srv_demo, m_demo, ferry):
    """A stop id ends the answer and its own text is not part of it (vLLM's
    default): the text is HF's decode of the ids before it."""
    prompt = PROMPTS[0]
    ids = hf_tokenizer(m_demo).encode(prompt).ids
    gen = cli_ids(ferry, m_demo, ids, 8)
    k = next((i for i in range(1, len(gen)) if gen[i] not in gen[:i] and gen[i] not in stop_ids(m_demo)), None)
    if k is None:
        pytest.skip("no fresh token to stop at in the greedy output")
    r = client(srv_demo).completions.create(model=srv_demo.name, prompt=prompt, max_tokens=8, temperature=0,
                                            extra_body={"stop_token_ids": [gen[k]]})
    ch = r.choices[0]
    assert ch.finish_reason == "stop"
    assert ch.text == hf_tokenizer(m_demo).decode(gen[:k], skip_special_tokens=True)
    assert r.usage.completion_tokens == k + 1  # the stop id was generated


def test_completion_prompt_forms(srv_l2, m_l2):
    """A string, its token ids, a list of strings and a list of id lists give the same text."""
    c = client(srv_l2)
    tok = hf_tokenizer(m_l2)
    p1, p2 = PROMPTS[0], PROMPTS[1]
    ids1, ids2 = tok.encode(p1).ids, tok.encode(p2).ids
    one = c.completions.create(model="l2", prompt=p1, max_tokens=6, temperature=0).choices[0].text
    two = c.completions.create(model="l2", prompt=p2, max_tokens=6, temperature=0).choices[0].text
    assert c.completions.create(model="l2", prompt=ids1, max_tokens=6, temperature=0).choices[0].text == one
    r = c.completions.create(model="l2", prompt=[p1, p2], max_tokens=6, temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1] and [ch.text for ch in r.choices] == [one, two]
    assert r.usage.prompt_tokens == len(ids1) + len(ids2)
    r = c.completions.create(model="l2", prompt=[ids1, ids2], max_tokens=6, temperature=0)
    assert [ch.text for ch in r.choices] == [one, two]


def test_completion_n_and_echo(srv_demo):
    c = client(srv_demo)
    r = c.completions.create(model="demo", prompt="Hello", max_tokens=5, n=3, temperature=0.8, seed=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len({ch.text for ch in r.choices}) > 1, "n=3 sampled choices are all equal: %r" % r.choices
    greedy = c.completions.create(model="demo", prompt="Hello", max_tokens=5, temperature=0).choices[0].text
    r = c.completions.create(model="demo", prompt="Hello", max_tokens=5, temperature=0, echo=True)
    assert r.choices[0].text == "Hello" + greedy


@pytest.mark.parametrize("which", ["l2", "demo"])
def test_completion_stream_equals_whole(request, which):
    srv = request.getfixturevalue("srv_" + which)
    c = client(srv)
    for prompt in PROMPTS:
        whole = c.completions.create(model=srv.name, prompt=prompt, max_tokens=20, temperature=0)
        chunks = list(c.completions.create(model=srv.name, prompt=prompt, max_tokens=20, temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
        text, finishes = stream_text(chunks[:-1], chat=False)
        assert text == whole.choices[0].text, (text, whole.choices[0].text)
        assert finishes[-1] == whole.choices[0].finish_reason and all(f is None for f in finishes[:-1])
        usage = chunks[-1]
        assert usage.choices == [] and usage.usage.prompt_tokens == whole.usage.prompt_tokens
        assert usage.usage.completion_tokens == whole.usage.completion_tokens
        assert all(ch.id == chunks[0].id for ch in chunks)


def test_stream_is_sse_with_done(srv_demo):
    conn = http.client.HTTPConnection("127.0.0.1", srv_demo.port, timeout=REQ_TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": "demo", "prompt": "Hi", "max_tokens": 4, "temperature": 0, "stream": True}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
        body = resp.read().decode()
    finally:
        conn.close()
    events = [e for e in body.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-3:]
    for e in events[:-1]:
        assert e.startswith("data: {") and json.loads(e[6:])["object"] == "text_completion", e


def test_max_tokens_length(srv_l2):
    r = client(srv_l2).completions.create(model="l2", prompt="Hello", max_tokens=5, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


def test_default_max_tokens_is_16(srv_l2):
    r = client(srv_l2).completions.create(model="l2", prompt="Hello", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16


def test_seed_reproducible(srv_demo):
    c = client(srv_demo)
    kw = dict(model="demo", prompt="The weights", max_tokens=16, temperature=1.0, extra_body={"ignore_eos": True})
    a = c.completions.create(seed=7, **kw).choices[0].text
    assert c.completions.create(seed=7, **kw).choices[0].text == a
    assert c.completions.create(seed=8, **kw).choices[0].text != a
    # no seed: a fresh one per request
    texts = {c.completions.create(**kw).choices[0].text for _ in range(3)}
    assert len(texts) > 1, texts


# --------------------------------------------------------------------------
# stop strings
# --------------------------------------------------------------------------

def _boundary_stop(tok, ids):
    """A 4-character stop string that spans the boundary between two
    generated tokens, and the text before its first occurrence."""
    full = tok.decode(ids, skip_special_tokens=True)
    for k in range(2, len(ids) - 2):
        left = tok.decode(ids[:k], skip_special_tokens=True)
        if not full.startswith(left):
            continue
        b = len(left)
        stop = full[b - 2:b + 2]
        if len(stop) == 4 and stop.strip() and "\ufffd" not in stop and len(tok.decode(ids[k:k + 1])) >= 2:
            return stop, full[:full.index(stop)]
    pytest.fail("no token boundary to put a stop string on in %r" % full)


@pytest.mark.parametrize("which", ["l2", "demo"])
def test_stop_string_across_tokens(request, ferry, which):
    srv = request.getfixturevalue("srv_" + which)
    model = request.getfixturevalue("m_" + which)
    tok = hf_tokenizer(model)
    prompt = "A long story about ferries:"
    ids = cli_ids(ferry, model, tok.encode(prompt).ids, 40)
    stop, before = _boundary_stop(tok, ids)
    c = client(srv)
    kw = dict(model=srv.name, prompt=prompt, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    r = c.completions.create(stop=[stop, "never-ever-seen"], **kw)
    assert r.choices[0].text == before and r.choices[0].finish_reason == "stop", (stop, r.choices[0], before)
    assert r.usage.completion_tokens < 40
    chunks = list(c.completions.create(stop=stop, stream=True, **kw))
    pieces = [ch.choices[0].text for ch in chunks]
    assert "".join(pieces) == before and chunks[-1].choices[0].finish_reason == "stop"
    assert all(stop not in p for p in pieces), pieces
    # the stop string is held back while it could still be one: no piece ends with its first half
    assert stop not in "".join(pieces)


def test_stop_string_chat(srv_demo, m_demo, ferry):
    msgs = [{"role": "user", "content": "Tell me about the pipeline."}]
    ids = until_stop(cli_ids(ferry, m_demo, hf_chat_ids(m_demo, msgs), 30), stop_ids(m_demo))
    tok = hf_tokenizer(m_demo)
    if len(ids) < 6:
        pytest.fail("the demo model stopped after %d tokens: pick another prompt" % len(ids))
    stop, before = _boundary_stop(tok, ids)
    c = client(srv_demo)
    r = c.chat.completions.create(model="demo", messages=msgs, max_tokens=30, temperature=0, stop=stop)
    assert r.choices[0].message.content == before and r.choices[0].finish_reason == "stop"
    chunks = list(c.chat.completions.create(model="demo", messages=msgs, max_tokens=30, temperature=0, stop=stop,
                                            stream=True))
    text, finishes = stream_text(chunks, chat=True)
    assert text == before and finishes[-1] == "stop"


# --------------------------------------------------------------------------
# chat
# --------------------------------------------------------------------------

CHATS = [
    [{"role": "user", "content": "Hello! Who are you?"}],
    [{"role": "system", "content": "You are a ferry captain."},
     {"role": "user", "content": "Where are we going?"},
     {"role": "assistant", "content": "To the island."},
     {"role": "user", "content": [{"type": "text", "text": "How long"}, {"type": "text", "text": "will it take?"}]}],
]


def _as_strings(msgs):
    """Content parts joined with "\\n", as the server passes them to the template."""
    out = []
    for m in msgs:
        c = m["content"]
        out.append(dict(m, content=c if isinstance(c, str) else "\n".join(p["text"] for p in c)))
    return out


@pytest.mark.parametrize("which", ["qchat", "demo"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_chat_greedy_equals_cli(request, ferry, which, chat):
    srv = request.getfixturevalue("srv_" + which)
    model = request.getfixturevalue("m_" + which)
    msgs = CHATS[chat]
    ids = hf_chat_ids(model, _as_strings(msgs))
    text, gen, finish = expected_text(ferry, model, ids, 16)
    c = client(srv)
    r = c.chat.completions.create(model=srv.name, messages=msgs, max_tokens=16, temperature=0)
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.message.content == text, (ch.message.content, text, gen)
    assert ch.finish_reason == finish
    assert r.usage.prompt_tokens == len(ids), "prompt_tokens %d, HF counts %d for %r" % (
        r.usage.prompt_tokens, len(ids), hf_render(model, _as_strings(msgs)))
    assert r.usage.completion_tokens == len(gen)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    # streamed: the role first, the same text, the finish reason last
    chunks = list(c.chat.completions.create(model=srv.name, messages=msgs, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(k.object == "chat.completion.chunk" for k in chunks)
    streamed, finishes = stream_text(chunks[:-1], chat=True)
    assert streamed == text and finishes[-1] == finish
    assert chunks[-1].usage.prompt_tokens == len(ids) and chunks[-1].usage.completion_tokens == len(gen)


def test_chat_control_tokens_are_ids(srv_qchat, m_qchat):
    """The template's <|im_start|>/<|im_end|> become their ids (parsed as
    special), as apply_chat_template(tokenize=True) encodes them."""
    msgs = [{"role": "user", "content": "hi"}]
    ids = hf_chat_ids(m_qchat, msgs)
    tok = hf_tokenizer(m_qchat)
    assert tok.token_to_id("<|im_start|>") in ids
    r = client(srv_qchat).chat.completions.create(model="qchat", messages=msgs, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens == len(ids)


def test_chat_max_completion_tokens_and_default(srv_demo):
    c = client(srv_demo)
    msgs = [{"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model="demo", messages=msgs, max_completion_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    # no max_tokens: up to the rest of the context (the tiny model's 512 positions)
    r = c.chat.completions.create(model="demo", messages=msgs, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 512


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------

def raw(srv, path, body, method="POST"):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=REQ_TIMEOUT)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read().decode())
    finally:
        conn.close()


def check_error(obj, status, param=None, code=None, needle=None):
    err = obj.get("error")
    assert isinstance(err, dict), obj
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["type"] == ("invalid_request_error" if status < 500 else "server_error"), err
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if needle:
        assert needle.lower() in err["message"].lower(), err


BAD = [
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "n": "two"}, "n"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": [[1, 2], "x"]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [1, 99999]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": "x", "logprobs": 2}, "logprobs"),
    ({"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),  # without stream, as vLLM
]


@pytest.mark.parametrize("body,param", BAD, ids=[p + "-" + str(i) for i, (_, p) in enumerate(BAD)])
def test_completion_400(srv_demo, body, param):
    st, obj = raw(srv_demo, "/v1/completions", dict(body, model=body.get("model", "demo")))
    assert st == 400, (st, obj)
    check_error(obj, 400, param=param)


BAD_CHAT = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT, ids=[p + "-" + str(i) for i, (_, p) in enumerate(BAD_CHAT)])
def test_chat_400(srv_demo, body, param):
    st, obj = raw(srv_demo, "/v1/chat/completions", dict(body, model="demo"))
    assert st == 400, (st, obj)
    check_error(obj, 400, param=param)


def test_errors_through_the_client(srv_demo):
    c = client(srv_demo)
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert e.value.status_code == 404
    check_error(e.value.body if "error" in e.value.body else {"error": e.value.body}, 404, param="model",
                code="model_not_found", needle="gpt-4")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens="x")
    assert e.value.status_code == 400


def test_prompt_too_long(srv_demo):
    c = client(srv_demo)
    long = "ferry streams the weights " * 400  # more than the tiny model's 512 positions
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="demo", prompt=long, max_tokens=4)
    body = e.value.body if "error" in e.value.body else {"error": e.value.body}
    check_error(body, 400, param="prompt", code="context_length_exceeded", needle="context")
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": long}])
    body = e.value.body if "error" in e.value.body else {"error": e.value.body}
    check_error(body, 400, param="messages", code="context_length_exceeded")
    # prompt + max_tokens past the context
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="demo", prompt="hi", max_tokens=600)


def test_body_too_large_413(srv_demo):
    st, obj = raw(srv_demo, "/v1/completions", {"model": "demo", "prompt": "x" * (80 << 10)})
    assert st == 413, (st, obj)
    check_error(obj, 413)


def test_answer_past_the_budget_is_413(srv_demo):
    """An answer that could never fit --request-memory (64 choices of 400
    tokens) is the client's to shrink: 413 naming max_tokens, not a 503 to retry."""
    st, obj = raw(srv_demo, "/v1/completions", {"model": "demo", "prompt": "hi", "n": 64, "max_tokens": 400,
                                                "stream": True})
    assert st == 413, (st, obj)
    check_error(obj, 413, param="max_tokens", needle="request-memory")
    st, obj = raw(srv_demo, "/v1/completions", {"model": "demo", "prompt": "hi", "n": 2, "max_tokens": 4})
    assert st == 200 and len(obj["choices"]) == 2


def test_unknown_fields_ignored(srv_demo):
    st, obj = raw(srv_demo, "/v1/completions", {"model": "demo", "prompt": "hi", "max_tokens": 2, "temperature": 0,
                                                "frobnicate": {"a": 1}, "user": "me", "metadata": None})
    assert st == 200 and obj["choices"][0]["finish_reason"] in ("stop", "length"), obj
    st, obj = raw(srv_demo, "/v1/nothing", {})
    assert st == 404
    check_error(obj, 404)


def test_no_tokenizer(srv_bare):
    st, obj = raw(srv_bare, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert st == 400
    check_error(obj, 400, needle="tokenizer.json")
    st, obj = raw(srv_bare, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert st == 400
    check_error(obj, 400, needle="tokenizer.json")
    # ids still work elsewhere
    st, obj = raw(srv_bare, "/v2/models/bare/generate", {"input_ids": [1, 2, 3], "parameters": {"max_new_tokens": 2}})
    assert st == 200 and len(obj["output_ids"]) == 2


# --------------------------------------------------------------------------
# the same scheduler: concurrency, cancellation, a full queue
# --------------------------------------------------------------------------

def test_concurrent_requests_equal_one_by_one(srv_demo):
    c = client(srv_demo)
    prompts = ["prompt %d about offloading" % i for i in range(8)]
    alone = [c.completions.create(model="demo", prompt=p, max_tokens=10, temperature=0).choices[0].text
             for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        together = list(ex.map(lambda p: c.completions.create(model="demo", prompt=p, max_tokens=10,
                                                              temperature=0).choices[0].text, prompts))
    assert together == alone


def open_stream(srv, path, body):  # noqa: D103 - the response once its head arrived
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=REQ_TIMEOUT)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def test_disconnect_frees_the_sequence(srv_slow):
    """A client that leaves mid-stream frees its sequence: with one slot, the
    next request completes, and far fewer tokens than asked were generated."""
    big = 1500
    before = metrics(srv_slow)
    conn, resp = open_stream(srv_slow, "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Go on forever"}], "max_tokens": big,
                              "stream": True, "ignore_eos": True})
    try:
        assert resp.status == 200
        seen = 0
        while seen < 2:  # the role chunk, then a token's
            line = resp.readline()
            assert line, "stream ended early"
            seen += line.startswith(b"data: ")
    finally:
        hang_up(conn)
    r = client(srv_slow).completions.create(model="slow", prompt="next", max_tokens=3, temperature=0,
                                            extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    after = metrics(srv_slow)
    d_gen = msum(after, M_GENERATED) - msum(before, M_GENERATED)
    assert d_gen < big // 2, "the abandoned stream ran on: %d tokens generated" % d_gen
    assert msum(after, M_SEQUENCES, outcome="cancelled") - msum(before, M_SEQUENCES, outcome="cancelled") == 1


def test_full_queue_is_503(srv_slow):
    """One request runs (--batch 1), one waits (--max-queued 1): the next is
    refused 503 in OpenAI's format."""
    body = {"model": "slow", "prompt": "busy", "max_tokens": 300, "ignore_eos": True, "stream": True}
    held = []

    def wait_for(gauge):
        deadline = time.monotonic() + REQ_TIMEOUT
        while msum(metrics(srv_slow), gauge) < 1:
            assert time.monotonic() < deadline, "%s never reached 1:\n%s" % (gauge, srv_slow.logtail())
            time.sleep(0.02)

    try:
        # the second only once the first runs: sent at once, it could find the first still queued
        for gauge in ("ferry_requests_running", "ferry_requests_queued"):
            conn = http.client.HTTPConnection("127.0.0.1", srv_slow.port, timeout=REQ_TIMEOUT)
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            held.append(conn)
            wait_for(gauge)
        st, obj = raw(srv_slow, "/v1/completions", dict(body, stream=False, max_tokens=2))
        assert st == 503, (st, obj)
        check_error(obj, 503)
    finally:
        for conn in held:
            hang_up(conn)
