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


def test_header_size(srv):
    ok = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\nConnection: close\r\n\r\n" % (b"a" * 8000)
    assert status_of(raw(srv, ok)) == 200
    big = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\nConnection: close\r\n\r\n" % (b"a" * 20000)
    assert status_of(raw(srv, big)) == 431
    many = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(3000)) + \
        b"Connection: close\r\n\r\n"
    assert status_of(raw(srv, many)) == 431
    url = b"GET /v2/health/live?%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % (b"q" * 20000)
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
