"""The server's limits (docs/limits.md), each past its bound: what the
client sees (status and message naming the setting), and that the server
serves on. One server with every per-request limit set low (`srv`): a
prompt of at most 8 tokens (--max-prompt-tokens), 16 new tokens
(--max-output-tokens), 1 KiB of text for the tokenizer and the chat
template (--max-text-bytes), a 16 KiB request head (--max-header) and 2 s
without traffic on a connection (--connection-timeout); and one
(`srv_conn`) that holds at most 8 connections (--max-connections).

The limits with tests elsewhere: --max-body (test_http
test_413_body_over_limit, test_grpc test_message_over_max_body),
--max-queued (test_http test_503_when_overloaded), --request-memory
(test_hardening test_request_over_the_budget_is_503), --request-timeout
and --max-connections-per-ip (test_hardening test_slow_loris,
test_idle_after_head_is_cut), the context (test_openai
test_prompt_too_long); the gRPC side of these caps is in test_grpc
(test_request_caps).
"""

import json
import socket
import time

import pytest

from test_http import assert_alive, expect_error, jreq, request, serve
from test_hardening import raw, status_of
from text_util import DEMO_TOKENIZER, text_model


@pytest.fixture(scope="module")
def m_lim(ferry, tmp_path_factory):
    return text_model(ferry, tmp_path_factory.mktemp("limits") / "lim", DEMO_TOKENIZER, seed=91)


@pytest.fixture(scope="module")
def srv(ferry_bin, m_lim):
    yield from serve(ferry_bin, m_lim, "--batch", 4, "--max-prompt-tokens", 8, "--max-output-tokens", 16,
                     "--max-text-bytes", "1KiB", "--max-header", "16KiB", "--connection-timeout", 2, name="lim")


def oai_error(srv, path, body, status):
    """An OpenAI error object of status: (message, param); the server serves on."""
    st, obj = jreq(srv, "POST", path, body)
    assert st == status, (st, obj)
    err = obj["error"]
    assert err["type"] == "invalid_request_error" and err["message"], obj
    assert_alive(srv)
    return err["message"], err["param"]


def test_prompt_tokens(srv):
    st, obj = jreq(srv, "POST", "/v2/models/lim/generate", {"input_ids": list(range(1, 9)),
                                                            "parameters": {"max_new_tokens": 2}})
    assert st == 200, obj
    expect_error(srv, 400, "POST", "/v2/models/lim/generate",
                 {"input_ids": list(range(1, 10)), "parameters": {"max_new_tokens": 2}},
                 needles=["input_ids is 9 tokens, more than this server takes in one prompt (8, --max-prompt-tokens)"])
    msg, param = oai_error(srv, "/v1/completions", {"prompt": list(range(1, 10)), "max_tokens": 2}, 400)
    assert "--max-prompt-tokens" in msg and param == "prompt"
    # a chat prompt counts after the template: one short message is more than 8 tokens
    msg, param = oai_error(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400)
    assert "--max-prompt-tokens" in msg and param == "messages"


def test_output_tokens(srv):
    st, obj = jreq(srv, "POST", "/v2/models/lim/generate", {"input_ids": [1, 2], "parameters": {"max_new_tokens": 16}})
    assert st == 200 and len(obj["output_ids"]) <= 16, obj
    expect_error(srv, 400, "POST", "/v2/models/lim/generate",
                 {"input_ids": [1, 2], "parameters": {"max_new_tokens": 17}},
                 needles=["max_new_tokens is 17, more than this server generates for one sequence "
                          "(16, --max-output-tokens)"])
    msg, param = oai_error(srv, "/v1/completions", {"prompt": [1, 2], "max_tokens": 17}, 400)
    assert "--max-output-tokens" in msg and param == "max_tokens"
    # a completion that names none asks for 16 (the default), within the cap
    st, obj = jreq(srv, "POST", "/v1/completions", {"prompt": [1, 2]})
    assert st == 200 and obj["usage"]["completion_tokens"] <= 16, obj


def test_chat_without_max_tokens_gets_the_cap(ferry_bin, m_lim):
    """Without a prompt cap, a chat request that names no max_tokens gets
    what the context leaves, at most --max-output-tokens."""
    gen = serve(ferry_bin, m_lim, "--batch", 2, "--max-output-tokens", 16, name="cap")
    s = next(gen)
    try:
        st, obj = jreq(s, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            "stop": [], "seed": 1})
        assert st == 200, obj
        # the random model's greedy text does not reach <|im_end|> within 16 tokens
        assert obj["usage"]["completion_tokens"] == 16 and obj["choices"][0]["finish_reason"] == "length", obj
    finally:
        gen.close()


def test_text_bytes(srv):
    st, obj = jreq(srv, "POST", "/tokenize", {"content": "a" * 1024})
    assert st == 200 and obj["tokens"], obj
    expect_error(srv, 413, "POST", "/tokenize", {"content": "a" * 1025},
                 needles=["the text is 1025 bytes, more than this server encodes at once (1024, --max-text-bytes)"])
    expect_error(srv, 413, "POST", "/v2/models/lim/generate",
                 {"text_input": "b" * 1025, "parameters": {"max_new_tokens": 2}}, needles=["--max-text-bytes"])
    msg, param = oai_error(srv, "/v1/completions", {"prompt": "c" * 1025, "max_tokens": 2}, 413)
    assert "--max-text-bytes" in msg and param == "prompt"


def test_chat_template_output(srv):
    """The rendered chat is tokenizer input: past --max-text-bytes the
    template stops and the request is 413, before anything is encoded."""
    msg, param = oai_error(srv, "/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "d" * 1000}], "max_tokens": 2}, 413)
    assert "the chat template's output is more than this server encodes at once (1024 bytes, --max-text-bytes)" in msg
    assert param == "messages"


MAX_HEADER = 16 * 1024  # srv's --max-header; libmicrohttpd's buffer is twice that


def head_of(size, method=b"GET", path=b"/v2/health/live", extra=b""):
    """A request head of exactly `size` bytes (padded with one X-Pad header),
    asking the server to close after its answer."""
    start = b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sX-Pad: " % (method, path, extra)
    pad = size - len(start) - len(b"\r\n\r\n")
    assert pad >= 0
    return start + b"a" * pad + b"\r\n\r\n"


def reply_parts(reply):
    """(status, {lower-case header: value}, body bytes) of a raw reply."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    hdrs = dict((k.strip().lower().decode(), v.strip().decode())
                for k, _, v in (l.partition(b":") for l in lines[1:]))
    return status_of(reply), hdrs, body


def head_refusal(srv, data, status):
    """The server refuses a request head with `status` in JSON, closes the
    connection, and serves on: the error object's message."""
    st, hdrs, body = reply_parts(raw(srv, data))
    assert st == status, (st, hdrs, body[:300])
    assert "json" in hdrs.get("content-type", ""), (hdrs, body[:300])
    assert hdrs.get("connection", "").lower() == "close", hdrs
    obj = json.loads(body)
    assert_alive(srv)
    return obj["error"]


def test_header_size(srv):
    """--max-header is the largest request head ferry takes: one at the
    limit is served, one byte more is 431 in JSON naming the setting."""
    ok = head_of(MAX_HEADER)
    st, _, body = reply_parts(raw(srv, ok))
    assert st == 200 and json.loads(body) == {"live": True}, (st, body)
    msg = head_refusal(srv, head_of(MAX_HEADER + 1), 431)
    assert msg == "request head is %d bytes, more than this server takes (%d, --max-header)" % (
        MAX_HEADER + 1, MAX_HEADER), msg
    # every header line counts (200 of them: within what libmicrohttpd's buffer holds)
    many = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + \
        b"".join(b"X-H%03d: %s\r\n" % (i, b"v" * 80) for i in range(200)) + b"Connection: close\r\n\r\n"
    assert MAX_HEADER < len(many)
    assert "--max-header" in head_refusal(srv, many, 431)
    # the URL alone: 414, its length as sent (escapes and query included)
    url = b"GET /v2/health/live?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"%41" * 6000)
    msg = head_refusal(srv, url, 414)
    assert msg == "URL is %d bytes, more than this server takes (%d, --max-header)" % (
        len("/v2/health/live?") + 18000, MAX_HEADER), msg


def with_body(body):
    return b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)


def test_header_size_json(srv):
    """A request with a body: a head at the limit is served, its body (more
    than libmicrohttpd's buffer) read whole; over it, /v1 paths get
    OpenAI's error object."""
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [5, 6, 7]}],
                       "parameters": {"max_new_tokens": 2}}).encode()
    padded = body + b" " * 40000
    reply = raw(srv, head_of(MAX_HEADER, b"POST", b"/v2/models/lim/infer", with_body(padded)) + padded)
    assert status_of(reply) == 200 and b'"output_ids"' in reply, reply[:300]
    err = head_refusal(srv, head_of(MAX_HEADER + 100, b"POST", b"/v2/models/lim/infer", with_body(body)) + body, 431)
    assert "--max-header" in err, err
    cbody = json.dumps({"prompt": [1, 2], "max_tokens": 2}).encode()
    err = head_refusal(srv, head_of(MAX_HEADER + 1, b"POST", b"/v1/completions", with_body(cbody)) + cbody, 431)
    assert err["type"] == "invalid_request_error" and "(16384, --max-header)" in err["message"], err
    url = b"GET /v1/models?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"q" * 20000)
    err = head_refusal(srv, url, 414)
    assert err["type"] == "invalid_request_error" and err["message"].startswith("URL is 20011 bytes"), err


def test_header_past_the_buffer(srv):
    """A head that does not fit libmicrohttpd's buffer (2 x --max-header)
    gets its own answer (an HTML page: 0.9.75 cannot be told otherwise),
    and the server serves on."""
    assert status_of(raw(srv, head_of(3 * MAX_HEADER))) == 431
    many = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(3000)) + \
        b"Connection: close\r\n\r\n"
    assert status_of(raw(srv, many)) == 431
    url = b"GET /v2/health/live?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"q" * (3 * MAX_HEADER))
    assert status_of(raw(srv, url)) == 414
    assert_alive(srv)


def test_connection_timeout(srv):
    """A kept-alive connection with no traffic is closed after
    --connection-timeout (2 s), well before --request-timeout (30 s)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=15)
    try:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}"):
            got += s.recv(4096)
        assert status_of(got) == 200
        t0 = time.monotonic()
        assert s.recv(4096) == b""  # the server closed it
        waited = time.monotonic() - t0
        assert 1 <= waited < 10, waited
    finally:
        s.close()
    assert_alive(srv)


@pytest.fixture(scope="module")
def srv_conn(ferry_bin, models):
    yield from serve(ferry_bin, models.get("llama", "tiny", seed=92), "--max-connections", 8,
                     "--max-connections-per-ip", 8, name="conn")


def test_max_connections(srv_conn):
    """Past --max-connections a connection waits in the listen queue,
    unanswered, and is served once a place frees."""
    held = [socket.create_connection(("127.0.0.1", srv_conn.port), timeout=10) for _ in range(8)]
    time.sleep(0.3)
    s = socket.create_connection(("127.0.0.1", srv_conn.port), timeout=10)
    try:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.settimeout(1.0)
        with pytest.raises(socket.timeout):
            s.recv(100)
        for h in held:
            h.close()
        held = []
        s.settimeout(10)
        assert status_of(s.recv(4096)) == 200
    finally:
        s.close()
        for h in held:
            h.close()
    assert_alive(srv_conn)


@pytest.mark.parametrize("flags,needle", [
    (["--max-output-tokens", 15], "--max-output-tokens must be at least 16"),
    (["--max-header", 1024], "--max-header must be in 4096..1048576"),
    (["--connection-timeout", 0], "--connection-timeout must be in 1..86400"),
    (["--max-prompt-tokens", -1], "--max-prompt-tokens must be in 0..16777216"),
    (["--max-text-bytes", 0], "--max-text-bytes must be >= 1"),
])
def test_bad_limit_flags(ferry, m_lim, flags, needle):
    p = ferry.run("serve", "--model", m_lim, "--http-port", 0, "--grpc-port", -1, *flags)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert needle in p.stderr.decode(), p.stderr
