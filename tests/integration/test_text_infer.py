"""KServe infer with text: the BYTES tensor text_input [B] answered with the
BYTES tensor text_output [B], over HTTP (JSON data, and the binary tensor
extension's 4-byte length prefixes) and gRPC (bytes_contents, and
raw_input_contents with the same prefixes), through clients not written
for this project: tritonclient (HTTP and gRPC) and grpcio with stubs from
the official KServe proto.

The reference for every text: HF `tokenizers` encodes the prompt (with
its special tokens, as a completion prompt), `ferry generate --prompt-ids`
generates greedily from those ids, and HF decodes them (skipping special
tokens) up to the first end-of-sequence id of generation_config.json.
"""

import json
import struct

import numpy as np
import pytest

import refdata

httpclient = refdata.client("tritonclient.http")
grpcclient = refdata.client("tritonclient.grpc")
grpc = refdata.client("grpc")

from test_grpc import STREAM_METHOD, grpc_port, pb  # noqa: E402,F401 (pb: the stubs fixture)
from test_http import jreq, request, serve  # noqa: E402
from test_tritonclient import mod, triton_clients  # noqa: E402
from text_util import (DEMO_TOKENIZER, greedy_text, hf_tokenizer, stop_ids, text_model, tokenizer_dir,  # noqa: E402
                       until_stop)

TIMEOUT = 60
N_NEW = 8
PROMPTS = ["Hello there", "The ferry leaves at 9:30 from pier 4.", "naïve café, 東京 🚢"]


@pytest.fixture(scope="module")
def tdir(tmp_path_factory):
    return tmp_path_factory.mktemp("text-infer")


@pytest.fixture(scope="module", params=["l2", "demo"])
def tmodel(request, ferry, tdir):
    src = tokenizer_dir("llama-spm") if request.param == "l2" else DEMO_TOKENIZER
    return text_model(ferry, tdir / request.param, src, seed=31)


@pytest.fixture(scope="module")
def srv(ferry_bin, tmodel):
    yield from serve(ferry_bin, tmodel, "--batch", 4, name="t")


@pytest.fixture(scope="module")
def clients(srv):
    yield from triton_clients(srv)


_REF = {}


def reference(ferry, model, prompt, n=N_NEW):
    """(text, ids): HF encode -> ferry generate (greedy) -> HF decode."""
    key = (str(model), prompt, n)
    if key not in _REF:
        _REF[key] = greedy_text(ferry, model, hf_tokenizer(model).encode(prompt, add_special_tokens=True).ids, n)
    return _REF[key]


def texts(res):
    """text_output as str (tritonclient gives bytes from binary data, str from JSON)."""
    return [t.decode() if isinstance(t, bytes) else t for t in res.as_numpy("text_output").reshape(-1).tolist()]


def text_infer(client, proto, model, prompts, outputs=("text_output",), params=None, binary=True):
    m = mod(proto)
    a = np.array([p.encode() for p in prompts], dtype=np.object_)
    inp = m.InferInput("text_input", [len(prompts)], "BYTES")
    if proto == "http":
        inp.set_data_from_numpy(a, binary_data=binary)
    else:
        inp.set_data_from_numpy(a)
    outs = [m.InferRequestedOutput(o, binary_data=binary) if proto == "http" else m.InferRequestedOutput(o)
            for o in outputs]
    return client.infer(model, [inp], outputs=outs, parameters=dict({"max_new_tokens": N_NEW}, **(params or {})))


# --------------------------------------------------------------------------
# the answers equal the reference, every way of sending them
# --------------------------------------------------------------------------

@pytest.mark.parametrize("proto,binary", [("http", True), ("http", False), ("grpc", True)])
def test_text_input_equals_reference(clients, srv, ferry, tmodel, proto, binary):
    res = text_infer(clients[proto], proto, srv.name, PROMPTS, binary=binary)
    got = texts(res)
    assert got == [reference(ferry, tmodel, p)[0] for p in PROMPTS]


def test_json_data_flat_and_nested_and_ids_beside(srv, ferry, tmodel):
    for shape, data in (([2], PROMPTS[:2]), ([2, 1], [[p] for p in PROMPTS[:2]])):
        st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                       {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": shape, "data": data}],
                        "outputs": [{"name": "output_ids"}, {"name": "text_output"}],
                        "parameters": {"max_new_tokens": N_NEW}})
        assert st == 200, obj
        outs = {o["name"]: o for o in obj["outputs"]}
        assert outs["text_output"]["datatype"] == "BYTES" and outs["text_output"]["shape"] == [2]
        for i, p in enumerate(PROMPTS[:2]):
            text, gen = reference(ferry, tmodel, p)
            assert outs["text_output"]["data"][i] == text
            ids = [t for t in outs["output_ids"]["data"][i * outs["output_ids"]["shape"][1]:][:outs["output_ids"]["shape"][1]] if t >= 0]
            assert until_stop(ids, stop_ids(tmodel)) == gen


def test_binary_request_bytes_by_hand(srv, ferry, tmodel):
    """The binary extension written out byte by byte: each element a
    4-byte little-endian length, then its UTF-8 bytes; the answer's
    text_output likewise after the JSON."""
    elems = [p.encode() for p in PROMPTS]
    blob = b"".join(struct.pack("<I", len(e)) + e for e in elems)
    head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [len(elems)],
                                   "parameters": {"binary_data_size": len(blob)}}],
                       "outputs": [{"name": "text_output", "parameters": {"binary_data": True}}],
                       "parameters": {"max_new_tokens": N_NEW}}).encode()
    st, hdrs, body = request(srv, "POST", "/v2/models/%s/infer" % srv.name, head + blob,
                             {"Inference-Header-Content-Length": str(len(head)),
                              "Content-Type": "application/octet-stream"})
    assert st == 200, body[:300]
    jl = int(hdrs["inference-header-content-length"])
    meta = json.loads(body[:jl])
    out = meta["outputs"][0]
    assert out["name"] == "text_output" and out["datatype"] == "BYTES" and out["shape"] == [len(elems)]
    raw, texts = body[jl:], []
    assert out["parameters"]["binary_data_size"] == len(raw)
    while raw:
        (n,) = struct.unpack("<I", raw[:4])
        texts.append(raw[4:4 + n].decode())
        raw = raw[4 + n:]
    assert texts == [reference(ferry, tmodel, p)[0] for p in PROMPTS]


def test_grpc_bytes_contents(srv, pb, ferry, tmodel):
    msgs, stub_cls = pb[0], pb[1]
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
    try:
        stub = stub_cls(ch)
        req = msgs.ModelInferRequest(model_name=srv.name)
        req.parameters["max_new_tokens"].int64_param = N_NEW
        t = req.inputs.add(name="text_input", datatype="BYTES", shape=[2, 1])
        t.contents.bytes_contents.extend([p.encode() for p in PROMPTS[:2]])
        resp = stub.ModelInfer(req, timeout=TIMEOUT)
        assert [o.name for o in resp.outputs] == ["text_output"] and resp.outputs[0].datatype == "BYTES"
        raw, texts = resp.raw_output_contents[0], []
        while raw:
            (n,) = struct.unpack("<I", raw[:4])
            texts.append(raw[4:4 + n].decode())
            raw = raw[4 + n:]
        assert texts == [reference(ferry, tmodel, p)[0] for p in PROMPTS[:2]]
    finally:
        ch.close()


def test_grpc_stream_text(srv, pb, ferry, tmodel):
    """ModelStreamInfer with text_input: text_output deltas per request,
    interleaved across requests; each request's deltas concatenated are
    the reference text, its last response is final; a stop string ends
    one early without an error."""
    msgs = pb[0]
    full, _ = reference(ferry, tmodel, PROMPTS[0], 16)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    reqs = []
    for i, p in enumerate(PROMPTS):
        r = msgs.ModelInferRequest(model_name=srv.name, id="r%d" % i)
        r.parameters["max_new_tokens"].int64_param = N_NEW
        r.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(p.encode())
        reqs.append(r)
    rs = msgs.ModelInferRequest(model_name=srv.name, id="stop")
    rs.parameters["max_new_tokens"].int64_param = 16
    rs.parameters["stop"].string_param = stop
    rs.inputs.add(name="text_input", datatype="BYTES", shape=[1]).contents.bytes_contents.append(PROMPTS[0].encode())
    reqs.append(rs)
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
    try:
        call = ch.stream_stream(STREAM_METHOD, request_serializer=msgs.ModelInferRequest.SerializeToString,
                                response_deserializer=pb[2].FromString)
        got, finals = {}, {}
        for resp in call(iter(reqs), timeout=TIMEOUT):
            assert not resp.error_message, resp.error_message
            m = resp.infer_response
            assert m.id not in finals, "a response after the final one"
            if m.outputs:
                assert m.outputs[0].name == "text_output" and m.outputs[0].datatype == "BYTES"
                raw = m.raw_output_contents[0]
                (n,) = struct.unpack("<I", raw[:4])
                assert len(raw) == 4 + n
                got[m.id] = got.get(m.id, b"") + raw[4:]
            if m.parameters["triton_final_response"].bool_param:
                finals[m.id] = True
        assert set(finals) == {"r0", "r1", "r2", "stop"}
        for i, p in enumerate(PROMPTS):
            assert got.get("r%d" % i, b"").decode() == reference(ferry, tmodel, p)[0]
        if len(stop.strip()) >= 2:
            assert got.get("stop", b"").decode() == full[:full.index(stop)]
    finally:
        ch.close()


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_ids_in_text_out(clients, srv, ferry, tmodel, proto):
    m = mod(proto)
    ids = hf_tokenizer(tmodel).encode(PROMPTS[1], add_special_tokens=True).ids
    a = np.asarray([ids], dtype=np.int64)
    inp = m.InferInput("input_ids", list(a.shape), "INT64")
    inp.set_data_from_numpy(a)
    res = clients[proto].infer(srv.name, [inp], outputs=[m.InferRequestedOutput("text_output")],
                               parameters={"max_new_tokens": N_NEW})
    assert texts(res)[0] == reference(ferry, tmodel, PROMPTS[1])[0]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_stop_string(clients, srv, ferry, tmodel, proto):
    """A stop string taken from the middle of the reference text: the
    answer is the text before it, the generation ends there."""
    full, _ = reference(ferry, tmodel, PROMPTS[0], 16)
    cut = len(full) // 2
    stop = full[cut:cut + 3]
    if len(stop.strip()) < 2:
        pytest.skip("the reference text is too short for a stop string")
    res = text_infer(clients[proto], proto, srv.name, PROMPTS[:1], outputs=("text_output", "output_ids"),
                     params={"max_new_tokens": 16, "stop": stop})
    text = texts(res)[0]
    assert text == full[:full.index(stop)]
    ids = [t for t in res.as_numpy("output_ids").reshape(-1).tolist() if t >= 0]
    assert len(ids) < 16, "the stop string ended the generation"
    # output_ids end with the token that completed the stop string: their
    # text holds it, the text without their last token does not
    tok = hf_tokenizer(tmodel)
    assert stop in tok.decode(ids, skip_special_tokens=True)
    assert stop not in tok.decode(ids[:-1], skip_special_tokens=True)


# --------------------------------------------------------------------------
# errors: named, and the server keeps serving
# --------------------------------------------------------------------------

def bad(srv, body):
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name, body)
    assert st == 400, (st, obj)
    return obj["error"]


def test_errors(srv, clients):
    ti = {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}
    assert "datatype must be BYTES" in bad(srv, {"inputs": [dict(ti, datatype="INT64")]})
    assert "data[0] is not a string" in bad(srv, {"inputs": [dict(ti, data=[5])]})
    assert "shape says 2 prompts" in bad(srv, {"inputs": [dict(ti, shape=[2])]})
    assert "shape must be [B] or [B, 1]" in bad(srv, {"inputs": [dict(ti, shape=[1, 2])]})
    both = {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [1]}
    assert "not both" in bad(srv, {"inputs": [ti, both]})
    assert "needs text" in bad(srv, {"inputs": [both], "parameters": {"stop": "x"}})
    assert "unknown output 'text'" in bad(srv, {"inputs": [ti], "outputs": [{"name": "text"}]})
    for shape, blob, needle in (([1], struct.pack("<I", 9) + b"hello", "says 9 bytes"),
                                ([2], struct.pack("<I", 1) + b"a" + b"\x00" * 3, "ends inside element 1"),
                                ([1], struct.pack("<I", 1) + b"ab", "its 1 elements take 5")):
        head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": shape,
                                       "parameters": {"binary_data_size": len(blob)}}]}).encode()
        st, _, body = request(srv, "POST", "/v2/models/%s/infer" % srv.name, head + blob,
                              {"Inference-Header-Content-Length": str(len(head))})
        assert st == 400 and needle.encode() in body, body
    # alive and right after all of that
    assert clients["http"].is_server_live() and clients["grpc"].is_server_live()


def test_model_without_tokenizer(ferry_bin, models):
    gen = serve(ferry_bin, models.get("llama", seed=24), "--batch", 2, name="bare")
    s = next(gen)
    try:
        err = bad(s, {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]})
        assert "tokenizer.json" in err
        err = bad(s, {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [1]}],
                      "outputs": [{"name": "text_output"}]})
        assert "text_output" in err and "tokenizer.json" in err
        g = grpcclient.InferenceServerClient(url="127.0.0.1:%d" % grpc_port(s))
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
        with pytest.raises(Exception) as ei:
            g.infer(s.name, [inp])
        assert "tokenizer.json" in str(ei.value)
        g.close()
    finally:
        for _ in gen:
            pass
