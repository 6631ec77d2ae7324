#!/usr/bin/env python3
"""gRPC front-end benchmark (not a test), two parts:

1. unary: ModelInfer through gRPC against the same infer request through
   REST (KServe v2 JSON, one keep-alive connection per client), on a tiny
   model, loopback, closed loop: each of C clients sends its next request
   when its answer comes. Reports requests/s, p50 and p99 latency.
2. streaming: ModelStreamInfer at 1 and 16 concurrent streams (one call
   each, one request per call) on a model partly on disk: time to first
   token (send -> first response) and inter-token latency (gaps between a
   request's responses), p50/p99 over all streams.

Uses the project's venv (grpcio, grpcio-tools, kserve) and KServe's
official generated stubs, loaded as the tests load them
(tests/integration/kserve_stubs.py):

    build/venv/bin/python bench/grpc_bench.py --unary-model build/demo-model \\
        --stream-model build/bench-1b-l32 --max-memory device=0,host=2GiB \\
        --offload-dir build/offload-grpc-bench
"""
import argparse
import http.client
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.environ.get("FERRY_BIN") or os.path.join(ROOT, "build", "ferry")  # as the tests take it
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import kserve_stubs  # noqa: E402


def messages():
    """(ModelInferRequest, ModelInferResponse, ModelStreamInferResponse) from KServe's stubs."""
    msgs, _, stream, _ = kserve_stubs.load(tempfile.mkdtemp(prefix="ferry-grpc-bench-"))
    return msgs.ModelInferRequest, msgs.ModelInferResponse, stream


def start(model, extra):
    p = subprocess.Popen([FERRY, "serve", "--model", model, "--http-port", "0", "--grpc-port", "0",
                          "--host", "127.0.0.1"] + extra, stderr=subprocess.PIPE, text=True)
    ports = {}
    for line in p.stderr:
        for proto in ("http", "grpc"):
            m = re.search(r"listening on %s://127\.0\.0\.1:(\d+)" % proto, line)
            if m:
                ports[proto] = int(m.group(1))
        if len(ports) == 2:
            break
    if len(ports) != 2:
        raise SystemExit("ferry serve did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    t0 = time.time()
    while time.time() - t0 < 900:
        c = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=5)
        try:
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                return p, ports
        except OSError:
            pass
        finally:
            c.close()
        time.sleep(0.3)
    raise SystemExit("ferry serve never became ready")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) * 1e3 if xs else float("nan")


def closed_loop(clients, per_client, one_request):
    """Runs `clients` threads, each calling one_request(state) per_client
    times; returns (requests/s, latencies)."""
    lat, errors = [], []
    lock = threading.Lock()

    def worker():
        state = {}
        mine = []
        try:
            for _ in range(per_client):
                t = time.perf_counter()
                one_request(state)
                mine.append(time.perf_counter() - t)
        except Exception as e:  # reported, not hidden
            errors.append(repr(e))
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        print("  errors:", len(errors), errors[:3])
    return len(lat) / dt, lat


def unary(model, clients_list, per_client, new_tokens, msgs):
    Req, Resp, _ = msgs
    name = os.path.basename(os.path.normpath(model))
    p, ports = start(model, ["--batch", "16"])
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]}],
                       "parameters": {"max_new_tokens": new_tokens}}).encode()
    req = Req(model_name=name)
    req.parameters["max_new_tokens"].int64_param = new_tokens
    t = req.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    req.raw_input_contents.append(np.asarray([1, 2, 3, 4], dtype="<i8").tobytes())
    ch = grpc.insecure_channel("127.0.0.1:%d" % ports["grpc"])
    call = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=Req.SerializeToString,
                          response_deserializer=Resp.FromString)

    def rest(state):
        c = state.get("c") or state.setdefault("c", http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=60))
        c.request("POST", "/v2/models/%s/infer" % name, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError("HTTP %d" % r.status)

    def grpc_one(state):
        call(req, timeout=60)

    try:
        for fn in (rest, grpc_one):  # warm-up
            fn({})
        print("== unary: %s, input [1,4], %d new tokens, closed loop, %d requests per client" %
              (name, new_tokens, per_client))
        for c in clients_list:
            for label, fn in (("REST", rest), ("gRPC", grpc_one)):
                rate, lat = closed_loop(c, per_client, fn)
                print("  %-4s clients %2d: %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms" %
                      (label, c, rate, pct(lat, 50), pct(lat, 99)))
    finally:
        ch.close()
        stop(p)


def streaming(model, extra, streams_list, new_tokens, msgs):
    Req, _, SResp = msgs
    name = os.path.basename(os.path.normpath(model))
    p, ports = start(model, extra)
    ch = grpc.insecure_channel("127.0.0.1:%d" % ports["grpc"])
    method = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                              request_serializer=Req.SerializeToString, response_deserializer=SResp.FromString)

    def one_stream(i, ttft, gaps, errors):
        req = Req(model_name=name, id="s%d" % i)
        req.parameters["max_new_tokens"].int64_param = new_tokens
        prompt = [1 + i % 7, 2, 3, 4, 5, 6, 7, 8]
        req.inputs.add(name="input_ids", datatype="INT64", shape=[1, len(prompt)])
        req.raw_input_contents.append(np.asarray(prompt, dtype="<i8").tobytes())
        q = queue.Queue()
        q.put(req)
        q.put(None)
        t0 = time.perf_counter()
        last, n = None, 0
        for resp in method(iter(q.get, None), timeout=3600):
            now = time.perf_counter()
            if resp.error_message:
                errors.append(resp.error_message)
                return
            if last is None:
                ttft.append(now - t0)
            else:
                gaps.append(now - last)
            last, n = now, n + 1
        if n != new_tokens:
            errors.append("stream %d: %d responses, want %d" % (i, n, new_tokens))

    try:
        one_stream(99, [], [], [])  # warm-up
        print("== streaming: %s %s, prompt 8 tokens, %d new tokens per stream" % (name, " ".join(extra), new_tokens))
        for k in streams_list:
            ttft, gaps, errors = [], [], []
            ts = [threading.Thread(target=one_stream, args=(i, ttft, gaps, errors)) for i in range(k)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
            print("  streams %2d: TTFT p50 %8.1f ms p99 %8.1f ms | inter-token p50 %7.1f ms p99 %7.1f ms | "
                  "%6.2f tok/s aggregate | errors %d" % (k, pct(ttft, 50), pct(ttft, 99), pct(gaps, 50),
                                                         pct(gaps, 99), k * new_tokens / dt, len(errors)))
            for e in errors[:3]:
                print("    error:", e)
        c = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=10)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith(("ferry_weight_bytes", "ferry_fetched_bytes_total")):
                print("  " + line)
    finally:
        ch.close()
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unary-model", default=os.path.join(ROOT, "build", "demo-model"))
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--per-client", type=int, default=400)
    ap.add_argument("--unary-new-tokens", type=int, default=2)
    ap.add_argument("--stream-model", default=None)
    ap.add_argument("--max-memory", default="device=0,host=2GiB")
    ap.add_argument("--offload-dir", default=os.path.join(ROOT, "build", "offload-grpc-bench"))
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--stream-new-tokens", type=int, default=16)
    a = ap.parse_args()
    msgs = messages()
    unary(a.unary_model, [int(x) for x in a.clients.split(",")], a.per_client, a.unary_new_tokens, msgs)
    if a.stream_model:
        streaming(a.stream_model, ["--max-memory", a.max_memory, "--offload-dir", a.offload_dir, "--batch", "16",
                                   "--context", "256"], [int(x) for x in a.streams.split(",")],
                  a.stream_new_tokens, msgs)


if __name__ == "__main__":
    sys.exit(main())
