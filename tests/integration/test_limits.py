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
                     "--max-text-bytes", "1KiB", "--max-header", "16KiB", "--connection-timeout", 2,
                     "--request-timeout", 3600, name="lim")


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


def live_kept_alive(s):
    """GET /v2/health/live on the open connection s, which stays open: the
    raw reply (its JSON body ends in '}')."""
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got or not got.endswith(b"}"):
        d = s.recv(4096)
        assert d, "the server closed the connection after %r" % got[:200]
        got += d
    return got


def test_connection_timeout(srv):
    """A kept-alive connection with no traffic is closed after
    --connection-timeout (2 s). The server's --request-timeout is an hour
    and the connection is kept alive (a second request on it is answered),
    so only --connection-timeout can close it within the wait."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        for _ in range(2):
            assert status_of(live_kept_alive(s)) == 200
        read_to_close(s, 60)
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
    for h in held:  # each one accepted: a request answered on it, and kept alive
        assert status_of(live_kept_alive(h)) == 200
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


# --------------------------------------------------------------------------
# gRPC connections (docs/limits.md): ferry accepts them itself
# (server/grpc/grpc_listen.c) and hands them to gRPC core once their HTTP/2
# preface came. A raw socket shows what the server does on the wire (its
# SETTINGS frame says the connection was handed over; a close with nothing
# sent says it never was); grpcio is the client that must be served after
# each refusal. One server (`gsrv_lim`) with 2 s for the preface
# (--request-timeout), 3 s without a call (--connection-timeout), 2 calls
# per connection (--grpc-max-streams) and 3 connections per address; the
# total (--max-connections 8) on `srv_conn`. Other clients than 127.0.0.1
# are other loopback addresses (127.0.0.2, 127.0.0.3).
# --------------------------------------------------------------------------

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS
SETTINGS_MAX_CONCURRENT_STREAMS = 3


@pytest.fixture(scope="module")
def gpb(tmp_path_factory):
    """test_grpc (its helpers) and the KServe stubs."""
    import test_grpc as tg
    return tg, tg.kserve_stubs.load(tmp_path_factory.mktemp("kserve_stubs"))


@pytest.fixture(scope="module")
def gsrv_lim(ferry_bin, models):
    yield from serve(ferry_bin, models.get("llama", "tiny", seed=93), "--request-timeout", 2,
                     "--connection-timeout", 3, "--grpc-max-streams", 2, "--max-connections", 8,
                     "--max-connections-per-ip", 3, name="glim")


def gchannel(gpb, srv):
    """A grpcio channel with a connection of its own (grpcio shares one
    between channels to the same address by default)."""
    tg, _ = gpb
    return tg.grpc.insecure_channel("127.0.0.1:%d" % tg.grpc_port(srv), options=[("grpc.use_local_subchannel_pool", 1)])


def grpc_alive(gpb, srv):
    """A normal ModelInfer on a new connection is answered."""
    tg, pb = gpb
    with gchannel(gpb, srv) as ch:
        resp = pb[1](ch).ModelInfer(tg.infer_request(pb[0], srv.name, [[1, 2]], 2), timeout=tg.TIMEOUT)
        assert len(tg.output_rows(resp, 1)[0]) == 2


def h2_conn(gpb, srv, src="127.0.0.1", preface=H2_PREFACE):
    s = socket.socket()
    s.bind((src, 0))
    s.settimeout(20)
    s.connect(("127.0.0.1", gpb[0].grpc_port(srv)))
    if preface:
        s.sendall(preface)
    return s


def h2_frames(s, timeout=20):
    """The frames the server sends, (type, flags, stream, payload), until it
    closes the connection (a reset is a close too); fails if it is still
    open and silent after timeout seconds."""
    s.settimeout(timeout)
    buf = b""
    while True:
        while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
            n = int.from_bytes(buf[:3], "big")
            yield buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7fffffff, buf[9:9 + n]
            buf = buf[9 + n:]
        try:
            got = s.recv(4096)
        except ConnectionResetError:
            return
        except socket.timeout:
            pytest.fail("the connection is still open after %s s" % timeout)
        if not got:
            return
        buf += got


def h2_settings(s):
    """The server's SETTINGS frame: {identifier: value}."""
    for kind, flags, _, payload in h2_frames(s):
        if kind == 4 and not flags & 1:
            return {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                    for i in range(0, len(payload), 6)}
    raise AssertionError("the server closed the connection without its SETTINGS frame")


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_call_headers(method):
    """A HEADERS block opening a gRPC call (HPACK: static-table :method POST
    and :scheme http, the rest literal without indexing)."""
    lit = lambda n, v: b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v  # noqa: E731
    path = b"/inference.GRPCInferenceService/" + method
    return (b"\x83\x86" + b"\x04" + bytes([len(path)]) + path + lit(b":authority", b"x") +
            lit(b"content-type", b"application/grpc") + lit(b"te", b"trailers"))


def read_to_close(s, timeout):
    """What the server sends until it closes s (a reset is a close too)."""
    s.settimeout(timeout)
    got = b""
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return got
            got += d
    except ConnectionResetError:
        return got
    except socket.timeout:
        pytest.fail("the connection is still open after %s s (got %d bytes)" % (timeout, len(got)))


@pytest.mark.slow
def test_grpc_preface_timeout(gsrv_lim, gpb):
    """A connection that does not send the HTTP/2 preface within
    --request-timeout (2 s) is closed, never handed to gRPC core (the
    server sends nothing, not even its SETTINGS); so is one whose first
    bytes are not HTTP/2's."""
    for preface in (None, H2_PREFACE[:10], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 40):
        s = h2_conn(gpb, gsrv_lim, preface=preface)
        try:
            assert read_to_close(s, 20) == b"", preface
        finally:
            s.close()
    s = h2_conn(gpb, gsrv_lim)  # a preface that comes: the server answers with its SETTINGS
    try:
        assert h2_settings(s)
    finally:
        s.close()
    grpc_alive(gpb, gsrv_lim)


@pytest.mark.slow
def test_grpc_idle_connection(gsrv_lim, gpb):
    """A connection with no call open for --connection-timeout (3 s) is
    closed by the server (GOAWAY, then the close); a grpcio channel goes
    back to IDLE and its next call connects again."""
    import threading
    tg, pb = gpb
    grpc = tg.grpc
    s = h2_conn(gpb, gsrv_lim)
    try:
        h2_settings(s)
        read_to_close(s, 30)
    finally:
        s.close()
    ch = gchannel(gpb, gsrv_lim)
    try:
        states, idle_again = [], threading.Event()

        def seen(st):
            states.append(st)
            if st == grpc.ChannelConnectivity.IDLE and grpc.ChannelConnectivity.READY in states:
                idle_again.set()

        ch.subscribe(seen)
        stub = pb[1](ch)
        assert stub.ServerLive(pb[0].ServerLiveRequest(), timeout=tg.TIMEOUT).live
        assert idle_again.wait(30), "the channel stayed connected: %s" % states
        resp = stub.ModelInfer(tg.infer_request(pb[0], gsrv_lim.name, [[1, 2]], 2), timeout=tg.TIMEOUT)
        assert len(tg.output_rows(resp, 1)[0]) == 2
        ch.unsubscribe(seen)
    finally:
        ch.close()
    grpc_alive(gpb, gsrv_lim)


@pytest.mark.slow
def test_grpc_streams_per_connection(gsrv_lim, gpb):
    """--grpc-max-streams 2: the server's SETTINGS say 2; a client that
    opens a third call regardless loses that connection (gRPC core 1.51);
    with two calls open on a connection, grpcio holds a third back (here
    until its deadline) and sends it once one ends; other connections are
    served."""
    import queue
    tg, pb = gpb
    grpc = tg.grpc
    s = h2_conn(gpb, gsrv_lim)
    try:
        assert h2_settings(s).get(SETTINGS_MAX_CONCURRENT_STREAMS) == 2
        # a client that ignores them and opens a third call: gRPC core 1.51
        # closes the connection (later releases refuse the stream alone)
        # SETTINGS ACK: the limit is in force once the server has read it.
        # A PING after it is answered after it is read: its ACK says so.
        s.sendall(h2_frame(4, 1, 0) + h2_frame(6, 0, 0, b"acked-2?"))
        assert any(kind == 6 and flags & 1 and payload == b"acked-2?" for kind, flags, _, payload in h2_frames(s)), \
            "the server closed the connection without answering the PING"
        s.sendall(b"".join(h2_frame(1, 4, sid, h2_call_headers(b"ModelStreamInfer")) for sid in (1, 3, 5)))
        for kind, _, stream, payload in h2_frames(s):
            assert not (kind == 1 and stream == 5), "the third call was answered"
            if kind == 3 and stream == 5:  # RST_STREAM
                assert payload == (7).to_bytes(4, "big"), "not REFUSED_STREAM: %r" % payload
                break
    finally:
        s.close()
    ch = gchannel(gpb, gsrv_lim)
    try:
        stub = pb[1](ch)
        # the connection up, the server's SETTINGS (2 streams) in force
        assert stub.ServerLive(pb[0].ServerLiveRequest(), timeout=tg.TIMEOUT).live
        open_calls = []
        for _ in range(2):  # two ModelStreamInfer calls, each seen open: a request answered, the call kept open
            q = queue.Queue()
            call = ch.stream_stream(tg.STREAM_METHOD, request_serializer=pb[0].ModelInferRequest.SerializeToString,
                                    response_deserializer=pb[2].FromString)(iter(q.get, None), timeout=tg.TIMEOUT)
            q.put(tg.infer_request(pb[0], gsrv_lim.name, [[1, 2]], 1))
            assert not next(call).error_message
            open_calls.append((q, call))
        tg.expect_code(lambda: stub.ServerLive(pb[0].ServerLiveRequest(), timeout=3), grpc.StatusCode.DEADLINE_EXCEEDED)
        grpc_alive(gpb, gsrv_lim)  # another connection
        q, call = open_calls.pop()
        q.put(None)  # half-close: the stream ends
        assert all(not r.error_message for r in call) and call.code() == grpc.StatusCode.OK
        assert stub.ServerLive(pb[0].ServerLiveRequest(), timeout=tg.TIMEOUT).live
        for q, call in open_calls:
            q.put(None)
            list(call)
    finally:
        ch.close()
    grpc_alive(gpb, gsrv_lim)


def test_grpc_connections_per_ip(gsrv_lim, gpb):
    """--max-connections-per-ip 3: a fourth connection from 127.0.0.2 is
    accepted and closed at once, with nothing sent; 127.0.0.3 and
    127.0.0.1 are served meanwhile, and 127.0.0.2 again once its
    connections are gone."""
    held = [h2_conn(gpb, gsrv_lim, src="127.0.0.2") for _ in range(3)]
    try:
        for s in held:
            h2_settings(s)
        s = h2_conn(gpb, gsrv_lim, src="127.0.0.2")
        try:
            assert read_to_close(s, 20) == b""
        finally:
            s.close()
        other = h2_conn(gpb, gsrv_lim, src="127.0.0.3")
        try:
            h2_settings(other)
        finally:
            other.close()
        grpc_alive(gpb, gsrv_lim)
    finally:
        for s in held:
            s.close()
    # gRPC core closes its end of each as it reads the client's close: a try may still be refused
    for _ in range(50):
        s = h2_conn(gpb, gsrv_lim, src="127.0.0.2")
        try:
            h2_settings(s)
            break
        except AssertionError:
            time.sleep(0.1)
        finally:
            s.close()
    else:
        pytest.fail("127.0.0.2 is still refused after its connections closed")
    assert any("refused a connection from 127.0.0.2" in ln and "--max-connections-per-ip" in ln
               for ln in gsrv_lim.log), gsrv_lim.logtail()
    grpc_alive(gpb, gsrv_lim)


def test_grpc_max_connections(srv_conn, gpb):
    """--max-connections 8 (gRPC's own count, apart from HTTP's): with 8
    held - 4 handed to gRPC core, 4 still without their preface, from two
    addresses - a ninth from a third waits in the listen queue, unanswered,
    and is served once one closes."""
    held = [h2_conn(gpb, srv_conn, src="127.0.0.2") for _ in range(4)] + \
        [h2_conn(gpb, srv_conn, src="127.0.0.3", preface=None) for _ in range(4)]
    s = None
    try:
        for h in held[:4]:
            h2_settings(h)
        s = h2_conn(gpb, srv_conn, src="127.0.0.4")
        s.settimeout(1.5)
        with pytest.raises(socket.timeout):
            s.recv(100)
        held.pop(0).close()  # a handed one: gRPC core closes it, the listener sees it gone
        s.settimeout(20)
        assert h2_settings(s)
    finally:
        for h in held + ([s] if s else []):
            h.close()
    assert any("8 connections open (--max-connections)" in ln for ln in srv_conn.log), srv_conn.logtail()
    grpc_alive(gpb, srv_conn)


def test_grpc_bad_limit_flags(ferry, m_lim):
    p = ferry.run("serve", "--model", m_lim, "--http-port", 0, "--grpc-port", 0, "--grpc-max-streams", 0)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "--grpc-max-streams must be in 1..1000000" in p.stderr.decode(), p.stderr
