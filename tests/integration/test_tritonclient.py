"""`ferry serve` through tritonclient (PyPI `tritonclient[grpc,http]`,
NVIDIA's own client for Triton, installed into build/venv by `make deps`):
InferenceServerClient of both protocols, with the client's defaults (binary
tensor data over HTTP, raw contents over gRPC). Skipped for a python without
tritonclient.
"""

import queue
import time

import numpy as np
import pytest

import refdata

httpclient = refdata.client("tritonclient.http")
grpcclient = refdata.client("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from conftest import prompt_ids  # noqa: E402
from test_grpc import grpc_port  # noqa: E402
from test_http import jreq, serve, unpad  # noqa: E402

TIMEOUT = 60


@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=73)


@pytest.fixture(scope="module")
def srv(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 8)


def triton_clients(srv):
    """Generator for fixtures: {"http": client, "grpc": client} of srv."""
    h = httpclient.InferenceServerClient(url="127.0.0.1:%d" % srv.port, network_timeout=TIMEOUT)
    g = grpcclient.InferenceServerClient(url="127.0.0.1:%d" % grpc_port(srv))
    yield {"http": h, "grpc": g}
    h.close()
    g.close()


@pytest.fixture(scope="module")
def clients(srv):
    yield from triton_clients(srv)


def mod(proto):
    return httpclient if proto == "http" else grpcclient


def infer_rows(client, proto, model, prompts, n_new, logits=False):
    m = mod(proto)
    a = np.asarray(prompts, dtype=np.int64)
    inp = m.InferInput("input_ids", list(a.shape), "INT64")
    inp.set_data_from_numpy(a)  # binary data: the client's default
    outs = [m.InferRequestedOutput("output_ids")] + ([m.InferRequestedOutput("logits")] if logits else [])
    res = client.infer(model, [inp], outputs=outs, request_id="tc-1", parameters={"max_new_tokens": n_new})
    ids = res.as_numpy("output_ids")
    assert ids.dtype == np.int64 and ids.shape[0] == len(prompts)
    return [unpad(r) for r in ids.tolist()], (res.as_numpy("logits") if logits else None), res


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_health_and_metadata(clients, proto, srv, vocab):
    c = clients[proto]
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready(srv.name) and c.is_model_ready(srv.name, "1")
    if proto == "http":
        assert not c.is_model_ready("nope")  # 404
    else:
        with pytest.raises(InferenceServerException, match="NOT_FOUND"):
            c.is_model_ready("nope")
    if proto == "http":
        md = c.get_server_metadata()
        assert md["name"] == "ferry" and "binary_tensor_data" in md["extensions"]
        mm = c.get_model_metadata(srv.name)
        assert mm["name"] == srv.name and mm["platform"] == "ferry"
        assert [(t["name"], t["datatype"]) for t in mm["outputs"]] == [("output_ids", "INT64"), ("logits", "FP32")]
    else:
        md = c.get_server_metadata()
        assert md.name == "ferry" and "binary_tensor_data" in md.extensions
        mm = c.get_model_metadata(srv.name)
        assert mm.name == srv.name and mm.platform == "ferry" and list(mm.versions) == ["1"]
        assert [(t.name, t.datatype, list(t.shape)) for t in mm.outputs] == [
            ("output_ids", "INT64", [-1, -1]), ("logits", "FP32", [-1, vocab])]


def test_model_config_both_protocols_agree(clients, srv, vocab):
    h = clients["http"].get_model_config(srv.name)
    g = clients["grpc"].get_model_config(srv.name).config  # Triton's own ModelConfig message
    st, rest = jreq(srv, "GET", "/v2/models/%s/config" % srv.name)
    assert st == 200 and h == rest
    assert g.name == h["name"] == srv.name and g.platform == h["platform"] == "ferry" and g.backend == "ferry"
    assert g.max_batch_size == h["max_batch_size"] == 8
    assert g.version_policy.latest.num_versions == 1
    dt = grpcclient.model_config_pb2.DataType.Name
    assert [(t.name, dt(t.data_type), list(t.dims)) for t in g.input] == [
        (t["name"], t["data_type"], t["dims"]) for t in h["input"]] == [("input_ids", "TYPE_INT64", [-1])]
    assert [(t.name, dt(t.data_type), list(t.dims)) for t in g.output] == [
        (t["name"], t["data_type"], t["dims"]) for t in h["output"]]
    assert [list(t.dims) for t in g.output if t.name == "logits"] == [[vocab]]
    assert g.model_transaction_policy.decoupled and h["model_transaction_policy"]["decoupled"]


def test_infer_equals_generate_and_statistics(clients, srv, ferry, tiny, vocab, tmp_path):
    n_new = 8
    prompts = [prompt_ids(vocab, 5, 701), prompt_ids(vocab, 5, 702)]
    want, want_logits = ferry.generate(tiny, prompts, n_new, dump_logits=tmp_path / "l.bin")
    for proto in ("http", "grpc"):
        c = clients[proto]
        s0 = c.get_inference_statistics(srv.name)
        rows, logits, res = infer_rows(c, proto, srv.name, prompts, n_new, logits=True)
        assert rows == want, proto
        assert logits.dtype == np.float32 and logits.shape == (2, vocab)
        assert np.allclose(logits, want_logits, rtol=1e-4, atol=1e-4), proto
        resp = res.get_response()
        assert (resp["id"] if proto == "http" else resp.id) == "tc-1"
        s1 = c.get_inference_statistics(srv.name)
        if proto == "http":
            (m0,), (m1,) = s0["model_stats"], s1["model_stats"]
            count = lambda m: (m["inference_count"], m["inference_stats"]["success"]["count"])  # noqa: E731
            assert m1["name"] == srv.name and m1["version"] == "1"
        else:
            (m0,), (m1,) = s0.model_stats, s1.model_stats
            count = lambda m: (m.inference_count, m.inference_stats.success.count)  # noqa: E731
            assert m1.name == srv.name and m1.version == "1" and m1.execution_count > m0.execution_count
            assert m1.inference_stats.compute_infer.ns > m0.inference_stats.compute_infer.ns
        assert count(m1) == tuple(x + 2 for x in count(m0)), proto
    # the two protocols report the same figures
    g = clients["grpc"].get_inference_statistics(srv.name).model_stats[0]
    (h,) = clients["http"].get_inference_statistics(srv.name)["model_stats"]
    assert (g.inference_count, g.execution_count, g.last_inference, g.inference_stats.queue.ns) == (
        h["inference_count"], h["execution_count"], h["last_inference"], h["inference_stats"]["queue"]["ns"])


def test_stream_until_final_response(clients, srv, ferry, tiny, vocab):
    """start_stream / async_stream_infer: two requests on one stream, each
    answered token by token until triton_final_response."""
    n_new = 6
    prompts = {"a": prompt_ids(vocab, 4, 801), "b": prompt_ids(vocab, 7, 802)}
    want = {k: ferry.generate(tiny, p, n_new)[0] for k, p in prompts.items()}
    c = clients["grpc"]
    q = queue.Queue()
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        for k, p in prompts.items():
            inp = grpcclient.InferInput("input_ids", [1, len(p)], "INT64")
            inp.set_data_from_numpy(np.asarray([p], dtype=np.int64))
            c.async_stream_infer(srv.name, [inp], request_id=k, parameters={"max_new_tokens": n_new},
                                 outputs=[grpcclient.InferRequestedOutput("output_ids")])
        got, done = {k: [] for k in prompts}, set()
        deadline = time.monotonic() + TIMEOUT
        while done != set(prompts):
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, error
            resp = result.get_response()
            assert resp.id in prompts and resp.id not in done
            ids = result.as_numpy("output_ids")
            assert ids.shape == (1, 1)
            got[resp.id].append(int(ids[0, 0]))
            if resp.parameters["triton_final_response"].bool_param:
                done.add(resp.id)
    finally:
        c.stop_stream()
    assert got == want
