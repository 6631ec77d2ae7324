"""`ferry serve`: the KServe v2 HTTP front end, driven over real sockets.

Each server is the real binary on a free loopback port (`--http-port 0`; the
port is read from its "listening on http://HOST:PORT" stderr line), started
once per module and stopped with SIGTERM (exit status 0 expected).

Covered: every endpoint (health, server and model metadata, infer with JSON
and binary tensor data both ways, Triton's generate / generate_stream with
SSE, Prometheus metrics); greedy outputs and last-position logits equal to
`ferry generate` (also with part of the model on disk); 16 concurrent
requests of different lengths equal to the same requests one by one;
seeded sampling is reproducible and draws what `ferry generate` draws;
every error of the spec answers a JSON {"error": ...} with its status and
the server keeps serving (bodies over --max-body: 413; a full queue: 503);
a client that goes away (streaming or not) frees its slot, and cancelled
rows leave the queue intact; an I/O error after a stream's first token ends
it with an error event; SIGTERM with requests in flight answers them and
exits 0; startup errors are one line. curl is the client for a few checks.

Servers: `srv` (tiny model, --batch 8), `srv_offload` (the same model with
layers on the device, in host memory and on disk), `srv_small_body`
(--max-body 1KiB), `srv_eio` (all on disk, FERRY_FAULT=read_eio=20) and
`slow` (an 8-layer small model streamed from disk, ~10-20 ms a token,
--batch 1 --max-queued 2) for requests that must still be running while
the test acts. Tests never assert on wall time: "the slot was freed" is
read from the token counters in /metrics.
"""

import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import st_util
from conftest import SANITIZER, prompt_ids, rel_err

SAME = 1e-6            # rel logit error allowed between two ferry runs of the same maths
READY_TIMEOUT = 60     # seconds for a server to become ready
REQ_TIMEOUT = 60       # seconds for any one HTTP request (a hang is a failure)
STOP_TIMEOUT = 30      # seconds for SIGTERM to end a server
LISTEN_RE = re.compile(r"listening on http://([0-9.]+):(\d+)")


# --------------------------------------------------------------------------
# the server process
# --------------------------------------------------------------------------

class Server:
    """One `ferry serve` process. Its stderr is drained by a thread (kept in
    self.log for failure messages)."""

    def __init__(self, ferry_bin, model, *flags, name=None, env=None):
        self.model = Path(model)
        self.name = name or self.model.name
        self.argv = [ferry_bin, "serve", "--model", str(model), "--http-port", "0", "--grpc-port", "0",
                     "--host", "127.0.0.1"] + [str(f) for f in flags]
        if name:
            self.argv += ["--name", name]
        self.log = []
        self.port = None
        self._port_seen = threading.Event()
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.log.append(line)
            m = LISTEN_RE.search(line)
            if m and self.port is None:
                self.port = int(m.group(2))
                self._port_seen.set()
        self._port_seen.set()  # EOF: the process ended

    def logtail(self, n=30):
        return "\n".join(self.log[-n:])

    def wait_port(self, timeout=READY_TIMEOUT):
        self._port_seen.wait(timeout)
        if self.port is None:
            self.kill()
            pytest.fail("ferry serve printed no 'listening on http://...' line within %ss "
                        "(rc=%r)\nargv: %s\noutput:\n%s" % (timeout, self.proc.poll(), " ".join(self.argv),
                                                            self.logtail()))
        return self.port

    def wait_ready(self, timeout=READY_TIMEOUT):
        """Polls /v2/health/ready until 200; returns the statuses seen (in order,
        repeats collapsed)."""
        self.wait_port(timeout)
        seen = []
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail("ferry serve exited (rc=%d) before it was ready:\n%s" % (
                    self.proc.returncode, self.logtail()))
            try:
                st = request(self, "GET", "/v2/health/ready", timeout=5)[0]
            except OSError as e:
                st = type(e).__name__
            if not seen or seen[-1] != st:
                seen.append(st)
            if st == 200:
                return seen
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail("server not ready within %ss (statuses %r):\n%s" % (timeout, seen, self.logtail()))
            time.sleep(0.02)

    def stop(self):
        """SIGTERM; returns the exit status (kills and fails on a hang)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail("ferry serve did not exit within %ss of SIGTERM:\n%s" % (STOP_TIMEOUT, self.logtail()))
        self._reader.join(5)
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def serve(ferry_bin, model, *flags, name=None, env=None):
    """Generator for fixtures: yields a ready server, then stops it with
    SIGTERM and checks exit status 0."""
    srv = Server(ferry_bin, model, *flags, name=name, env=env)
    try:
        srv.wait_ready()
        yield srv
        rc = srv.stop()
        assert rc == 0, "ferry serve exited with %r after SIGTERM (want 0):\n%s" % (rc, srv.logtail())
    finally:
        srv.kill()


# --------------------------------------------------------------------------
# HTTP helpers (standard library only)
# --------------------------------------------------------------------------

def request(srv, method, path, body=None, headers=None, timeout=REQ_TIMEOUT):
    """One request on a fresh connection: (status, {lower-case header: value}, body bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = dict(headers or {}, **{"Content-Type": "application/json"})
        elif isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def jreq(srv, method, path, body=None, headers=None, timeout=REQ_TIMEOUT):
    """(status, parsed JSON body); fails if the body is not JSON."""
    st, hdrs, data = request(srv, method, path, body, headers, timeout)
    try:
        obj = json.loads(data.decode("utf-8"))
    except ValueError:
        pytest.fail("%s %s -> %d with a non-JSON body: %r" % (method, path, st, data[:500]))
    return st, obj


def expect_error(srv, status, method, path, body=None, headers=None, needles=()):
    """The request fails with `status` and a JSON {"error": "<non-empty>"} body
    (mentioning one of needles, case-insensitively, if given); then the server
    still answers a normal request."""
    st, hdrs, data = request(srv, method, path, body, headers)
    ctx = "%s %s body=%r -> %d %r" % (method, path, body if not isinstance(body, bytes) else body[:200],
                                       st, data[:500])
    assert st == status, "want %d: %s" % (status, ctx)
    try:
        obj = json.loads(data.decode("utf-8"))
    except ValueError:
        pytest.fail("error body is not JSON: %s" % ctx)
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str) and obj["error"].strip(), \
        "error body must be {\"error\": \"...\"}: %s" % ctx
    assert "json" in hdrs.get("content-type", ""), "error content-type %r: %s" % (hdrs.get("content-type"), ctx)
    if needles:
        low = obj["error"].lower()
        assert any(n.lower() in low for n in needles), "error should mention one of %r: %s" % (needles, ctx)
    assert_alive(srv)
    return obj["error"]


def assert_alive(srv):
    """A normal request still succeeds (and the process is still running)."""
    assert srv.proc.poll() is None, "server died (rc=%r):\n%s" % (srv.proc.returncode, srv.logtail())
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                   {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [5, 6, 7]}],
                    "parameters": {"max_new_tokens": 2}})
    assert st == 200, "normal infer after an error: %d %r" % (st, obj)
    out = _output(obj, "output_ids")
    assert out["shape"][0] == 1 and 1 <= out["shape"][1] <= 2


def _output(obj, name):
    outs = [o for o in obj.get("outputs", []) if o.get("name") == name]
    assert len(outs) == 1, "response should have one output %r: %r" % (name, obj)
    return outs[0]


def infer_body(prompts, outputs=None, req_id=None, nested=False, **params):
    a = np.asarray(prompts, dtype=np.int64)
    assert a.ndim == 2
    body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": list(a.shape),
                        "data": a.tolist() if nested else a.reshape(-1).tolist()}]}
    if params:
        body["parameters"] = params
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    if req_id is not None:
        body["id"] = req_id
    return body


def infer(srv, prompts, max_new_tokens, logits=False, **params):
    """POST infer for a batch of equal-length prompts; returns (rows of
    generated ids, logits array [B, vocab] or None, response object)."""
    outputs = ["output_ids", "logits"] if logits else None
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                   infer_body(prompts, outputs=outputs, max_new_tokens=max_new_tokens, **params))
    assert st == 200, "infer failed: %d %r" % (st, obj)
    return _rows(obj, len(prompts)), (_logits(obj, len(prompts)) if logits else None), obj


def _rows(obj, batch):
    out = _output(obj, "output_ids")
    assert out["datatype"] == "INT64", out
    shape = out["shape"]
    assert len(shape) == 2 and shape[0] == batch, "output_ids shape %r for batch %d" % (shape, batch)
    a = np.asarray(out["data"], dtype=np.int64)
    assert a.size == shape[0] * shape[1], "output_ids data has %d values for shape %r" % (a.size, shape)
    return [unpad(r) for r in a.reshape(shape).tolist()]


def _logits(obj, batch):
    out = _output(obj, "logits")
    assert out["datatype"] == "FP32", out
    shape = out["shape"]
    assert len(shape) == 2 and shape[0] == batch, "logits shape %r" % (shape,)
    a = np.asarray(out["data"], dtype=np.float64)
    assert a.size == shape[0] * shape[1]
    return a.reshape(shape)


PAD = -1  # pads the shorter rows of output_ids [B, N] (a stop token ended them)


def unpad(row):
    while row and row[-1] == PAD:
        row = row[:-1]
    return row


def generate(srv, ids, timeout=REQ_TIMEOUT, **params):
    st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                   {"input_ids": list(ids), "parameters": params}, timeout=timeout)
    assert st == 200, "generate failed: %d %r" % (st, obj)
    assert obj.get("model_name") == srv.name, obj
    return obj["output_ids"]


def sse_events(resp):
    """Yields the parsed JSON of each `data:` event of a text/event-stream."""
    data = []
    while True:
        line = resp.readline()
        if not line:
            if data:
                yield json.loads("\n".join(data))
            return
        line = line.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield json.loads("\n".join(data))
                data = []
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)


def event_tokens(ev):
    """The token id one stream event carries, as a list of one."""
    assert "error" not in ev, "error event in the stream: %r" % (ev,)
    assert isinstance(ev.get("token_id"), int), "stream event without token_id: %r" % (ev,)
    return [ev["token_id"]]


def stream_tokens(events, model):
    """The tokens of a whole stream, checking each event: model_name, and
    index counting from 0 in order."""
    toks = []
    for i, ev in enumerate(events):
        toks += event_tokens(ev)
        assert ev.get("index") == i, "event %d has index %r: %r" % (i, ev.get("index"), events)
        assert ev.get("model_name") == model, ev
    return toks


def open_stream(srv, ids, timeout=REQ_TIMEOUT, **params):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    conn.request("POST", "/v2/models/%s/generate_stream" % srv.name,
                 body=json.dumps({"input_ids": list(ids), "parameters": params}).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return conn, resp


def hang_up(conn):
    """Closes a client connection abruptly, as a client that goes away does."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass
    conn.close()


def stream(srv, ids, **params):
    conn, resp = open_stream(srv, ids, **params)
    try:
        assert resp.status == 200, "generate_stream: %d %r" % (resp.status, resp.read()[:500])
        ctype = resp.getheader("Content-Type", "")
        assert ctype.startswith("text/event-stream"), ctype
        return list(sse_events(resp))
    finally:
        conn.close()


def metrics(srv):
    st, hdrs, data = request(srv, "GET", "/metrics")
    assert st == 200, (st, data[:300])
    assert hdrs.get("content-type", "").startswith("text/plain"), hdrs.get("content-type")
    return parse_prometheus(data.decode("utf-8"))


SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$')
LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_prometheus(text):
    """{(name, frozenset(labels.items())): value} after checking every line
    is a comment, blank, or a well-formed sample of a family with a TYPE."""
    samples = {}
    types = {}
    for ln in text.splitlines():
        if not ln.strip():
            continue
        if ln.startswith("#"):
            parts = ln.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                assert parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"), ln
                types[parts[2]] = parts[3]
            continue
        m = SAMPLE_RE.match(ln)
        assert m, "malformed metrics line: %r" % ln
        name, labels = m.group(1), {}
        if m.group(3):
            rest = m.group(3)
            pos = 0
            while pos < len(rest):
                lm = LABEL_RE.match(rest, pos)
                assert lm, "malformed labels in %r" % ln
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        v = m.group(4)
        value = float(v.replace("+Inf", "inf").replace("-Inf", "-inf").replace("NaN", "nan"))
        key = (name, frozenset(labels.items()))
        assert key not in samples, "duplicate sample %r" % ln
        samples[key] = value
        base = re.sub(r"_(bucket|sum|count|total|created)$", "", name)
        assert name in types or base in types, "sample %r has no # TYPE line" % ln
    return samples


def msum(samples, name, **labels):
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and all((k, str(x)) in ls for k, x in labels.items()))


def curl(*args, timeout=REQ_TIMEOUT):
    p = subprocess.run(["curl", "-sS", "--max-time", str(timeout)] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout + 10)
    assert p.returncode == 0, "curl %s failed: %s" % (" ".join(map(str, args)), p.stderr.decode()[-500:])
    return p.stdout


def curl_status(*args):
    """(HTTP status, body) via curl."""
    out = curl("-w", "\n%{http_code}", *args)
    body, _, code = out.rpartition(b"\n")
    return int(code), body


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=71)


@pytest.fixture(scope="module")
def srv(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 8)


@pytest.fixture(scope="module")
def srv_offload(ferry_bin, tiny, tmp_path_factory):
    """The same model with part of it streamed from disk, and prompts
    prefilled in chunks of at most 8 token rows per step."""
    od = tmp_path_factory.mktemp("http-offload")
    # tiny: 148 KiB per layer, 64 KiB embedding, 68 KiB head -> layer 0 on the
    # device, the head in host memory, layer 1 and the embedding on disk
    yield from serve(ferry_bin, tiny, "--batch", 8, "--max-memory-scope", "weights", "--max-memory", "device=150KiB,host=100KiB",
                     "--offload-dir", od, "--max-step-tokens", 8, name="tiny-offload")


@pytest.fixture(scope="module")
def srv_small_body(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 2, "--max-body", "1KiB", name="tinybody")


@pytest.fixture(scope="module")
def slow_model(models):
    """A model slow enough (every step streams 25 MB from disk) for requests
    that must still be running while the test does something else."""
    return models.get("llama", "small", layers=8, seed=72)


@pytest.fixture(scope="module")
def slow_od(tmp_path_factory):
    return tmp_path_factory.mktemp("http-slow-offload")


@pytest.fixture(scope="module")
def ready_trace(ferry_bin, slow_model, slow_od):
    """Starts the slow server (batch 1, two queued requests at most) with an
    empty offload dir (so it must write the blobs before it is ready), and
    records what the endpoints answer from the first moment the port is
    known."""
    s = Server(ferry_bin, slow_model, "--batch", 1, "--max-queued", 2,
               "--max-memory", "device=0,host=0", "--offload-dir", slow_od, name="slow")
    try:
        s.wait_port()
        early = {}
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/slow/ready", "/v2/models/slow/infer"):
            try:
                if path.endswith("/infer"):
                    early[path] = request(s, "POST", path, _ids([1, 2], [1, 2], max_new_tokens=1), timeout=30)
                else:
                    early[path] = request(s, "GET", path, timeout=10)
            except OSError as e:
                early[path] = e
        seen = s.wait_ready()
        yield s, early, seen
        rc = s.stop()
        assert rc == 0, "ferry serve exited with %r after SIGTERM (want 0):\n%s" % (rc, s.logtail())
    finally:
        s.kill()


@pytest.fixture(scope="module")
def slow(ready_trace):
    return ready_trace[0]


def _prompt_set(vocab):
    """Prompts of several lengths (same-length pairs can share one infer)."""
    return {n: [prompt_ids(vocab, n, 300 + n), prompt_ids(vocab, n, 400 + n)] for n in (1, 4, 9, 23)}


# --------------------------------------------------------------------------
# health, metadata
# --------------------------------------------------------------------------

def test_health(srv):
    for path, want in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True}),
                       ("/v2/models/%s/ready" % srv.name, {"name": srv.name, "ready": True})):
        st, obj = jreq(srv, "GET", path)
        assert st == 200 and obj == want, (path, st, obj)
        # HEAD answers like GET, without a body
        st, hdrs, data = request(srv, "HEAD", path)
        assert st == 200 and data == b"", (path, st, data)
    # a real client
    code, body = curl_status("http://127.0.0.1:%d/v2/health/live" % srv.port)
    assert code == 200, body
    code, body = curl_status("http://127.0.0.1:%d/v2/health/ready" % srv.port)
    assert code == 200, body


def test_ready_503_until_loaded(ready_trace):
    """The server listens before the model is ready; until then the ready
    endpoints answer 503 with a JSON error (hard to catch on a small model:
    200 at once is accepted), and become 200."""
    s, early, seen = ready_trace
    for path, r in early.items():
        assert not isinstance(r, Exception), "the port did not answer %s right after 'listening': %r\n%s" % (
            path, r, s.logtail())
    st, hdrs, data = early["/v2/health/live"]
    assert st == 200, ("live must answer 200 while loading", st, data[:300])
    for path in ("/v2/health/ready", "/v2/models/slow/ready", "/v2/models/slow/infer"):
        st, hdrs, data = early[path]
        assert st in (200, 503), (path, st, data[:300])
        if st == 503:
            assert isinstance(json.loads(data.decode()).get("error"), str), (path, data[:300])
    assert all(x in (200, 503) for x in seen), "ready statuses while loading: %r" % (seen,)
    assert seen[-1] == 200
    assert request(s, "GET", "/v2/models/slow/ready")[0] == 200


def test_server_metadata(srv):
    st, obj = jreq(srv, "GET", "/v2")
    assert st == 200, obj
    assert obj.get("name") == "ferry", obj
    assert isinstance(obj.get("version"), str) and obj["version"], obj
    ext = obj.get("extensions")
    assert isinstance(ext, list) and all(isinstance(e, str) for e in ext), obj
    assert "binary_tensor_data" in ext, ext
    assert any("generate" in e for e in ext), ext


def test_model_metadata(srv, vocab):
    st, obj = jreq(srv, "GET", "/v2/models/%s" % srv.name)
    assert st == 200, obj
    assert obj.get("name") == srv.name, obj
    ins = {t["name"]: t for t in obj["inputs"]}
    outs = {t["name"]: t for t in obj["outputs"]}
    assert ins["input_ids"]["datatype"] == "INT64", ins
    assert ins["input_ids"]["shape"] == [-1, -1], ins
    assert outs["output_ids"]["datatype"] == "INT64", outs
    assert outs["output_ids"]["shape"] == [-1, -1], outs
    assert outs["logits"]["datatype"] == "FP32", outs
    assert outs["logits"]["shape"] == [-1, vocab], outs


def test_name_flag(srv_offload):
    """--name sets the model name in the URLs and the metadata."""
    st, obj = jreq(srv_offload, "GET", "/v2/models/tiny-offload")
    assert st == 200 and obj["name"] == "tiny-offload", obj
    assert request(srv_offload, "GET", "/v2/models/tiny-offload/ready")[0] == 200


# --------------------------------------------------------------------------
# infer against `ferry generate`
# --------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["resident", "offload"])
def test_infer_greedy_equals_cli(request_fixture_server, which, ferry, tiny, vocab, tmp_path):
    s = request_fixture_server(which)
    n_new = 12
    for n, prompts in _prompt_set(vocab).items():
        want, want_logits = ferry.generate(tiny, prompts, n_new, dump_logits=tmp_path / ("l%d.bin" % n))
        got, got_logits, obj = infer(s, prompts, n_new, logits=True)
        assert got == want, "prompt length %d: http %r, ferry generate %r" % (n, got, want)
        assert got_logits.shape == (2, vocab)
        err = rel_err(got_logits, want_logits)
        assert err <= SAME, "prompt length %d: logits rel err %.3g" % (n, err)
        # the argmax of the logits is the first greedy token
        assert [int(np.argmax(r)) for r in got_logits] == [w[0] for w in want]


@pytest.fixture
def request_fixture_server(request):
    return lambda which: request.getfixturevalue({"resident": "srv", "offload": "srv_offload"}[which])


def test_infer_one_prompt_at_a_time_equals_cli(srv, ferry, tiny, vocab):
    """B = 1 requests of every length, and without an `outputs` list: only
    output_ids comes back."""
    for n, prompts in _prompt_set(vocab).items():
        want, _ = ferry.generate(tiny, prompts[0], 7)
        st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                       infer_body([prompts[0]], max_new_tokens=7))
        assert st == 200, obj
        assert [o["name"] for o in obj["outputs"]] == ["output_ids"], obj
        assert _rows(obj, 1) == [want]
        assert _output(obj, "output_ids")["shape"] == [1, 7]


def test_infer_response_fields(srv, vocab):
    p = prompt_ids(vocab, 5, 9)
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                   infer_body([p, p[::-1]], req_id="req-42", max_new_tokens=3))
    assert st == 200, obj
    assert obj.get("id") == "req-42", obj
    assert obj.get("model_name") == srv.name, obj
    out = _output(obj, "output_ids")
    assert out["shape"] == [2, 3] and out["datatype"] == "INT64"
    assert all(isinstance(x, int) and 0 <= x < vocab for x in np.asarray(out["data"]).reshape(-1).tolist())
    # nested data is the same request
    st2, obj2 = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                     infer_body([p, p[::-1]], nested=True, max_new_tokens=3))
    assert st2 == 200, obj2
    assert _rows(obj2, 2) == _rows(obj, 2)
    assert "id" not in obj2 or obj2["id"] in ("", None), obj2


def test_infer_shape_1d_is_one_prompt(srv, vocab):
    """input_ids of shape [T] is read as [1, T]."""
    p = prompt_ids(vocab, 5, 13)
    want = infer(srv, [p], 4)[0]
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name, _ids([5], p, max_new_tokens=4))
    assert st == 200, obj
    assert _rows(obj, 1) == want


@pytest.mark.parametrize("shape,data", [
    ([2, 2], [[1, 2, 3], [4]]),      # the right number of values, nested otherwise than the shape
    ([1, 4], [[1, 2], [3, 4]]),
    ([4], [[1, 2], [3, 4]]),         # nested data for a one-dimensional shape
    ([2, 2], [[1, 2], 3, 4]),
    ([2, 2], [[[1, 2]], [[3, 4]]]),
])
def test_nested_data_must_match_shape(srv, shape, data):
    """Nested data must be nested as the shape says (README: shape and data
    that disagree are a 400)."""
    expect_error(srv, 400, "POST", "/v2/models/%s/infer" % srv.name,
                 json.dumps(_ids(shape, data)).encode(), {"Content-Type": "application/json"})


def test_generate_nested_and_id(srv, vocab):
    """generate with a list of prompts answers a list of lists; id is echoed."""
    ps = [prompt_ids(vocab, 3, 17), prompt_ids(vocab, 8, 18)]
    want = [infer(srv, [p], 5)[0][0] for p in ps]
    st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                   {"id": "g-1", "input_ids": ps, "parameters": {"max_new_tokens": 5}})
    assert st == 200, obj
    assert obj["output_ids"] == want and obj.get("id") == "g-1" and obj["model_name"] == srv.name, obj
    # default max_new_tokens is 16
    assert len(generate(srv, ps[0])) == 16


def test_infer_logits_only(srv, ferry, tiny, vocab, tmp_path):
    """`outputs` naming only logits returns only logits."""
    p = prompt_ids(vocab, 6, 11)
    _, want = ferry.generate(tiny, p, 1, dump_logits=tmp_path / "l.bin")
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                   infer_body([p], outputs=["logits"], max_new_tokens=1))
    assert st == 200, obj
    assert [o["name"] for o in obj["outputs"]] == ["logits"], obj
    assert rel_err(_logits(obj, 1), want) <= SAME


def test_max_new_tokens_and_stop_ids(srv, vocab):
    p = prompt_ids(vocab, 6, 21)
    full = infer(srv, [p], 16)[0][0]
    assert len(full) == 16
    for n in (1, 5):
        assert infer(srv, [p], n)[0][0] == full[:n]
    # stop at the token generated at step k: output ends with its first occurrence
    k = 6
    stop = full[k]
    first = full.index(stop)
    got = infer(srv, [p], 16, stop_token_ids=[stop])[0][0]
    assert got == full[:first + 1], (got, full, stop)
    # several stop ids: the earliest wins
    other = full[10]
    got = infer(srv, [p], 16, stop_token_ids=[other, stop])[0][0]
    assert got == full[:min(full.index(other), first) + 1], (got, full)


def test_stop_ids_in_a_batch_pad_shorter_rows(srv, vocab):
    """Rows of a batch that stop early are padded to the longest row."""
    p, q = prompt_ids(vocab, 6, 21), prompt_ids(vocab, 6, 22)
    fp, fq = infer(srv, [p, q], 12)[0]
    stop = fp[2]
    if stop in fq[:11]:
        pytest.skip("prompts share the stop token early")  # not with these seeds
    st, obj = jreq(srv, "POST", "/v2/models/%s/infer" % srv.name,
                   infer_body([p, q], max_new_tokens=12, stop_token_ids=[stop]))
    assert st == 200, obj
    out = _output(obj, "output_ids")
    assert out["shape"] == [2, 12], out
    rows = np.asarray(out["data"]).reshape(2, 12).tolist()
    i = fp.index(stop)
    assert rows[0][:i + 1] == fp[:i + 1]
    assert all(x == PAD for x in rows[0][i + 1:]), rows[0]
    assert rows[1] == fq


def test_sampling_seed_deterministic(srv, vocab):
    p = prompt_ids(vocab, 5, 31)
    params = dict(temperature=1.0, top_k=50, top_p=0.95, seed=1234)
    a = infer(srv, [p, p], 16, **params)[0]
    b = infer(srv, [p, p], 16, **params)[0]
    assert a == b
    # other seeds give other draws (16 tokens of a random tiny model at T=1)
    others = [infer(srv, [p], 16, **dict(params, seed=s))[0][0] for s in (1, 2, 3)]
    assert any(o != a[0] for o in others), (a, others)
    # top_k = 1 is greedy whatever the seed
    greedy = infer(srv, [p], 16)[0][0]
    assert infer(srv, [p], 16, temperature=1.0, top_k=1, seed=99)[0][0] == greedy


def test_sampled_equals_cli(srv, ferry, tiny, vocab):
    """A sampled request with a seed draws what `ferry generate` draws for
    one prompt with the same seed and sampling parameters."""
    for params in (dict(temperature=1.0, seed=5), dict(temperature=0.7, top_k=20, top_p=0.9, seed=12345)):
        p = prompt_ids(vocab, 6, 33)
        flags = ["--temperature", params["temperature"], "--seed", params["seed"]]
        if "top_k" in params:
            flags += ["--top-k", params["top_k"], "--top-p", params["top_p"]]
        want, _ = ferry.generate(tiny, p, 12, *flags)
        assert infer(srv, [p], 12, **params)[0][0] == want, params
        assert generate(srv, p, max_new_tokens=12, **params) == want, params


def test_sampled_batch_equals_cli(srv, ferry, tiny, vocab):
    """A sampled batch draws what `ferry generate` draws for the same batch:
    prompt i of a batch has its own stream of the seed (README, generate), so
    B copies of one prompt give B different samples, not B copies of one."""
    p = prompt_ids(vocab, 6, 34)
    want, _ = ferry.generate(tiny, [p, p, p], 12, "--temperature", 1.0, "--seed", 5)
    got = infer(srv, [p, p, p], 12, temperature=1.0, seed=5)[0]
    assert got == want, "server rows %r, ferry generate %r" % (got, want)
    st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                   {"input_ids": [p, p, p], "parameters": {"max_new_tokens": 12, "temperature": 1.0, "seed": 5}})
    assert st == 200 and obj["output_ids"] == want, obj
    # prompts of different lengths (generate only) and top-k / top-p too
    q = prompt_ids(vocab, 9, 35)
    flags = ("--temperature", 0.8, "--top-k", 30, "--top-p", 0.9, "--seed", 77)
    want, _ = ferry.generate(tiny, [p, q], 10, *flags)
    st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                   {"input_ids": [p, q], "parameters": {"max_new_tokens": 10, "temperature": 0.8, "top_k": 30,
                                                        "top_p": 0.9, "seed": 77}})
    assert st == 200 and obj["output_ids"] == want, (obj, want)


def test_many_rows_in_one_request(srv, vocab):
    """More rows than batch slots: they queue and all complete, each as it
    would alone."""
    prompts = [prompt_ids(vocab, 5, 700 + i) for i in range(20)]
    want = [infer(srv, [p], 6)[0][0] for p in prompts]
    assert infer(srv, prompts, 6)[0] == want
    st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                   {"input_ids": prompts, "parameters": {"max_new_tokens": 6}})
    assert st == 200 and obj["output_ids"] == want, obj


# --------------------------------------------------------------------------
# binary tensor data extension
# --------------------------------------------------------------------------

def _binary_request(srv, header, raw, timeout=REQ_TIMEOUT):
    hb = json.dumps(header).encode()
    return request(srv, "POST", "/v2/models/%s/infer" % srv.name, hb + raw,
                   {"Inference-Header-Content-Length": str(len(hb)),
                    "Content-Type": "application/octet-stream"}, timeout=timeout)


def _split_binary_response(hdrs, data):
    """(JSON header object, {output name: raw bytes})."""
    n = hdrs.get("inference-header-content-length")
    assert n is not None, "binary response without Inference-Header-Content-Length: %r" % (hdrs,)
    n = int(n)
    obj = json.loads(data[:n].decode())
    raw, pos = {}, n
    for o in obj["outputs"]:
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            continue
        assert "data" not in o, o
        raw[o["name"]] = data[pos:pos + size]
        pos += size
    assert pos == len(data), "binary sizes %d != body %d" % (pos, len(data))
    return obj, raw


def test_binary_input_json_output(srv, vocab):
    prompts = _prompt_set(vocab)[9]
    want = infer(srv, prompts, 6)[0]
    raw = np.asarray(prompts, dtype="<i8").tobytes()
    header = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 9],
                          "parameters": {"binary_data_size": len(raw)}}],
              "parameters": {"max_new_tokens": 6}}
    st, hdrs, data = _binary_request(srv, header, raw)
    assert st == 200, data[:500]
    obj = json.loads(data.decode())  # no binary outputs asked: plain JSON
    assert _rows(obj, 2) == want


def test_binary_both_ways(srv, ferry, tiny, vocab, tmp_path):
    prompts = _prompt_set(vocab)[4]
    want, want_logits = ferry.generate(tiny, prompts, 5, dump_logits=tmp_path / "l.bin")
    raw = np.asarray(prompts, dtype="<i8").tobytes()
    header = {"id": "bin-1",
              "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 4],
                          "parameters": {"binary_data_size": len(raw)}}],
              "outputs": [{"name": "output_ids", "parameters": {"binary_data": True}},
                          {"name": "logits", "parameters": {"binary_data": True}}],
              "parameters": {"max_new_tokens": 5}}
    st, hdrs, data = _binary_request(srv, header, raw)
    assert st == 200, data[:500]
    assert hdrs.get("content-type") == "application/octet-stream", hdrs
    obj, bins = _split_binary_response(hdrs, data)
    assert obj.get("id") == "bin-1"
    outs = {o["name"]: o for o in obj["outputs"]}
    assert outs["output_ids"]["shape"] == [2, 5] and outs["output_ids"]["datatype"] == "INT64"
    assert outs["logits"]["shape"] == [2, vocab] and outs["logits"]["datatype"] == "FP32"
    ids = np.frombuffer(bins["output_ids"], dtype="<i8").reshape(2, 5).tolist()
    assert ids == want
    lg = np.frombuffer(bins["logits"], dtype="<f4").reshape(2, vocab)
    assert rel_err(lg, want_logits) <= SAME


def test_binary_data_output_parameter_and_curl(srv, vocab, tmp_path):
    """The request-level binary_data_output parameter makes every output
    binary; sent with curl --data-binary."""
    p = prompt_ids(vocab, 7, 41)
    want, want_logits, _ = infer(srv, [p], 4, logits=True)
    raw = np.asarray([p], dtype="<i8").tobytes()
    hb = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 7],
                                 "parameters": {"binary_data_size": len(raw)}}],
                     "outputs": [{"name": "output_ids"}, {"name": "logits"}],
                     "parameters": {"max_new_tokens": 4, "binary_data_output": True}}).encode()
    body = tmp_path / "req.bin"
    body.write_bytes(hb + raw)
    hfile = tmp_path / "hdrs.txt"
    out = curl("-D", hfile, "-H", "Inference-Header-Content-Length: %d" % len(hb),
               "-H", "Content-Type: application/octet-stream", "--data-binary", "@%s" % body,
               "http://127.0.0.1:%d/v2/models/%s/infer" % (srv.port, srv.name))
    hdrs = {}
    for ln in hfile.read_text().splitlines()[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    assert hfile.read_text().split()[1] == "200", hfile.read_text()
    obj, bins = _split_binary_response(hdrs, out)
    assert set(bins) == {"output_ids", "logits"}, obj
    assert np.frombuffer(bins["output_ids"], dtype="<i8").tolist() == want[0]
    # the JSON logits (printed to round-trip) are the binary float32 values exactly
    assert np.array_equal(np.frombuffer(bins["logits"], dtype="<f4").reshape(1, -1),
                          want_logits.astype(np.float32))


# --------------------------------------------------------------------------
# generate / generate_stream
# --------------------------------------------------------------------------

def test_generate_equals_infer(srv, vocab):
    for n, prompts in _prompt_set(vocab).items():
        want = infer(srv, [prompts[0]], 9)[0][0]
        assert generate(srv, prompts[0], max_new_tokens=9) == want, n


def test_generate_stream_token_by_token(srv, vocab):
    for n, prompts in _prompt_set(vocab).items():
        want = generate(srv, prompts[1], max_new_tokens=10)
        events = stream(srv, prompts[1], max_new_tokens=10)
        assert len(events) == 10, "want one event per token: %r" % (events,)
        assert stream_tokens(events, srv.name) == want, (n, events, want)


def test_generate_stream_sampled_and_stopped(srv, vocab):
    p = prompt_ids(vocab, 8, 51)
    params = dict(max_new_tokens=12, temperature=0.8, top_k=40, seed=7)
    want = generate(srv, p, **params)
    toks = stream_tokens(stream(srv, p, **params), srv.name)
    assert toks == want
    stop = want[4]
    toks = stream_tokens(stream(srv, p, stop_token_ids=[stop], **params), srv.name)
    assert toks == want[:want.index(stop) + 1]


def test_generate_stream_curl(srv, vocab):
    p = prompt_ids(vocab, 3, 61)
    want = generate(srv, p, max_new_tokens=5)
    out = curl("-N", "-H", "Content-Type: application/json",
               "-d", json.dumps({"input_ids": p, "parameters": {"max_new_tokens": 5}}),
               "http://127.0.0.1:%d/v2/models/%s/generate_stream" % (srv.port, srv.name)).decode()
    events = [json.loads(ln[len("data:"):].strip()) for ln in out.splitlines() if ln.startswith("data:")]
    assert stream_tokens(events, srv.name) == want, out


def test_infer_curl(srv, ferry, tiny, vocab):
    p = prompt_ids(vocab, 4, 71)
    want, _ = ferry.generate(tiny, p, 6)
    code, body = curl_status("-H", "Content-Type: application/json",
                             "-d", json.dumps(infer_body([p], max_new_tokens=6)),
                             "http://127.0.0.1:%d/v2/models/%s/infer" % (srv.port, srv.name))
    assert code == 200, body
    assert _rows(json.loads(body), 1) == [want]


# --------------------------------------------------------------------------
# concurrency
# --------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["resident", "offload"])
def test_16_concurrent_equal_one_by_one(request_fixture_server, which, ferry, tiny, vocab):
    srv = request_fixture_server(which)
    reqs = [(prompt_ids(vocab, 1 + (7 * i) % 29, 500 + i), 1 + (11 * i) % 40) for i in range(16)]
    one_by_one = [infer(srv, [p], n)[0][0] for p, n in reqs]
    for (p, n), got in zip(reqs, one_by_one):
        assert len(got) == n
    # the first few against the command line too
    for (p, n), got in list(zip(reqs, one_by_one))[:3]:
        assert ferry.generate(tiny, p, n)[0] == got
    barrier = threading.Barrier(16)

    def one(i):
        barrier.wait(REQ_TIMEOUT)
        p, n = reqs[i]
        if i % 2:
            return infer(srv, [p], n)[0][0]
        return generate(srv, p, max_new_tokens=n)

    before = metrics(srv)
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        got = list(ex.map(one, range(16)))
    after = metrics(srv)
    # they shared steps: some step ran more than one sequence
    single = msum(after, "ferry_batch_size_bucket", le="1") - msum(before, "ferry_batch_size_bucket", le="1")
    steps = msum(after, "ferry_batch_size_count") - msum(before, "ferry_batch_size_count")
    assert steps > single, "16 concurrent requests never shared a step (%d steps)" % steps
    for i, (g, w) in enumerate(zip(got, one_by_one)):
        assert g == w, "request %d (prompt %d, %d new): concurrent %r, alone %r" % (
            i, len(reqs[i][0]), reqs[i][1], g, w)


def test_concurrent_streams(srv, vocab):
    reqs = [(prompt_ids(vocab, 2 + i, 600 + i), 5 + 3 * i) for i in range(6)]
    want = [generate(srv, p, max_new_tokens=n) for p, n in reqs]

    def one(i):
        p, n = reqs[i]
        return stream_tokens(stream(srv, p, max_new_tokens=n), srv.name)

    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(one, range(6)))
    assert got == want


# --------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------

M_REQUESTS = "ferry_requests_total"            # {endpoint, code}
M_GENERATED = "ferry_generated_tokens_total"
M_PROMPTED = "ferry_prompt_tokens_total"
M_SEQUENCES = "ferry_sequences_total"           # {outcome: done, failed, cancelled}


def test_metrics_move(srv, vocab):
    before = metrics(srv)
    p = prompt_ids(vocab, 5, 81)
    infer(srv, [p, p], 7)
    generate(srv, p, max_new_tokens=3)
    stream(srv, p, max_new_tokens=4)
    request(srv, "POST", "/v2/models/%s/infer" % srv.name, b"{nope")  # one failure
    after = metrics(srv)
    d_gen = msum(after, M_GENERATED) - msum(before, M_GENERATED)
    d_prompt = msum(after, M_PROMPTED) - msum(before, M_PROMPTED)
    assert d_gen == 2 * 7 + 3 + 4, d_gen
    assert d_prompt == 5 * 4, d_prompt
    assert msum(after, M_REQUESTS) - msum(before, M_REQUESTS) >= 4
    assert msum(after, M_REQUESTS, code=400) - msum(before, M_REQUESTS, code=400) == 1
    assert msum(after, M_SEQUENCES, outcome="done") - msum(before, M_SEQUENCES, outcome="done") == 4
    names = {n for n, _ in after}
    # the families the spec lists: queue time and step time, batch size,
    # bytes fetched per tier, stall time, memory (weight bytes) per tier
    for name in ("ferry_queue_seconds_count", "ferry_queue_seconds_sum", "ferry_step_seconds_count",
                 "ferry_step_seconds_sum", "ferry_batch_size_bucket", "ferry_stall_seconds_total",
                 "ferry_fetched_bytes_total", "ferry_weight_bytes", "ferry_model_ready"):
        assert name in names, "no %s in %s" % (name, sorted(names))
    assert msum(after, "ferry_queue_seconds_count") - msum(before, "ferry_queue_seconds_count") == 4
    assert msum(after, "ferry_step_seconds_count") > msum(before, "ferry_step_seconds_count")
    assert msum(after, "ferry_model_ready") == 1
    # resident server: every weight byte on the device tier, none fetched from disk
    assert msum(after, "ferry_weight_bytes", tier="disk") == 0
    assert msum(after, "ferry_weight_bytes") > 0
    assert msum(after, "ferry_host_bytes", kind="weights") == msum(after, "ferry_weight_bytes")
    assert msum(after, "ferry_host_bytes", kind="staging") == 0  # nothing streams


def test_metrics_offload_tiers(srv_offload, tiny, vocab):
    """With part of the model on disk, steps fetch bytes from disk and host,
    and the weight bytes per tier add up to the model."""
    before = metrics(srv_offload)
    infer(srv_offload, [prompt_ids(vocab, 4, 91)], 3)
    after = metrics(srv_offload)
    for t in ("disk", "host"):
        assert msum(after, "ferry_weight_bytes", tier=t) > 0, t
        d = msum(after, "ferry_fetched_bytes_total", tier=t) - msum(before, "ferry_fetched_bytes_total", tier=t)
        assert d > 0, "no %s bytes fetched for a request" % t
    assert msum(after, "ferry_weight_bytes", tier="device") > 0
    # what the model takes of RAM, by kind (the CPU backend: one memory)
    host = {k: msum(after, "ferry_host_bytes", kind=k) for k in ("weights", "staging", "kv", "activations", "experts")}
    assert host["weights"] == msum(after, "ferry_weight_bytes", tier="device") + msum(after, "ferry_weight_bytes",
                                                                                       tier="host"), host
    assert host["staging"] > 0 and host["kv"] > 0 and host["activations"] > 0 and host["experts"] == 0, host
    assert not any(n == "ferry_device_bytes" for n, _ in after), "a CPU backend has no device memory of its own"


def test_metrics_histograms_consistent(srv):
    """Histogram buckets are cumulative and the +Inf bucket is the count."""
    m = metrics(srv)
    for h in ("ferry_queue_seconds", "ferry_batch_size"):
        buckets = sorted(((float(dict(ls)["le"].replace("+Inf", "inf")), v) for (n, ls), v in m.items()
                          if n == h + "_bucket"))
        assert buckets and buckets[-1][0] == float("inf"), (h, buckets)
        vals = [v for _, v in buckets]
        assert vals == sorted(vals), (h, buckets)
        assert vals[-1] == msum(m, h + "_count"), (h, buckets, msum(m, h + "_count"))


def test_metrics_curl(srv):
    out = curl("http://127.0.0.1:%d/metrics" % srv.port).decode()
    parse_prometheus(out)
    assert M_GENERATED in out


# --------------------------------------------------------------------------
# errors: JSON {"error": ...}, the right status, and the server keeps serving
# --------------------------------------------------------------------------

def _ids(shape, data, datatype="INT64", **params):
    b = {"inputs": [{"name": "input_ids", "datatype": datatype, "shape": shape, "data": data}]}
    if params:
        b["parameters"] = params
    return b


BAD_INFER = {
    "malformed-json": b'{"inputs": [{"name": "input_ids", ',
    "not-json": b"hello",
    "empty-body": b"",
    "not-an-object": b"[1, 2, 3]",
    "no-inputs": {"parameters": {"max_new_tokens": 2}},
    "empty-inputs": {"inputs": []},
    "wrong-input-name": {"inputs": [{"name": "tokens", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]},
    "datatype-fp32": _ids([1, 3], [1.0, 2.0, 3.0], "FP32"),
    "datatype-bytes": _ids([1, 3], ["a", "b", "c"], "BYTES"),
    "datatype-missing": {"inputs": [{"name": "input_ids", "shape": [1, 3], "data": [1, 2, 3]}]},
    "float-data-for-int64": _ids([1, 3], [1.5, 2, 3]),
    "string-data": _ids([1, 3], ["1", "2", "3"]),
    "shape-too-many-data": _ids([1, 3], [1, 2, 3, 4]),
    "shape-too-few-data": _ids([2, 3], [1, 2, 3]),
    "unknown-parameter": _ids([1, 3], [1, 2, 3], max_tokens=4),
    "unknown-field": dict(_ids([1, 3], [1, 2, 3]), prompt="hi"),
    "binary-output-not-bool": _ids([1, 3], [1, 2, 3], binary_data_output="yes"),
    "stop-ids-outside-vocab": _ids([1, 3], [1, 2, 3], stop_token_ids=[100000]),
    "input-twice": {"inputs": [_ids([1, 2], [1, 2])["inputs"][0], _ids([1, 2], [1, 2])["inputs"][0]]},
    "shape-3d": _ids([1, 1, 3], [1, 2, 3]),
    "shape-zero-tokens": _ids([1, 0], []),
    "shape-negative": _ids([-1, 3], [1, 2, 3]),
    "ragged-nested": _ids([2, 2], [[1, 2], [3]]),
    "no-data": {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3]}]},
    "id-negative": _ids([1, 3], [1, -1, 3]),
    "id-too-big": None,  # vocab filled in below
    "max-new-tokens-string": _ids([1, 3], [1, 2, 3], max_new_tokens="x"),
    "max-new-tokens-float": _ids([1, 3], [1, 2, 3], max_new_tokens=2.5),
    "max-new-tokens-zero": _ids([1, 3], [1, 2, 3], max_new_tokens=0),
    "temperature-string": _ids([1, 3], [1, 2, 3], temperature="hot"),
    "temperature-negative": _ids([1, 3], [1, 2, 3], temperature=-1.0),
    "top-k-string": _ids([1, 3], [1, 2, 3], top_k="5"),
    "top-p-out-of-range": _ids([1, 3], [1, 2, 3], top_p=1.5),
    "seed-string": _ids([1, 3], [1, 2, 3], seed="abc"),
    "stop-ids-not-list": _ids([1, 3], [1, 2, 3], stop_token_ids="2"),
    "stop-ids-strings": _ids([1, 3], [1, 2, 3], stop_token_ids=["2"]),
    "parameters-not-object": dict(_ids([1, 3], [1, 2, 3]), parameters=[1]),
    "past-context": _ids([1, 3], [1, 2, 3], max_new_tokens=100000),
    "unknown-output": dict(_ids([1, 3], [1, 2, 3]), outputs=[{"name": "hidden_states"}]),
    "too-many-prompts": _ids([1025, 1], [1] * 1025),
    "id-not-string": dict(_ids([1, 3], [1, 2, 3]), id=7),
}

NEEDLES = {
    "datatype-fp32": ["datatype", "INT64"],
    "datatype-bytes": ["datatype", "INT64"],
    "id-negative": ["vocab"],
    "id-too-big": ["vocab"],
    "max-new-tokens-string": ["max_new_tokens"],
    "max-new-tokens-float": ["max_new_tokens"],
    "max-new-tokens-zero": ["max_new_tokens"],
    "temperature-string": ["temperature"],
    "temperature-negative": ["temperature"],
    "top-k-string": ["top_k"],
    "top-p-out-of-range": ["top_p"],
    "seed-string": ["seed"],
    "stop-ids-not-list": ["stop_token_ids"],
    "stop-ids-strings": ["stop_token_ids"],
    "shape-too-many-data": ["shape", "data"],
    "shape-too-few-data": ["shape", "data"],
    "past-context": ["context"],
    "unknown-output": ["hidden_states", "output"],
}


@pytest.mark.parametrize("case", sorted(BAD_INFER))
def test_infer_400(srv, vocab, case):
    body = BAD_INFER[case]
    if case == "id-too-big":
        body = _ids([1, 3], [1, vocab, 3])
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    expect_error(srv, 400, "POST", "/v2/models/%s/infer" % srv.name, body,
                 {"Content-Type": "application/json"}, needles=NEEDLES.get(case, ()))


BAD_GENERATE = {
    "malformed-json": b'{"input_ids": [1, 2',
    "no-input-ids": {"parameters": {"max_new_tokens": 2}},
    "input-ids-not-list": {"input_ids": "1,2,3"},
    "input-ids-empty": {"input_ids": []},
    "input-ids-floats": {"input_ids": [1.5, 2]},
    "input-ids-outside-vocab": {"input_ids": [1, 100000]},
    "max-new-tokens-string": {"input_ids": [1, 2], "parameters": {"max_new_tokens": "x"}},
    "seed-string": {"input_ids": [1, 2], "parameters": {"seed": "x"}},
    "seed-negative": {"input_ids": [1, 2], "parameters": {"seed": -1}},
    "ragged-rows-not-lists": {"input_ids": [[1, 2], 3]},
    "empty-row": {"input_ids": [[1, 2], []]},
    "unknown-parameter": {"input_ids": [1, 2], "parameters": {"max_tokens": 2}},
    "parameters-at-top-level": {"input_ids": [1, 2], "max_new_tokens": 2},
    "binary-output-param": {"input_ids": [1, 2], "parameters": {"binary_data_output": True}},
}


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("case", sorted(BAD_GENERATE))
def test_generate_400(srv, endpoint, case):
    """Errors found before the first token are a plain JSON 400, also on the
    streaming endpoint."""
    body = BAD_GENERATE[case]
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    expect_error(srv, 400, "POST", "/v2/models/%s/%s" % (srv.name, endpoint), body,
                 {"Content-Type": "application/json"})


def test_binary_400(srv, vocab):
    raw = np.asarray([[1, 2, 3]], dtype="<i8").tobytes()
    path = "/v2/models/%s/infer" % srv.name

    def send(header, payload, hlen=None):
        hb = json.dumps(header).encode()
        return hb + payload, {"Inference-Header-Content-Length": str(len(hb) if hlen is None else hlen),
                              "Content-Type": "application/octet-stream"}

    good = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3],
                        "parameters": {"binary_data_size": 24}}], "parameters": {"max_new_tokens": 2}}
    # the good one works
    body, hdrs = send(good, raw)
    assert request(srv, "POST", path, body, hdrs)[0] == 200
    # binary_data_size does not match the shape
    bad = json.loads(json.dumps(good))
    bad["inputs"][0]["parameters"]["binary_data_size"] = 16
    expect_error(srv, 400, "POST", path, *send(bad, raw[:16]))
    # fewer bytes than binary_data_size
    expect_error(srv, 400, "POST", path, *send(good, raw[:20]))
    # more bytes than announced
    expect_error(srv, 400, "POST", path, *send(good, raw + b"\0" * 8))
    # header length past the body
    body, hdrs = send(good, raw)
    expect_error(srv, 400, "POST", path, body, dict(hdrs, **{"Inference-Header-Content-Length": str(len(body) + 5)}))
    # header length not a number
    expect_error(srv, 400, "POST", path, body, dict(hdrs, **{"Inference-Header-Content-Length": "abc"}))
    # header length cutting the JSON
    expect_error(srv, 400, "POST", path, body, dict(hdrs, **{"Inference-Header-Content-Length": "10"}))
    # an id outside the vocabulary in binary
    expect_error(srv, 400, "POST", path, *send(good, np.asarray([[1, vocab, 3]], dtype="<i8").tobytes()),
                 needles=["vocab"])


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2/models/nope"),
    ("GET", "/v2/models/nope/ready"),
    ("POST", "/v2/models/nope/infer"),
    ("POST", "/v2/models/nope/generate"),
    ("POST", "/v2/models/nope/generate_stream"),
    ("GET", "/nope"),
    ("GET", "/"),
    ("GET", "/v2/nope"),
    ("GET", "/v2/models/{m}/nope"),
    ("POST", "/v2/models/{m}/infer/extra"),
    ("GET", "/v2/health"),
    ("GET", "/v2/health/nope"),
])
def test_404(srv, method, path):
    body = json.dumps(_ids([1, 2], [1, 2])).encode() if method == "POST" else None
    expect_error(srv, 404, method, path.replace("{m}", srv.name), body,
                 {"Content-Type": "application/json"} if body else None)


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2/models/{m}/infer"),
    ("GET", "/v2/models/{m}/generate"),
    ("GET", "/v2/models/{m}/generate_stream"),
    ("POST", "/v2/health/live"),
    ("POST", "/v2/health/ready"),
    ("PUT", "/v2"),
    ("DELETE", "/v2/models/{m}"),
    ("POST", "/v2/models/{m}/ready"),
    ("POST", "/metrics"),
    ("PUT", "/v2/models/{m}/infer"),
])
def test_405(srv, method, path):
    body = b"{}" if method in ("POST", "PUT") else None
    expect_error(srv, 405, method, path.replace("{m}", srv.name), body,
                 {"Content-Type": "application/json"} if body else None)
    st, hdrs, _ = request(srv, method, path.replace("{m}", srv.name), body)
    assert st == 405 and "allow" in hdrs, hdrs
    want = "POST" if path.endswith(("/infer", "/generate", "/generate_stream")) else "GET"
    assert want in hdrs["allow"], hdrs


def test_model_version_paths(srv, vocab):
    """/v2/models/{m}/versions/1/... is the same model; another version is 404."""
    p = prompt_ids(vocab, 4, 15)
    want = infer(srv, [p], 3)[0]
    st, obj = jreq(srv, "POST", "/v2/models/%s/versions/1/infer" % srv.name, infer_body([p], max_new_tokens=3))
    assert st == 200 and _rows(obj, 1) == want, obj
    assert request(srv, "GET", "/v2/models/%s/versions/1/ready" % srv.name)[0] == 200
    expect_error(srv, 404, "GET", "/v2/models/%s/versions/2" % srv.name)
    expect_error(srv, 404, "POST", "/v2/models/%s/versions/2/infer" % srv.name,
                 json.dumps(infer_body([p], max_new_tokens=3)).encode(), {"Content-Type": "application/json"})


def test_generate_stream_one_prompt_only(srv):
    expect_error(srv, 400, "POST", "/v2/models/%s/generate_stream" % srv.name,
                 json.dumps({"input_ids": [[1, 2], [3, 4]]}).encode(), {"Content-Type": "application/json"})
    # a nested list of one prompt is one prompt
    toks = stream_tokens(stream(srv, [[1, 2]], max_new_tokens=3), srv.name)
    assert toks == generate(srv, [1, 2], max_new_tokens=3)


def test_404_curl(srv):
    code, body = curl_status("http://127.0.0.1:%d/v2/models/nope" % srv.port)
    assert code == 404 and "error" in json.loads(body), body
    code, body = curl_status("-X", "DELETE", "http://127.0.0.1:%d/v2" % srv.port)
    assert code == 405 and "error" in json.loads(body), body


def test_413_body_over_limit(srv_small_body, vocab):
    s = srv_small_body
    path = "/v2/models/%s/infer" % s.name
    # under the limit works
    assert_alive(s)
    small = json.dumps(_ids([1, 3], [1, 2, 3], max_new_tokens=1)).encode()
    assert len(small) < 1024
    # a valid request over 1 KiB: padding in the JSON
    big = small + b" " * 2000
    expect_error(s, 413, "POST", path, big, {"Content-Type": "application/json"})
    # a long prompt over the limit
    long_ = json.dumps(_ids([1, 400], [7] * 400, max_new_tokens=1)).encode()
    assert len(long_) > 1024
    expect_error(s, 413, "POST", path, long_, {"Content-Type": "application/json"})
    # on the generate endpoints too
    big_gen = json.dumps({"input_ids": [7] * 400, "parameters": {"max_new_tokens": 1}}).encode()
    expect_error(s, 413, "POST", "/v2/models/%s/generate" % s.name, big_gen, {"Content-Type": "application/json"})
    expect_error(s, 413, "POST", "/v2/models/%s/generate_stream" % s.name, big_gen,
                 {"Content-Type": "application/json"})
    # chunked upload (no Content-Length), with curl
    f = Path(s.model).parent / ("body-%d.json" % os.getpid())
    try:
        f.write_bytes(big)
        code, body = curl_status("-H", "Transfer-Encoding: chunked", "-H", "Content-Type: application/json",
                                 "--data-binary", "@%s" % f, "http://127.0.0.1:%d%s" % (s.port, path))
    finally:
        f.unlink()
    assert code == 413 and "error" in json.loads(body), (code, body)
    assert_alive(s)
    # exactly at the limit is fine: a valid request padded with JSON whitespace
    exact = small + b" " * (1024 - len(small))
    assert len(exact) == 1024
    st, hdrs, data = request(s, "POST", path, exact, {"Content-Type": "application/json"})
    assert st == 200, (st, data[:300])


def test_413_default_limit(srv, tmp_path):
    """The default limit is 64 MiB: one byte more is refused (sent with curl,
    which stops sending when the server answers early)."""
    f = tmp_path / "big.json"
    with open(f, "wb") as fh:
        fh.truncate(64 * 1024 * 1024 + 1)  # zero bytes: never parsed
    code, body = curl_status("--data-binary", "@%s" % f, "-H", "Content-Type: application/json",
                             "http://127.0.0.1:%d/v2/models/%s/infer" % (srv.port, srv.name))
    assert code == 413 and "error" in json.loads(body), (code, body[:300])
    assert_alive(srv)


# --------------------------------------------------------------------------
# overload and cancellation (the slow server: batch 1, two queued requests)
# --------------------------------------------------------------------------

@pytest.mark.slow
def test_503_when_overloaded(slow):
    """Six concurrent requests for one running slot and two queue places: some
    are refused with 503 and a JSON error, the rest complete; then the server
    serves normally."""
    p = [5, 6, 7, 8]
    barrier = threading.Barrier(6)

    def one(i):
        barrier.wait(REQ_TIMEOUT)
        return request(slow, "POST", "/v2/models/slow/generate",
                       {"input_ids": p, "parameters": {"max_new_tokens": 40}})

    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        res = list(ex.map(one, range(6)))
    codes = [r[0] for r in res]
    assert codes.count(503) >= 1, "no 503 among %r" % codes
    assert codes.count(200) >= 1, codes
    assert set(codes) <= {200, 503}, [(r[0], r[2][:200]) for r in res]
    outs = [json.loads(r[2])["output_ids"] for r in res if r[0] == 200]
    assert all(o == outs[0] and len(o) == 40 for o in outs), outs
    for st, hdrs, data in res:
        if st == 503:
            obj = json.loads(data.decode())
            assert isinstance(obj.get("error"), str) and obj["error"], data
    assert_alive(slow)


def test_queue_survives_cancelled_rows(slow):
    """An infer whose second row finds the queue full is refused (503) and
    its first, already queued, row is cancelled; the requests queued before
    and after it must still be served.

    (A cancelled row at the tail of the queue, behind another request, once
    left the scheduler's queue without a tail: the next submission replaced
    the head, the earlier request was never served nor answered, the queue
    count leaked, and SIGTERM then aborted in MHD_stop_daemon.)"""
    before = metrics(slow)
    conn, resp = open_stream(slow, [3, 4, 5], max_new_tokens=1500)   # A: holds the one slot
    results = {}

    def send(key, ids):
        try:
            results[key] = request(slow, "POST", "/v2/models/slow/generate",
                                   {"input_ids": ids, "parameters": {"max_new_tokens": 3}}, timeout=30)
        except (OSError, http.client.HTTPException) as e:
            results[key] = e

    def wait_for(cond, what):
        deadline = time.monotonic() + READY_TIMEOUT
        while not cond(metrics(slow)):
            assert time.monotonic() < deadline, what
            time.sleep(0.01)

    threads = []
    try:
        assert resp.status == 200
        next(sse_events(resp))                                        # A runs
        threads.append(threading.Thread(target=send, args=("X", [1, 2])))
        threads[-1].start()
        wait_for(lambda m: msum(m, "ferry_requests_queued") == 1, "X never queued")
        # B: row 0 takes the last queue place, row 1 is refused -> 503, row 0 cancelled
        st, hdrs, data = request(slow, "POST", "/v2/models/slow/infer",
                                 infer_body([[6, 7], [8, 9]], max_new_tokens=3))
        assert st == 503 and "error" in json.loads(data), (st, data)
        c0 = msum(before, M_SEQUENCES, outcome="cancelled")
        wait_for(lambda m: msum(m, M_SEQUENCES, outcome="cancelled") >= c0 + 1, "row 0 of B never cancelled")
        threads.append(threading.Thread(target=send, args=("D", [4, 5])))
        threads[-1].start()
        wait_for(lambda m: msum(m, "ferry_requests_queued") == 2, "D never queued")
    finally:
        hang_up(conn)
        for t in threads:
            t.join(40)
    for key in ("X", "D"):
        r = results.get(key)
        assert r is not None and not isinstance(r, Exception), "request %s got no answer: %r" % (key, r)
        assert r[0] == 200 and len(json.loads(r[2])["output_ids"]) == 3, (key, r)
    wait_for(lambda m: msum(m, "ferry_requests_queued") == 0 and msum(m, "ferry_requests_running") == 0,
             "the queue did not drain")
    assert_alive(slow)


def test_stream_disconnect_frees_slot(slow):
    """A client that goes away after the first token frees its slot: with
    one slot, a request sent afterwards completes, and the server generated
    far fewer tokens than the abandoned request asked for."""
    big = 1500  # context 2048: tens of seconds of disk-bound steps
    before = metrics(slow)
    conn, resp = open_stream(slow, [3, 4, 5], max_new_tokens=big)
    try:
        assert resp.status == 200
        first = next(sse_events(resp))
        assert len(event_tokens(first)) == 1
    finally:
        hang_up(conn)
    t0 = time.monotonic()
    out = generate(slow, [9, 10, 11], max_new_tokens=3)
    elapsed = time.monotonic() - t0
    assert len(out) == 3
    after = metrics(slow)
    d_gen = msum(after, M_GENERATED) - msum(before, M_GENERATED)
    assert d_gen < big // 2, (
        "the server generated %d tokens for the abandoned stream (asked %d) before serving the next "
        "request (%.1f s): the slot was not freed" % (d_gen, big, elapsed))
    assert msum(after, M_SEQUENCES, outcome="cancelled") - msum(before, M_SEQUENCES, outcome="cancelled") == 1


def test_infer_disconnect_frees_slot(slow):
    """The same for a plain (suspended, not streaming) infer whose client
    goes away while it runs."""
    big = 1500
    before = metrics(slow)
    conn = http.client.HTTPConnection("127.0.0.1", slow.port, timeout=REQ_TIMEOUT)
    conn.request("POST", "/v2/models/slow/infer", body=json.dumps(infer_body([[3, 4, 5]], max_new_tokens=big)),
                 headers={"Content-Type": "application/json"})
    # wait until it runs (a token or more generated), then go away
    deadline = time.monotonic() + READY_TIMEOUT
    while msum(metrics(slow), M_GENERATED) == msum(before, M_GENERATED):
        assert time.monotonic() < deadline, "the infer request never started"
        time.sleep(0.01)
    hang_up(conn)
    out = generate(slow, [9, 10, 11], max_new_tokens=3)
    assert len(out) == 3
    after = metrics(slow)
    d_gen = msum(after, M_GENERATED) - msum(before, M_GENERATED)
    assert d_gen < big // 2, "the abandoned infer ran on: %d tokens generated" % d_gen
    assert msum(after, M_SEQUENCES, outcome="cancelled") - msum(before, M_SEQUENCES, outcome="cancelled") == 1


# --------------------------------------------------------------------------
# connections, failures in a step, process life cycle
# --------------------------------------------------------------------------

def test_keep_alive_across_errors(srv, vocab):
    """One persistent connection carries good and bad requests in turn."""
    p = prompt_ids(vocab, 4, 97)
    want = infer(srv, [p], 3)[0]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=REQ_TIMEOUT)
    good = json.dumps(infer_body([p], max_new_tokens=3))
    steps = [("GET", "/v2/health/live", None, 200), ("POST", "/v2/models/%s/infer" % srv.name, "{bad", 400),
             ("POST", "/v2/models/%s/infer" % srv.name, good, 200), ("GET", "/nope", None, 404),
             ("GET", "/v2/models/%s/infer" % srv.name, None, 405), ("POST", "/v2/models/%s/infer" % srv.name, good, 200),
             ("GET", "/metrics", None, 200)]
    try:
        for method, path, body, code in steps:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            r = conn.getresponse()
            data = r.read()
            assert r.status == code, (method, path, r.status, data[:300])
            if path.endswith("/infer") and code == 200:
                assert _rows(json.loads(data), 1) == want
    finally:
        conn.close()


@pytest.fixture(scope="module")
def srv_eio(ferry_bin, tiny, tmp_path_factory):
    """Everything on disk, and the 20th read of the process fails with EIO."""
    od = tmp_path_factory.mktemp("http-eio")
    env = dict(os.environ, FERRY_FAULT="read_eio=20")
    yield from serve(ferry_bin, tiny, "--max-memory", "device=0,host=0", "--offload-dir", od, name="eio", env=env)


def test_stream_error_event_after_tokens(srv_eio, ferry, tiny, vocab):
    """A step that fails after a stream sent tokens ends the stream with an
    error event {"error": ...} naming the file; the server serves on."""
    p = [1, 2, 3]
    want, _ = ferry.generate(tiny, p, 30)
    events = stream(srv_eio, p, max_new_tokens=30)
    assert events and "error" in events[-1], "the stream should end with an error event: %r" % (events,)
    err = events[-1]["error"]
    assert isinstance(err, str) and ".bin" in err and ("i/o" in err.lower() or "eio" in err.lower()), err
    toks = stream_tokens(events[:-1], "eio")
    assert 1 <= len(toks) < 30, events
    assert toks == want[:len(toks)]
    # no more faults: the next requests are whole and right
    assert generate(srv_eio, p, max_new_tokens=30) == want
    assert stream_tokens(stream(srv_eio, p, max_new_tokens=30), "eio") == want
    m = metrics(srv_eio)
    assert msum(m, M_SEQUENCES, outcome="failed") == 1


def test_sigterm_with_requests_in_flight(ferry_bin, slow_model, tmp_path):
    """SIGTERM past the drain (--drain-timeout 0) while a stream runs and
    another request waits in the queue: the stream ends (an error event
    saying the server is shutting down, or the connection closes), the
    queued request gets 503 with a JSON error, nothing hangs, and the exit
    status is 0."""
    s = Server(ferry_bin, slow_model, "--batch", 1, "--max-memory", "device=0,host=0", "--offload-dir",
               tmp_path / "od", "--drain-timeout", 0, name="term")
    try:
        s.wait_ready()
        conn, resp = open_stream(s, [3, 4, 5], max_new_tokens=1500)
        assert resp.status == 200
        events = sse_events(resp)
        first = next(events)
        assert first.get("token_id") is not None, first
        queued = {}

        def send():
            try:
                queued["r"] = request(s, "POST", "/v2/models/term/generate",
                                      {"input_ids": [1, 2], "parameters": {"max_new_tokens": 4}})
            except (OSError, http.client.HTTPException) as e:
                queued["r"] = e

        t = threading.Thread(target=send)
        t.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while msum(metrics(s), "ferry_requests_queued") < 1:
            assert time.monotonic() < deadline, "the second request never queued"
            time.sleep(0.01)
        s.proc.send_signal(signal.SIGTERM)
        rest = []
        try:
            for ev in events:
                rest.append(ev)
        except (OSError, http.client.HTTPException):
            pass  # the connection may just close
        conn.close()
        t.join(REQ_TIMEOUT)
        assert not t.is_alive(), "the queued request hangs after SIGTERM"
        s.proc.wait(STOP_TIMEOUT)
        assert s.proc.returncode == 0, "exit status %r after SIGTERM:\n%s" % (s.proc.returncode, s.logtail())
        assert len(rest) < 1499, "the stream ran to its end after SIGTERM"
        assert rest and "shutting down" in rest[-1].get("error", ""), \
            "the stream should end with an error event 'server shutting down': %r" % (rest[-3:],)
        r = queued["r"]
        assert not isinstance(r, Exception), "the queued request got no answer: %r" % (r,)
        assert r[0] == 503 and "shutting down" in json.loads(r[2])["error"], r
    finally:
        s.kill()


def test_engine_failure_is_500(ferry_bin, tiny, tmp_path):
    """A step that fails (an I/O error reading the offload dir) answers 500
    with a JSON error naming the file; the next request is served."""
    env = dict(os.environ, FERRY_FAULT="read_eio=2")
    s = Server(ferry_bin, tiny, "--max-memory", "device=0,host=0", "--offload-dir", tmp_path / "od",
               name="eio500", env=env)
    try:
        s.wait_ready()
        st, obj = jreq(s, "POST", "/v2/models/eio500/infer", infer_body([[1, 2, 3]], max_new_tokens=4))
        assert st == 500 and ".bin" in obj.get("error", ""), (st, obj)
        assert len(infer(s, [[1, 2, 3]], 4)[0][0]) == 4
        m = metrics(s)
        assert msum(m, M_REQUESTS, code=500) == 1 and msum(m, M_SEQUENCES, outcome="failed") == 1
        rc = s.stop()
        assert rc == 0, s.logtail()
    finally:
        s.kill()


def test_sigint_stops(ferry_bin, tiny):
    s = Server(ferry_bin, tiny, name="int")
    try:
        s.wait_ready()
        assert_alive(s)
        s.proc.send_signal(signal.SIGINT)
        s.proc.wait(STOP_TIMEOUT)
        assert s.proc.returncode == 0, s.logtail()
    finally:
        s.kill()


def _serve_fails(ferry_bin, *args):
    p = subprocess.run([ferry_bin, "serve", "--grpc-port", "0"] + [str(a) for a in args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=READY_TIMEOUT)
    err = p.stderr.decode(errors="replace")
    assert p.returncode in (1, 2), "rc %d\n%s" % (p.returncode, err)
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last.startswith("ferry: "), err
    return p.returncode, last


def test_serve_startup_errors(ferry_bin, tiny, tmp_path):
    # a model that cannot load: after the listening line, one error line, rc 1
    (tmp_path / "empty").mkdir()
    rc, last = _serve_fails(ferry_bin, "--model", tmp_path / "empty", "--http-port", 0, "--host", "127.0.0.1")
    assert rc == 1 and "config.json" in last, last
    # the port is taken
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        rc, last = _serve_fails(ferry_bin, "--model", tiny, "--http-port", port, "--host", "127.0.0.1")
        assert rc == 1 and str(port) in last, last
    finally:
        sock.close()
    # an address this machine does not have (TEST-NET-1; no DNS involved)
    rc, last = _serve_fails(ferry_bin, "--model", tiny, "--http-port", 0, "--host", "192.0.2.1")
    assert rc == 1 and "192.0.2.1" in last, last
    # bad flags: usage errors naming the flag
    for flags in (["--http-port", 70000], ["--max-body", 0], ["--max-queued", 0], ["--batch", 0],
                  ["--name", "a/b"], ["--host", ""]):
        rc, last = _serve_fails(ferry_bin, "--model", tiny, "--host", "127.0.0.1", "--http-port", 0, *flags)
        assert rc == 2 and flags[0] in last, (flags, last)


def test_more_prompts_than_the_queue_is_a_client_error(slow, vocab):
    """A request that could never be queued whole is a 400 naming the limit,
    not a retryable 503 (the slow server queues at most 2)."""
    body = infer_body([prompt_ids(vocab, 3, 90 + i) for i in range(3)], max_new_tokens=2)
    expect_error(slow, 400, "POST", "/v2/models/%s/infer" % slow.name, body, needles=("max-queued",))
    assert_alive(slow)


def test_huge_shape_with_little_data_is_refused(srv):
    """The shape is checked against the data that arrived before anything is
    allocated for it."""
    for data in ([], [0], None, 0):
        inp = {"name": "input_ids", "datatype": "INT64", "shape": [1, 268435456]}
        if data is not None:
            inp["data"] = data
        expect_error(srv, 400, "POST", "/v2/models/%s/infer" % srv.name, {"inputs": [inp]},
                     needles=("shape", "data"))
    assert_alive(srv)


def test_queued_client_that_leaves_is_cancelled_before_it_runs(slow):
    """A client whose request waits in the queue and then disconnects is
    cancelled while still queued (the reaper peeks at suspended sockets),
    not after it has been admitted, prefilled and produced a token: with the
    only slot held by a running stream, its cancellation is counted while
    that stream still runs."""
    before = metrics(slow)
    conn, resp = open_stream(slow, [3, 4, 5], max_new_tokens=1500)
    try:
        assert resp.status == 200
        next(sse_events(resp))  # the slot is taken
        q = http.client.HTTPConnection("127.0.0.1", slow.port, timeout=REQ_TIMEOUT)
        q.request("POST", "/v2/models/%s/generate" % slow.name,
                  body=json.dumps({"input_ids": [7, 8, 9], "parameters": {"max_new_tokens": 5}}),
                  headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + READY_TIMEOUT
        while msum(metrics(slow), "ferry_requests_queued") < 1:
            assert time.monotonic() < deadline, "the second request was never queued"
            time.sleep(0.05)
        hang_up(q)
        deadline = time.monotonic() + READY_TIMEOUT
        while msum(metrics(slow), M_SEQUENCES, outcome="cancelled") - \
                msum(before, M_SEQUENCES, outcome="cancelled") < 1:
            assert time.monotonic() < deadline, "the departed queued request was never cancelled"
            time.sleep(0.1)
        assert msum(metrics(slow), "ferry_requests_running") == 1, "the stream should still be running"
    finally:
        hang_up(conn)
    assert len(generate(slow, [9, 10, 11], max_new_tokens=3)) == 3


def test_model_config_and_stats(srv, vocab):
    """Triton's config and statistics endpoints, as Triton answers them."""
    st, cfg = jreq(srv, "GET", "/v2/models/%s/config" % srv.name)
    assert st == 200, cfg
    assert cfg["name"] == srv.name and cfg["platform"] == "ferry" and cfg["max_batch_size"] == 8
    assert [i["name"] for i in cfg["input"]] == ["input_ids"] and cfg["input"][0]["data_type"] == "TYPE_INT64"
    assert {o["name"]: o["data_type"] for o in cfg["output"]} == {"output_ids": "TYPE_INT64", "logits": "TYPE_FP32"}
    assert [o["dims"] for o in cfg["output"] if o["name"] == "logits"] == [[vocab]]
    assert cfg["model_transaction_policy"]["decoupled"] is True

    def stats():
        st, obj = jreq(srv, "GET", "/v2/models/%s/stats" % srv.name)
        assert st == 200, obj
        st2, every = jreq(srv, "GET", "/v2/models/stats")
        assert st2 == 200 and [m["name"] for m in every["model_stats"]] == [srv.name]
        (m,) = obj["model_stats"]
        assert m["name"] == srv.name and m["version"] == "1"
        return m

    before = stats()
    infer(srv, [[1, 2, 3], [4, 5, 6]], 2)
    after = stats()
    assert after["inference_count"] == before["inference_count"] + 2
    assert after["execution_count"] > before["execution_count"]
    s0, s1 = before["inference_stats"], after["inference_stats"]
    assert s1["success"]["count"] == s0["success"]["count"] + 2
    assert s1["success"]["ns"] > s0["success"]["ns"]
    assert s1["queue"]["count"] >= s0["queue"]["count"] + 2
    assert s1["compute_infer"]["ns"] > s0["compute_infer"]["ns"]
    assert after["last_inference"] >= before["last_inference"] and after["last_inference"] > 1.6e12  # ms since 1970
    st, _, _ = request(srv, "GET", "/v2/models/other/stats")
    assert st == 404


@pytest.mark.slow
def test_sigterm_drains_http(ferry_bin, slow_model, tmp_path):
    """SIGTERM with an HTTP request in flight and time to drain: new
    connections are refused at once, the request runs to its end (200, all
    its tokens) and the process exits 0."""
    s = Server(ferry_bin, slow_model, "--batch", 1, "--max-memory", "device=0,host=0", "--offload-dir",
               tmp_path / "od", "--drain-timeout", 300 if SANITIZER else 30, name="drain")  # 300 tokens under TSan
    try:
        s.wait_ready()
        result = {}

        def ask():
            result["r"] = request(s, "POST", "/v2/models/drain/generate",
                                  {"input_ids": [3, 4, 5], "parameters": {"max_new_tokens": 300}})

        t = threading.Thread(target=ask)
        t.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while msum(metrics(s), "ferry_requests_running") < 1:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.01)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # the listening socket goes away at once, while the request still runs
            try:
                socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            except OSError:
                break
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        assert s.proc.poll() is None and t.is_alive(), "the request should still be running"
        t.join(REQ_TIMEOUT)
        st, _, body = result["r"]
        assert st == 200, (st, body)
        assert len(json.loads(body)["output_ids"]) == 300
        s.proc.wait(STOP_TIMEOUT)
        assert s.proc.returncode == 0, s.logtail()
    finally:
        s.kill()
