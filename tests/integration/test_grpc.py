"""`ferry serve`'s gRPC front end (issue 11), through a client not written
for this project: grpcio with KServe's official generated stubs from the
`kserve` package on PyPI (kserve_stubs.py says how they are loaded), never
ferry's own copy of the proto.

grpcio and kserve live in the project's virtual environment (build/venv,
made by `make deps`); `make integration` runs pytest with its python. Run
with a python without grpcio, this module is skipped.

Each server is the real binary on free loopback ports (--http-port 0
--grpc-port 0, see test_http.Server); the fixture's teardown checks that
SIGTERM ends it with status 0.
"""

import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import refdata

grpc = refdata.client("grpc")
refdata.client("grpc_tools.protoc")

import kserve_stubs  # noqa: E402
from conftest import prompt_ids, rel_err  # noqa: E402
from test_http import SAME, Server, infer, metrics, msum, serve, unpad  # noqa: E402

GRPC_LISTEN_RE = re.compile(r"listening on grpc://([0-9.]+):(\d+)")
TIMEOUT = 60  # seconds for any one call (a hang is a failure)

# KServe's proto has no streaming RPC; Triton's ModelStreamInfer answers
# with ModelStreamInferResponse (kserve_stubs.py declares it)
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    """(messages, GRPCInferenceServiceStub, ModelStreamInferResponse, Triton's config messages)"""
    return kserve_stubs.load(tmp_path_factory.mktemp("kserve_stubs"))


@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=71)


@pytest.fixture(scope="module")
def gsrv(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 8)


def grpc_port(srv):
    for line in srv.log:
        m = GRPC_LISTEN_RE.search(line)
        if m:
            return int(m.group(2))
    pytest.fail("no 'listening on grpc://...' line:\n%s" % srv.logtail())


@pytest.fixture(scope="module")
def stub(gsrv, pb):
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(gsrv))
    yield pb[1](ch)
    ch.close()


def infer_request(msgs, model, prompts, max_new_tokens, raw=False, outputs=None, req_id="", datatype="INT64"):
    a = np.asarray(prompts, dtype=np.int64)
    req = msgs.ModelInferRequest(model_name=model, id=req_id)
    req.parameters["max_new_tokens"].int64_param = max_new_tokens
    t = req.inputs.add(name="input_ids", datatype=datatype, shape=list(a.shape))
    if raw:
        req.raw_input_contents.append(a.astype("<i8").tobytes())
    else:
        t.contents.int64_contents.extend(a.reshape(-1).tolist())
    for n in outputs or []:
        req.outputs.add(name=n)
    return req


def output(resp, name):
    """(datatype, shape, raw bytes) of output `name`."""
    names = [o.name for o in resp.outputs]
    assert name in names, "no output %s in %r" % (name, names)
    i = names.index(name)
    assert len(resp.raw_output_contents) == len(resp.outputs), "one raw_output_contents per output"
    o = resp.outputs[i]
    return o.datatype, list(o.shape), resp.raw_output_contents[i]


def output_rows(resp, batch):
    dt, shape, raw = output(resp, "output_ids")
    assert dt == "INT64" and len(shape) == 2 and shape[0] == batch, (dt, shape)
    a = np.frombuffer(raw, dtype="<i8")
    assert a.size == shape[0] * shape[1], (a.size, shape)
    return [unpad(r) for r in a.reshape(shape).tolist()]


def expect_code(call, code, needles=()):
    with pytest.raises(grpc.RpcError) as ei:
        call()
    e = ei.value
    assert e.code() == code, "want %s, got %s: %s" % (code, e.code(), e.details())
    for n in needles:
        assert n in (e.details() or ""), "%r not in %r" % (n, e.details())
    return e


def assert_alive(stub, msgs):
    assert stub.ServerLive(msgs.ServerLiveRequest(), timeout=TIMEOUT).live


# --------------------------------------------------------------------------

def test_health_and_metadata(stub, pb, gsrv, vocab):
    msgs = pb[0]
    assert stub.ServerLive(msgs.ServerLiveRequest(), timeout=TIMEOUT).live
    assert stub.ServerReady(msgs.ServerReadyRequest(), timeout=TIMEOUT).ready
    assert stub.ModelReady(msgs.ModelReadyRequest(name=gsrv.name), timeout=TIMEOUT).ready
    assert stub.ModelReady(msgs.ModelReadyRequest(name=gsrv.name, version="1"), timeout=TIMEOUT).ready
    md = stub.ServerMetadata(msgs.ServerMetadataRequest(), timeout=TIMEOUT)
    assert md.name == "ferry" and md.version and "binary_tensor_data" in md.extensions
    mm = stub.ModelMetadata(msgs.ModelMetadataRequest(name=gsrv.name), timeout=TIMEOUT)
    assert mm.name == gsrv.name and list(mm.versions) == ["1"] and mm.platform == "ferry"
    assert [(t.name, t.datatype, list(t.shape)) for t in mm.inputs] == [("input_ids", "INT64", [-1, -1])]
    assert [(t.name, t.datatype, list(t.shape)) for t in mm.outputs] == [
        ("output_ids", "INT64", [-1, -1]), ("logits", "FP32", [-1, vocab])]
    for call, req in ((stub.ModelReady, msgs.ModelReadyRequest(name="nope")),
                      (stub.ModelMetadata, msgs.ModelMetadataRequest(name="nope")),
                      (stub.ModelMetadata, msgs.ModelMetadataRequest(name=gsrv.name, version="7"))):
        expect_code(lambda: call(req, timeout=TIMEOUT), grpc.StatusCode.NOT_FOUND, ("not found",))


def triton_call(gsrv, pb, method, req, resp_name):
    """Triton's unary RPC `method` (not in the official KServe stub); req
    bytes are sent as they are."""
    with grpc.insecure_channel("127.0.0.1:%d" % grpc_port(gsrv)) as ch:
        call = ch.unary_unary("/inference.GRPCInferenceService/" + method,
                              request_serializer=(lambda b: b) if isinstance(req, bytes) else type(req).SerializeToString,
                              response_deserializer=getattr(pb[3], resp_name).FromString)
        return call(req, timeout=TIMEOUT)


def test_model_config_and_statistics_equal_rest(pb, gsrv, vocab):
    """Triton's ModelConfig and ModelStatistics carry what REST's /config and
    /stats say, field for field."""
    from test_http import jreq
    tm = pb[3]
    st, cfg = jreq(gsrv, "GET", "/v2/models/%s/config" % gsrv.name)
    assert st == 200, cfg
    for req in (tm.ModelConfigRequest(name=gsrv.name), tm.ModelConfigRequest(name=gsrv.name, version="1")):
        c = triton_call(gsrv, pb, "ModelConfig", req, "ModelConfigResponse").config
        assert c.name == cfg["name"] == gsrv.name
        assert c.platform == cfg["platform"] == "ferry" and c.backend == cfg["backend"]
        assert c.max_batch_size == cfg["max_batch_size"] == 8
        assert c.version_policy.latest.num_versions == cfg["version_policy"]["latest"]["num_versions"] == 1
        tensors = lambda ts: [(t.name, tm.DataType.Name(t.data_type), list(t.dims)) for t in ts]  # noqa: E731
        assert tensors(c.input) == [(t["name"], t["data_type"], t["dims"]) for t in cfg["input"]]
        assert tensors(c.output) == [(t["name"], t["data_type"], t["dims"]) for t in cfg["output"]]
        assert tensors(c.output)[1] == ("logits", "TYPE_FP32", [vocab])
        assert c.model_transaction_policy.decoupled is cfg["model_transaction_policy"]["decoupled"] is True

    def rest_stats():
        st, obj = jreq(gsrv, "GET", "/v2/models/%s/stats" % gsrv.name)
        assert st == 200, obj
        return obj["model_stats"]

    def as_rest(resp):
        durs = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
        return [{"name": m.name, "version": m.version, "last_inference": m.last_inference,
                 "inference_count": m.inference_count, "execution_count": m.execution_count,
                 "inference_stats": {d: {"count": getattr(m.inference_stats, d).count,
                                         "ns": getattr(m.inference_stats, d).ns} for d in durs},
                 "batch_stats": list(m.batch_stats)} for m in resp.model_stats]

    infer(gsrv, [[1, 2, 3], [4, 5, 6]], 2)  # something to count
    before = rest_stats()
    for req in (tm.ModelStatisticsRequest(name=gsrv.name), tm.ModelStatisticsRequest(),
                tm.ModelStatisticsRequest(name=gsrv.name, version="1")):
        got = as_rest(triton_call(gsrv, pb, "ModelStatistics", req, "ModelStatisticsResponse"))
        assert got == before == rest_stats()  # nothing ran between: the same figures
    assert before[0]["inference_count"] >= 2 and before[0]["inference_stats"]["success"]["ns"] > 0
    for method, req, resp in (("ModelConfig", tm.ModelConfigRequest(name="nope"), "ModelConfigResponse"),
                              ("ModelConfig", tm.ModelConfigRequest(name=gsrv.name, version="7"),
                               "ModelConfigResponse"),
                              ("ModelConfig", tm.ModelConfigRequest(), "ModelConfigResponse"),
                              ("ModelStatistics", tm.ModelStatisticsRequest(name="nope"), "ModelStatisticsResponse")):
        expect_code(lambda: triton_call(gsrv, pb, method, req, resp), grpc.StatusCode.NOT_FOUND, ("not found",))
    for method, resp in (("ModelConfig", "ModelConfigResponse"), ("ModelStatistics", "ModelStatisticsResponse")):
        expect_code(lambda: triton_call(gsrv, pb, method, b"\x0a\xff\xff", resp), grpc.StatusCode.INVALID_ARGUMENT,
                    ("malformed",))
    assert triton_call(gsrv, pb, "ModelConfig", tm.ModelConfigRequest(name=gsrv.name),
                       "ModelConfigResponse").config.name == gsrv.name  # still up
    # /metrics counts them under their own endpoints
    assert grpc_count(gsrv, "grpc_model_config", grpc.StatusCode.OK) == 3
    assert grpc_count(gsrv, "grpc_model_config", grpc.StatusCode.NOT_FOUND) == 3
    assert grpc_count(gsrv, "grpc_model_statistics", grpc.StatusCode.OK) == 3
    assert grpc_count(gsrv, "grpc_model_statistics", grpc.StatusCode.INVALID_ARGUMENT) == 1


def test_infer_equals_cli_and_http(stub, pb, gsrv, ferry, tiny, vocab, tmp_path):
    """Greedy output_ids through gRPC, typed and raw, are `ferry generate`'s
    and the HTTP infer endpoint's; so are the logits (FP32 raw)."""
    msgs = pb[0]
    n_new = 10
    prompts = [prompt_ids(vocab, 6, 301), prompt_ids(vocab, 6, 302)]
    want, want_logits = ferry.generate(tiny, prompts, n_new, dump_logits=tmp_path / "l.bin")
    http_rows, http_logits, _ = infer(gsrv, prompts, n_new, logits=True)
    assert http_rows == want
    for raw in (False, True):
        req = infer_request(msgs, gsrv.name, prompts, n_new, raw=raw, outputs=["output_ids", "logits"],
                            req_id="req-%d" % raw)
        resp = stub.ModelInfer(req, timeout=TIMEOUT)
        assert resp.id == "req-%d" % raw and resp.model_name == gsrv.name and resp.model_version == "1"
        assert output_rows(resp, 2) == want, "raw=%s" % raw
        dt, shape, data = output(resp, "logits")
        assert dt == "FP32" and shape == [2, vocab]
        logits = np.frombuffer(data, dtype="<f4").reshape(shape).astype(np.float64)
        assert rel_err(logits, want_logits) <= SAME
        assert rel_err(logits, http_logits) <= SAME
    # no outputs named: output_ids alone; a [T] shape is one prompt
    req = infer_request(msgs, gsrv.name, [prompts[0]], n_new)
    del req.inputs[0].shape[:]
    req.inputs[0].shape.append(len(prompts[0]))
    resp = stub.ModelInfer(req, timeout=TIMEOUT)
    assert [o.name for o in resp.outputs] == ["output_ids"] and output_rows(resp, 1) == [want[0]]


def grpc_count(srv, endpoint, code):
    return msum(metrics(srv), "ferry_requests_total", endpoint=endpoint, code=code.value[0])


def test_infer_parameters_as_rest(stub, pb, gsrv, vocab):
    """Sampling parameters (temperature, top_k and seed as int64_param - the
    official KServe InferParameter has no double) and stop_token_ids (a
    string_param of ids) give what REST gives for the same request; a stop
    token ends its row, padded with -1."""
    msgs = pb[0]
    prompts = [prompt_ids(vocab, 5, 305), prompt_ids(vocab, 5, 306)]
    n_new = 8
    want, _, _ = infer(gsrv, prompts, n_new, temperature=1, top_k=5, seed=9)
    req = infer_request(msgs, gsrv.name, prompts, n_new)
    for k, v in (("temperature", 1), ("top_k", 5), ("seed", 9)):
        req.parameters[k].int64_param = v
    assert output_rows(stub.ModelInfer(req, timeout=TIMEOUT), 2) == want
    greedy, _, _ = infer(gsrv, prompts, n_new)
    stop = greedy[0][2]
    want, _, _ = infer(gsrv, prompts, n_new, stop_token_ids=[stop])
    assert len(want[0]) <= 3
    req = infer_request(msgs, gsrv.name, prompts, n_new)
    req.parameters["stop_token_ids"].string_param = "%d" % stop
    resp = stub.ModelInfer(req, timeout=TIMEOUT)
    assert output_rows(resp, 2) == want
    raw = np.frombuffer(output(resp, "output_ids")[2], dtype="<i8").reshape(2, -1)
    assert all(v == -1 for v in raw[0][len(want[0]):]), raw


def test_16_concurrent_equal_one_by_one(stub, pb, gsrv, vocab):
    """16 ModelInfer calls and 4 streams at once (the batch holds 8: some
    queue) give what each gives alone."""
    msgs = pb[0]
    prompts = [prompt_ids(vocab, 3 + i % 5, 320 + i) for i in range(16)]
    alone = [output_rows(stub.ModelInfer(infer_request(msgs, gsrv.name, [p], 12), timeout=TIMEOUT), 1)[0]
             for p in prompts]
    futs = [stub.ModelInfer.future(infer_request(msgs, gsrv.name, [p], 12), timeout=TIMEOUT) for p in prompts]
    streams = []
    for i in range(4):
        ch, call, send = open_stream(gsrv, pb)
        send(infer_request(msgs, gsrv.name, [prompts[i]], 12, req_id="s%d" % i))
        send(None)
        streams.append((ch, call))
    assert [output_rows(f.result(), 1)[0] for f in futs] == alone
    for i, (ch, call) in enumerate(streams):
        toks = [output_rows(r.infer_response, 1)[0][0] for r in call]
        ch.close()
        assert toks == alone[i] and call.code() == grpc.StatusCode.OK


def test_infer_errors_and_the_server_stays_up(stub, pb, gsrv, vocab):
    msgs = pb[0]
    invalid0 = grpc_count(gsrv, "grpc_model_infer", grpc.StatusCode.INVALID_ARGUMENT)
    ok0 = grpc_count(gsrv, "grpc_model_infer", grpc.StatusCode.OK)
    p = [prompt_ids(vocab, 4, 303)]
    inv = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (infer_request(msgs, gsrv.name, p, 4, datatype="FP32"), inv, ("datatype", "INT64")),
        (infer_request(msgs, gsrv.name, [[1, 2, vocab]], 4), inv, ("input_ids", str(vocab))),
        (infer_request(msgs, gsrv.name, [[1, 2, -5]], 4, raw=True), inv, ("input_ids", "-5")),
        (infer_request(msgs, gsrv.name, p, 0), inv, ("max_new_tokens",)),
        (infer_request(msgs, "nope", p, 4), grpc.StatusCode.NOT_FOUND, ("nope",)),
    ]
    bad_shape = infer_request(msgs, gsrv.name, p, 4)
    bad_shape.inputs[0].shape[1] += 1
    cases.append((bad_shape, inv, ("shape",)))
    bad_param = infer_request(msgs, gsrv.name, p, 4)
    bad_param.parameters["temperature"].string_param = "hot"
    cases.append((bad_param, inv, ("temperature",)))
    for req, code, needles in cases:
        expect_code(lambda: stub.ModelInfer(req, timeout=TIMEOUT), code, needles)
        assert_alive(stub, msgs)
    # bytes that are no ModelInferRequest
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(gsrv))
    try:
        raw_call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        expect_code(lambda: raw_call(b"\xff\xff\xff\xff", timeout=TIMEOUT), inv, ("malformed",))
    finally:
        ch.close()
    # a method ferry does not serve
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(gsrv))
    try:
        other = ch.unary_unary("/inference.GRPCInferenceService/RepositoryIndex")
        expect_code(lambda: other(b"", timeout=TIMEOUT), grpc.StatusCode.UNIMPLEMENTED, ("RepositoryIndex",))
    finally:
        ch.close()
    # still serving
    resp = stub.ModelInfer(infer_request(msgs, gsrv.name, p, 3), timeout=TIMEOUT)
    assert len(output_rows(resp, 1)[0]) == 3
    # /metrics counts the gRPC requests by method and gRPC code
    n_invalid = sum(1 for _, code, _ in cases if code == inv) + 1  # + the malformed bytes
    assert grpc_count(gsrv, "grpc_model_infer", grpc.StatusCode.INVALID_ARGUMENT) - invalid0 == n_invalid
    assert grpc_count(gsrv, "grpc_model_infer", grpc.StatusCode.OK) - ok0 == 1
    assert grpc_count(gsrv, "grpc_other", grpc.StatusCode.UNIMPLEMENTED) == 1


def _serve_fails(ferry_bin, *args):
    p = subprocess.run([ferry_bin, "serve", "--http-port", "0", "--host", "127.0.0.1"] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
    err = p.stderr.decode(errors="replace")
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last.startswith("ferry: "), err
    return p.returncode, last


def test_grpc_flags(ferry_bin, tiny):
    for flags in (["--grpc-port", 70000], ["--grpc-port", -2], ["--drain-timeout", -1]):
        rc, last = _serve_fails(ferry_bin, "--model", tiny, *flags)
        assert rc == 2 and flags[0] in last, (flags, last)
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        rc, last = _serve_fails(ferry_bin, "--model", tiny, "--grpc-port", port)
        assert rc == 1 and str(port) in last, last
    finally:
        sock.close()
    # -1: no gRPC front end
    srv = Server(ferry_bin, tiny, "--grpc-port", -1)
    try:
        srv.wait_ready()
        assert not any(GRPC_LISTEN_RE.search(ln) for ln in srv.log), srv.logtail()
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_message_over_max_body(ferry_bin, tiny, pb):
    """A request message over --max-body is RESOURCE_EXHAUSTED, before it is
    parsed; the server serves on."""
    msgs = pb[0]
    srv = Server(ferry_bin, tiny, "--max-body", "4KiB")
    try:
        srv.wait_ready()
        ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        stub = pb[1](ch)
        big = infer_request(msgs, srv.name, [[1] * 1000], 2, raw=True)  # 8000 bytes of ids
        expect_code(lambda: stub.ModelInfer(big, timeout=TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED)
        resp = stub.ModelInfer(infer_request(msgs, srv.name, [[1, 2]], 2), timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) == 2
        ch.close()
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_sigterm_with_calls_in_flight(ferry_bin, slow_model, pb, tmp_path):
    """SIGTERM while a ModelInfer and a stream run (every step streams the
    weights from disk, so they are still running): the unary call gets its
    whole answer, the stream every token up to triton_final_response and
    then ends OK when the client half-closes; the process exits 0 - the gRPC
    front end drains (--drain-timeout) before the scheduler stops."""
    msgs = pb[0]
    n_new = 40
    srv = Server(ferry_bin, slow_model, "--batch", 2, "--max-memory", "device=0,host=0", "--offload-dir",
                 tmp_path / "od")
    try:
        srv.wait_ready()
        ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        fut = pb[1](ch).ModelInfer.future(infer_request(msgs, srv.name, [[3, 4, 5]], n_new), timeout=TIMEOUT)
        sch, call, send = open_stream(srv, pb)
        send(infer_request(msgs, srv.name, [[6, 7]], n_new, req_id="s"))
        first = next(call)
        assert not first.error_message and not fut.done(), "the calls ended before SIGTERM: a slower model is needed"
        srv.proc.send_signal(signal.SIGTERM)
        try:
            resp = fut.result()
        except grpc.RpcError as e:
            pytest.fail("the call in flight failed: %s %s\n%s" % (e.code(), e.details(), srv.logtail()))
        assert len(output_rows(resp, 1)[0]) == n_new
        streamed = [first]
        for r in call:
            streamed.append(r)
            if final_flag(r):
                send(None)
        assert call.code() == grpc.StatusCode.OK, (call.code(), call.details())
        assert not any(r.error_message for r in streamed) and len(streamed) == n_new
        assert [final_flag(r) for r in streamed] == [False] * (n_new - 1) + [True]
        ch.close()
        sch.close()
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


def test_sigterm_past_the_drain_timeout(ferry_bin, slow_model, pb, tmp_path):
    """Calls still running when --drain-timeout passes are cancelled
    (grpc_server_cancel_all_calls): the clients get UNAVAILABLE, their
    sequences are cancelled, and the process exits 0 at once."""
    msgs = pb[0]
    srv = Server(ferry_bin, slow_model, "--batch", 4, "--drain-timeout", 0, "--max-memory", "device=0,host=0",
                 "--offload-dir", tmp_path / "od")
    try:
        srv.wait_ready()
        ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        futs = [pb[1](ch).ModelInfer.future(infer_request(msgs, srv.name, [[3, 4, 5]], 400), timeout=TIMEOUT)
                for _ in range(3)]
        sch, call, send = open_stream(srv, pb)
        send(infer_request(msgs, srv.name, [[6, 7]], 400, req_id="s"))
        assert not next(call).error_message  # all four run (--batch 4)
        assert not any(f.done() for f in futs)
        srv.proc.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as ei:
            for _ in call:
                pass
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        for f in futs:
            with pytest.raises(grpc.RpcError) as ei:
                f.result()
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, ei.value
        ch.close()
        sch.close()
        # no call ran to its end (each got UNAVAILABLE, not its 400 tokens):
        # the server cancelled them
        assert srv.stop() == 0, srv.logtail()
        assert any("cancelled" in ln for ln in srv.log), srv.logtail()
    finally:
        srv.kill()


# --------------------------------------------------------------------------
# ModelStreamInfer (Triton's decoupled stream)
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def slow_model(models):
    return models.get("llama", "small", layers=8, seed=72)  # test_http's slow model


@pytest.fixture(scope="module")
def stream_srv(ferry_bin, slow_model, tmp_path_factory):
    """Every step streams the weights from disk: requests overlap in time."""
    od = tmp_path_factory.mktemp("grpc-stream-od")
    yield from serve(ferry_bin, slow_model, "--batch", 4, "--max-memory", "device=0,host=0", "--offload-dir", od)


def open_stream(srv, pb):
    """(channel, call, send(request or None to half-close)): a
    ModelStreamInfer call fed from a queue."""
    import queue
    q = queue.Queue()

    def requests():
        while True:
            r = q.get()
            if r is None:
                return
            yield r

    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
    call = ch.stream_stream(STREAM_METHOD, request_serializer=pb[0].ModelInferRequest.SerializeToString,
                            response_deserializer=pb[2].FromString)(requests(), timeout=TIMEOUT)
    return ch, call, q.put


def final_flag(resp):
    p = resp.infer_response.parameters
    assert "triton_final_response" in p, "every response says whether it is the last"
    return p["triton_final_response"].bool_param


def test_stream_tokens_in_order_interleaved_and_errors(stream_srv, pb, ferry, slow_model):
    """Two requests on one stream run together: one response per token, in
    order, the request's id on each, triton_final_response on the last
    only, tokens equal to `ferry generate`'s; a bad request in between gets
    one error_message response and the others go on; after the client
    half-closes, the call ends OK."""
    msgs = pb[0]
    pa, pb_ = [5, 6, 7, 8], [9, 10, 11]
    n_a, n_b = 24, 6
    want_a = ferry.generate(slow_model, pa, n_a)[0]
    want_b = ferry.generate(slow_model, pb_, n_b)[0]
    ch, call, send = open_stream(stream_srv, pb)
    try:
        send(infer_request(msgs, stream_srv.name, [pa], n_a, req_id="a"))
        got, order, finals, errors = {"a": [], "b": []}, [], [], {}
        for resp in call:
            if resp.error_message:
                errors[resp.infer_response.id] = resp.error_message
                continue
            rid = resp.infer_response.id
            if not order:  # a runs: now b, and a request that is wrong
                send(infer_request(msgs, stream_srv.name, [pb_], n_b, req_id="b"))
                send(infer_request(msgs, stream_srv.name, [pa], 4, req_id="bad", datatype="FP32"))
            order.append(rid)
            assert [o.name for o in resp.infer_response.outputs] == ["output_ids"]
            got[rid] += output_rows(resp.infer_response, 1)[0]
            if final_flag(resp):
                finals.append(rid)
                if len(finals) == 2:
                    send(None)  # half-close: the call ends once everything is written
    finally:
        ch.close()
    assert call.code() == grpc.StatusCode.OK, (call.code(), call.details())
    assert got == {"a": want_a, "b": want_b}
    assert sorted(finals) == ["a", "b"] and order.count("a") == n_a and order.count("b") == n_b
    last_a = max(i for i, rid in enumerate(order) if rid == "a")
    assert order.index("b") < last_a, "b should run alongside a: %r" % order
    assert list(errors) == ["bad"] and "datatype" in errors["bad"], errors


def test_cancel_frees_the_slot(ferry_bin, slow_model, pb, tmp_path):
    """A stream, or a ModelInfer, cancelled by its client stops its
    generation: with --batch 1 the next request is served at once, not after
    the cancelled one's max_new_tokens; ModelStreamInfer of an unknown model
    or several prompts is an error response on a stream that stays usable."""
    msgs = pb[0]
    srv = Server(ferry_bin, slow_model, "--batch", 1, "--max-memory", "device=0,host=0", "--offload-dir",
                 tmp_path / "od")
    try:
        srv.wait_ready()
        ch, call, send = open_stream(srv, pb)
        send(infer_request(msgs, srv.name, [[1, 2, 3]], 500, req_id="long"))
        first = next(call)
        assert not first.error_message and first.infer_response.id == "long"
        call.cancel()
        ch.close()
        stub = pb[1](grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv)))
        resp = stub.ModelInfer(infer_request(msgs, srv.name, [[4, 5]], 2), timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) == 2
        m = metrics(srv)
        assert msum(m, "ferry_sequences_total", outcome="cancelled") == 1, "the stream's sequence was not cancelled"
        # a unary call whose client gives up
        fut = stub.ModelInfer.future(infer_request(msgs, srv.name, [[1, 2, 3]], 500), timeout=TIMEOUT)
        deadline = time.monotonic() + TIMEOUT
        while msum(metrics(srv), "ferry_requests_running") < 1:
            assert time.monotonic() < deadline and not fut.done(), "the call never started"
            time.sleep(0.005)
        fut.cancel()
        resp = stub.ModelInfer(infer_request(msgs, srv.name, [[4, 5]], 2), timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) == 2
        assert msum(metrics(srv), "ferry_sequences_total", outcome="cancelled") == 2, "ModelInfer was not cancelled"
        ch, call, send = open_stream(srv, pb)
        send(infer_request(msgs, "nope", [[1, 2]], 2, req_id="x"))
        send(infer_request(msgs, srv.name, [[1, 2], [3, 4]], 2, req_id="y"))
        send(infer_request(msgs, srv.name, [[1, 2]], 2, req_id="z"))
        send(None)
        resps = list(call)
        ch.close()
        assert call.code() == grpc.StatusCode.OK
        errs = {r.infer_response.id: r.error_message for r in resps if r.error_message}
        assert set(errs) == {"x", "y"} and "not found" in errs["x"] and "one prompt" in errs["y"], errs
        assert [final_flag(r) for r in resps if not r.error_message] == [False, True]
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


def test_grpc_draws_from_request_memory(ferry_bin, slow_model, pb, tmp_path):
    """gRPC calls take their memory from --request-memory, the one budget
    HTTP requests use: a ModelInfer whose logits could not fit is
    RESOURCE_EXHAUSTED naming the flag, as is a stream request; while a
    stream runs, the budget HTTP's /metrics reports holds its reservation,
    and everything is given back when the calls end; a stream that sends
    many requests gets an answer to each and ends OK, also when the server
    stops reading it after every response (FERRY_GRPC_STREAM_QUEUE_MAX=1:
    how it treats a client that does not read its answers)."""
    import st_util
    msgs = pb[0]
    vocab = int(st_util.read_config(slow_model)["vocab_size"])
    budget = 256 << 10
    srv = Server(ferry_bin, slow_model, "--batch", 2, "--max-body", "64KiB", "--request-memory", budget,
                 "--max-memory", "device=0,host=0", "--offload-dir", tmp_path / "od",
                 env=dict(os.environ, FERRY_GRPC_STREAM_QUEUE_MAX="1"))
    try:
        srv.wait_ready()
        ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        stub = pb[1](ch)
        rows = budget // (vocab * 4) + 1  # their logits alone outgrow the budget
        big = infer_request(msgs, srv.name, [[1, 2]] * rows, 1, outputs=["output_ids", "logits"])
        expect_code(lambda: stub.ModelInfer(big, timeout=TIMEOUT), grpc.StatusCode.RESOURCE_EXHAUSTED,
                    ["--request-memory"])
        many = infer_request(msgs, srv.name, [[1, 2]], 2000)  # 2000 responses: several hundred KiB
        ch2, call, send = open_stream(srv, pb)
        send(many)
        send(None)
        resps = list(call)
        ch2.close()
        assert len(resps) == 1 and "--request-memory" in resps[0].error_message, resps
        # a stream in flight holds its reservation, seen through HTTP: at
        # least 320 bytes for each answer not yet sent. Answers go out as
        # tokens are made, so the same scrape's token count bounds how many
        # have left (one more for the scrape reading one before the other).
        gen0 = msum(metrics(srv), "ferry_generated_tokens_total")
        ch2, call, send = open_stream(srv, pb)
        send(infer_request(msgs, srv.name, [[3, 4, 5]], 40, req_id="s"))
        first = next(call)
        assert first.infer_response.id == "s" and not first.error_message
        m = metrics(srv)
        held, made = msum(m, "ferry_request_memory_bytes"), msum(m, "ferry_generated_tokens_total") - gen0
        assert 1 <= made <= 40, made
        assert held >= (40 - made - 1) * 320 and held > 0, \
            "the stream's reservation is not in the shared budget (%d bytes, %d answers made)" % (held, made)
        n_bad = 3000  # error responses: far more bytes than the stream may queue
        for i in range(n_bad):
            send(infer_request(msgs, srv.name, [[1]], 2, req_id="bad%d" % i, datatype="FP32"))
        send(None)
        rest = list(call)
        ch2.close()
        assert call.code() == grpc.StatusCode.OK, (call.code(), call.details())
        errs = [r for r in rest if r.error_message]
        assert len(errs) == n_bad and all("datatype" in r.error_message for r in errs)
        toks = [r for r in [first] + rest if not r.error_message]
        assert len(toks) == 40 and final_flag(toks[-1])
        resp = stub.ModelInfer(infer_request(msgs, srv.name, [[1, 2]], 2, outputs=["output_ids", "logits"]),
                               timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) == 2
        ch.close()
        deadline = time.monotonic() + TIMEOUT
        while msum(metrics(srv), "ferry_request_memory_bytes") != 0:
            assert time.monotonic() < deadline, "request memory never given back: %s" % metrics(srv)
            time.sleep(0.01)
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


def test_request_caps(ferry_bin, tiny, pb):
    """--max-prompt-tokens and --max-output-tokens over gRPC: INVALID_ARGUMENT
    naming the setting (the one validator, request_check, as over HTTP:
    test_limits.py); the server serves on."""
    msgs = pb[0]
    srv = Server(ferry_bin, tiny, "--max-prompt-tokens", 8, "--max-output-tokens", 16)
    try:
        srv.wait_ready()
        ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        stub = pb[1](ch)
        expect_code(lambda: stub.ModelInfer(infer_request(msgs, srv.name, [list(range(1, 10))], 2), timeout=TIMEOUT),
                    grpc.StatusCode.INVALID_ARGUMENT, ["9 tokens", "(8, --max-prompt-tokens)"])
        expect_code(lambda: stub.ModelInfer(infer_request(msgs, srv.name, [[1, 2]], 17), timeout=TIMEOUT),
                    grpc.StatusCode.INVALID_ARGUMENT, ["max_new_tokens is 17", "(16, --max-output-tokens)"])
        resp = stub.ModelInfer(infer_request(msgs, srv.name, [list(range(1, 9))], 16), timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) <= 16
        assert_alive(stub, msgs)
        ch.close()
        assert srv.stop() == 0
    finally:
        srv.kill()
