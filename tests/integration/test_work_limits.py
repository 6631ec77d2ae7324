"""Bounded work on text (issue 29, items 4 and 5): a tokenizer regex that
backtracks, and a chat template that compares long strings, end with an
error that names the limit instead of running for minutes, and the server
serves on. Each test asserts on the answer (its status and message) and on
what else is answered meanwhile, never on elapsed time."""

import json
import shutil
import time

import pytest

from conftest import assert_ferry_error
from test_grpc import grpc_port, pb  # noqa: F401 (pb: a fixture)
from test_http import REQ_TIMEOUT, assert_alive, request, serve
from text_util import DEMO_TOKENIZER, text_model


def tokenizer_with_split(dst, regex):
    """The demo tokenizer with its pre-tokenizer's Split pattern replaced."""
    dst.mkdir(parents=True, exist_ok=True)
    tj = json.loads((DEMO_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": regex}
    (dst / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    shutil.copy(DEMO_TOKENIZER / "tokenizer_config.json", dst)
    return dst


# --------------------------------------------------------------------------
# tokenizer regexes
# --------------------------------------------------------------------------

def test_backtracking_split_is_refused_at_load(ferry, tmp_path):
    """(a|aa)+$ takes ~2 ms a byte on 'aaa...a!' text (28 s for 16 KiB of
    30-letter runs before the limit): the load-time probe finds it, and the
    tokenizer is refused naming the field and the pattern."""
    tok = tokenizer_with_split(tmp_path / "tok", "(a|aa)+$")
    p = ferry.run("tokenize", "--model", tok, "--text", "hello")
    assert_ferry_error(p, ["pre_tokenizer.pretokenizers[0].pattern", "(a|aa)+$", "regex work limit",
                           "refused"])


@pytest.fixture(scope="module")
def srv_regex(ferry_bin, ferry, tmp_path_factory):
    # passes the probe (runs of one character), backtracks on 'abab...ab!'
    root = tmp_path_factory.mktemp("regex")
    tok = tokenizer_with_split(root / "tok", "(ab|a|b)+$|.")
    m = text_model(ferry, root / "m", tok, seed=95)
    yield from serve(ferry_bin, m, name="regex")


BACKTRACK_TEXT = ("ab" * 16 + "!") * 496  # 16 KiB


def test_backtracking_text_hits_the_regex_work_limit(srv_regex):
    """Text that makes the pattern backtrack is refused (413 naming the
    tokenizer's regex work limit and the pattern), and the server serves on."""
    st, _, body = request(srv_regex, "POST", "/v2/models/regex/generate",
                          json.dumps({"text_input": BACKTRACK_TEXT, "parameters": {"max_new_tokens": 1}}).encode(),
                          {"Content-Type": "application/json"})
    err = json.loads(body)["error"]
    assert st == 413 and "regex work limit" in err and "(ab|a|b)+$|." in err, (st, err)
    st, _, body = request(srv_regex, "POST", "/v2/models/regex/generate",
                          json.dumps({"text_input": "ab ba", "parameters": {"max_new_tokens": 1}}).encode(),
                          {"Content-Type": "application/json"})
    assert st == 200, (st, body)
    assert_alive(srv_regex)


def test_backtracking_text_hits_the_regex_work_limit_grpc(srv_regex, pb):
    import grpc
    msgs, stub_cls = pb[0], pb[1]
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv_regex))
    try:
        stub = stub_cls(ch)
        req = msgs.ModelInferRequest(model_name=srv_regex.name)
        req.parameters["max_new_tokens"].int64_param = 1
        req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
            BACKTRACK_TEXT.encode())
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(req, timeout=REQ_TIMEOUT)
        assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, (ei.value.code(), ei.value.details())
        assert "regex work limit" in ei.value.details()
        stub.ServerLive(msgs.ServerLiveRequest(), timeout=REQ_TIMEOUT)
    finally:
        ch.close()


@pytest.mark.slow
def test_grpc_encodes_off_the_completion_queue_thread(srv_regex, pb):
    """A ModelInfer whose text takes seconds to encode (1 MB that makes the
    pattern backtrack, within the work limit) does not hold up other calls:
    ServerLive, sent after it on another channel, is answered while the
    ModelInfer is still encoding (before, both waited on gRPC's one
    completion-queue thread, so the ModelInfer ended first)."""
    import grpc
    msgs, stub_cls = pb[0], pb[1]
    ch1 = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv_regex))
    ch2 = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv_regex))
    try:
        stub1, stub2 = stub_cls(ch1), stub_cls(ch2)
        stub2.ServerLive(msgs.ServerLiveRequest(), timeout=REQ_TIMEOUT)  # connected
        req = msgs.ModelInferRequest(model_name=srv_regex.name)
        req.parameters["max_new_tokens"].int64_param = 1
        req.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(
            ("ab" * 9 + "!").encode() * (1000000 // 19))
        fut = stub1.ModelInfer.future(req, timeout=REQ_TIMEOUT)
        time.sleep(0.3)  # for the ModelInfer to reach the server (not asserted on)
        stub2.ServerLive(msgs.ServerLiveRequest(), timeout=REQ_TIMEOUT)
        assert not fut.done(), "ServerLive waited for the ModelInfer's encode"
        with pytest.raises(grpc.RpcError):
            fut.result()  # the prompt is longer than the tiny model's context
    finally:
        ch1.close()
        ch2.close()


@pytest.mark.slow
def test_http_encodes_off_the_connection_threads(srv_regex):
    """/tokenize requests whose text takes seconds each to encode (1 MB that
    makes the pattern backtrack, within the work limit) do not hold up other
    connections: health checks on twelve kept-alive connections, sent after
    the six slow requests (on six more such connections), are all answered
    while every one of those is still encoding. Before, each encoded on the
    libmicrohttpd connection thread its connection belongs to (four in all,
    connections spread over them as accepted), so a health check on a
    connection that shares a thread with a slow one waited for its encode."""
    import http.client
    import threading
    text = ("ab" * 9 + "!") * (1000000 // 19)
    body = json.dumps({"content": text}).encode()
    conns = []
    try:
        for _ in range(18):  # connected, and each given to a connection thread, before any slow request
            c = http.client.HTTPConnection("127.0.0.1", srv_regex.port, timeout=REQ_TIMEOUT)
            c.request("GET", "/v2/health/live")
            r = c.getresponse()
            r.read()
            assert r.status == 200
            conns.append(c)
        done, errors = [], []

        def tokenize(c):
            try:
                c.request("POST", "/tokenize", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                out = r.read()
                done.append(r.status)
                if r.status != 200:
                    errors.append((r.status, out[:200]))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        threads = [threading.Thread(target=tokenize, args=(c,)) for c in conns[:6]]
        for t in threads:
            t.start()
        time.sleep(0.5)  # for the bodies to reach the server (not asserted on)
        late = []
        for i, c in enumerate(conns[6:]):
            c.request("GET", "/v2/health/live")
            r = c.getresponse()
            r.read()
            assert r.status == 200
            if done:
                late.append(i)
        for t in threads:
            t.join()
        assert not late, "health checks on connections %s waited for an encode to end" % late
        assert not errors, errors
    finally:
        for c in conns:
            c.close()
    assert_alive(srv_regex)
