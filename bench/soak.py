#!/usr/bin/env python3
"""Load and soak: one `ferry serve` on loopback under every kind of client at
once for a bounded time, then a verdict.

    build/venv/bin/python bench/soak.py                 # 10 minutes (the issue's soak)
    build/venv/bin/python bench/soak.py --seconds 30    # the short mode `make test` runs

The server: a small llama with the demo tokenizer (text and chat work),
part of its weights streamed from an offload dir each step, the admin API
on with a token and an export dir. The clients, all at once:

- wrk (Debian's): KServe v2 infer with token ids, 4 connections, the whole time;
- KServe generate_stream (SSE), read to the end;
- the OpenAI client (PyPI `openai`): chat and completions, streamed and not;
- tritonclient's gRPC client: ModelInfer, and ModelStreamInfer;
- malformed requests on raw sockets: bad JSON, wrong types, a lying
  Content-Length, a body over --max-body, invalid UTF-8, garbage bytes;
  each must get a 4xx or a closed connection, never a 5xx or a crash;
- disconnects: a stream dropped after its first event, a body cut short;
- exports through the admin API, one in warm-up and one in the middle
  (their files checked).

Every valid request must succeed. A sampler reads the server's RSS and open
file descriptors (/proc) and the KV blocks in use (/metrics) every second.
Verdict: the server never died; zero failed valid requests; malformed ones
answered 4xx; after the load the KV blocks in use are back to 0 and the fds
where they were at warm-up; in runs of 120 s or more, RSS grew less than 5%
from the end of warm-up (the first fifth, at least 20 s) to the end. Exit
status 0 when all hold; the report goes to stdout (and --json FILE).
"""
import argparse
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import http.client
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "soak-admin-token-0123456789abcdef"
LISTEN = re.compile(r"ferry: listening on (http|grpc)://[^ ]*:(\d+)")
EXTRA = os.environ.get("SOAK_EXTRA", "").split()
ADMIN = re.compile(r"admin listening on http://[^ ]*:(\d+)")


class Tally:
    """Requests by kind: ok and failed (with the first few failures kept)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ok, self.failed, self.examples = {}, {}, []

    def add(self, kind, ok, why=None):
        with self.lock:
            d = self.ok if ok else self.failed
            d[kind] = d.get(kind, 0) + 1
            if not ok and len(self.examples) < 20:
                self.examples.append("%s: %s" % (kind, why))


def start_server(args, work):
    model = work / "model"
    subprocess.run([args.ferry, "mkmodel", "--out", model, "--arch", "llama", "--preset", "small", "--seed", "7",
                    "--tokenizer", ROOT / "config" / "demo-tokenizer"], check=True, stdout=subprocess.DEVNULL)
    (work / "exports").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env["FERRY_ADMIN_TOKEN"] = TOKEN
    argv = [args.ferry, "serve", "--model", model, "--name", "soak", "--host", "127.0.0.1", "--http-port", "0",
            "--grpc-port", "0", "--admin-port", "-1", "--export-dir", work / "exports",
            "--max-memory-scope", "weights", "--max-memory", "device=6MiB,host=4MiB", "--offload-dir", work / "offload",
            "--batch", "16", "--max-queued", "4096", *EXTRA, "--max-body", "1MiB", "--context", "512"]
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env)
    ports, deadline = {}, time.monotonic() + 120
    while time.monotonic() < deadline and len(ports) < 3:
        text = (work / "server.log").read_text(errors="replace")
        for m in LISTEN.finditer(text):
            ports[m.group(1)] = int(m.group(2))
        m = ADMIN.search(text)
        if m:
            ports["admin"] = int(m.group(1))
        if proc.poll() is not None:
            sys.exit("ferry serve exited:\n" + text[-2000:])
        time.sleep(0.05)
    while time.monotonic() < deadline:
        try:
            if http_req(ports["http"], "GET", "/v2/health/ready")[0] == 200:
                return proc, ports
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    sys.exit("ferry serve not ready:\n" + (work / "server.log").read_text(errors="replace")[-2000:])


def http_req(port, method, path, body=None, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = dict(headers or {}, **{"Content-Type": "application/json"})
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------
# the clients: each loops until `stop` is set
# --------------------------------------------------------------------------

def run_wrk(port, seconds, work, out):
    script = work / "infer.lua"
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": [5, 6, 7, 8]}],
                       "parameters": {"max_new_tokens": 4}})
    script.write_text('wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n'
                      % json.dumps(body))
    p = subprocess.run(["wrk", "-t1", "-c4", "-d%ds" % seconds, "--timeout", "30s", "-s", str(script),
                        "http://127.0.0.1:%d/v2/models/soak/infer" % port],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out["wrk"] = p.stdout


def sse_stream(port, tally, stop):
    body = {"input_ids": [1, 2, 3, 4, 5], "parameters": {"max_new_tokens": 12}}
    while not stop.is_set():
        try:
            st, data = http_req(port, "POST", "/v2/models/soak/generate_stream", body)
            events = [l for l in data.decode().splitlines() if l.startswith("data: ")]
            good = st == 200 and len(events) == 12 and all("token_id" in e for e in events)
            tally.add("kserve_generate_stream", good, (st, data[:200]))
        except Exception as e:  # noqa: BLE001 - every failure is counted
            tally.add("kserve_generate_stream", False, repr(e))


def openai_client(port, tally, stop):
    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="none", max_retries=0, timeout=60)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]
    k = 0
    while not stop.is_set():
        kind = ("chat", "chat_stream", "completion", "completion_stream")[k % 4]
        k += 1
        try:
            if kind == "chat":
                r = client.chat.completions.create(model="soak", messages=msgs, max_tokens=8)
                good = r.choices[0].finish_reason in ("length", "stop") and r.usage.completion_tokens >= 1
            elif kind == "chat_stream":
                chunks = list(client.chat.completions.create(model="soak", messages=msgs, max_tokens=8, stream=True))
                good = bool(chunks) and chunks[-1].choices[0].finish_reason in ("length", "stop")
            elif kind == "completion":
                r = client.completions.create(model="soak", prompt="Once upon a time", max_tokens=8, n=2)
                good = len(r.choices) == 2 and all(c.finish_reason in ("length", "stop") for c in r.choices)
            else:
                chunks = list(client.completions.create(model="soak", prompt="Hello", max_tokens=6, stream=True))
                good = bool(chunks) and chunks[-1].choices[0].finish_reason in ("length", "stop")
            tally.add("openai_" + kind, good, "bad answer")
        except Exception as e:  # noqa: BLE001
            tally.add("openai_" + kind, False, repr(e))


def grpc_client(port, tally, stop):
    import queue
    import numpy as np
    import tritonclient.grpc as grpcclient
    c = grpcclient.InferenceServerClient(url="127.0.0.1:%d" % port)
    k = 0
    while not stop.is_set():
        k += 1
        inp = grpcclient.InferInput("input_ids", [1, 3], "INT64")
        inp.set_data_from_numpy(np.array([[3, 4, 5]], dtype=np.int64))
        try:
            if k % 5:
                r = c.infer("soak", [inp], outputs=[grpcclient.InferRequestedOutput("output_ids")],
                            parameters={"max_new_tokens": 4}, client_timeout=60)
                tally.add("grpc_infer", r.as_numpy("output_ids").shape == (1, 4), "shape")
            else:
                q = queue.Queue()
                c.start_stream(callback=lambda result, error: q.put((result, error)))
                try:
                    c.async_stream_infer("soak", [inp], parameters={"max_new_tokens": 4})
                    got = [q.get(timeout=60) for _ in range(4)]
                finally:
                    c.stop_stream()
                tally.add("grpc_stream", all(e is None for _, e in got), [e for _, e in got])
        except Exception as e:  # noqa: BLE001
            tally.add("grpc_" + ("stream" if k % 5 == 0 else "infer"), False, repr(e))
    c.close()


def read_until(s, marker):
    """What the socket sends until marker has come, or it closes."""
    buf = b""
    while marker not in buf:
        chunk = s.recv(4096)
        if not chunk:
            break
        buf += chunk
    return buf


def raw(port, data, read=True):
    """Sends raw bytes; the status line's code, or None when the server
    closed without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if not read:
            return None
        m = re.match(rb"HTTP/1\.[01] (\d+)", read_until(s, b"\r\n"))
        return int(m.group(1)) if m else None


def post(path, body, extra=b"", length=None):
    length = len(body) if length is None else length
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n%s\r\n" % (path, length, extra)) + body


MALFORMED = [
    ("bad_json", post(b"/v2/models/soak/infer", b'{"inputs": [')),
    ("wrong_type", post(b"/v2/models/soak/infer", b'{"inputs": [{"name": "input_ids", "datatype": "FP32", '
                                                   b'"shape": [1, 1], "data": [1.5]}]}')),
    ("unknown_param", post(b"/v2/models/soak/generate", b'{"input_ids": [1], "parameters": {"bogus": 1}}')),
    ("openai_bad", post(b"/v1/chat/completions", b'{"model": "soak", "messages": "hi"}')),
    ("bad_utf8", post(b"/v1/completions", b'{"model": "soak", "prompt": "\xff\xfe", "max_tokens": 2}')),
    ("too_large", post(b"/v2/models/soak/infer", b"x" * (2 << 20))),
    ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64) + b"\r\n\r\n"),
    ("no_model", post(b"/v2/models/nope/infer", b"{}")),
]


def malformed_client(port, tally, stop):
    k = 0
    while not stop.is_set():
        name, data = MALFORMED[k % len(MALFORMED)]
        k += 1
        try:
            code = raw(port, data)
            tally.add("malformed_" + name, code is None or 400 <= code < 500, code)
        except (ConnectionResetError, BrokenPipeError):
            tally.add("malformed_" + name, True)  # refused mid-send (the body over --max-body)
        except Exception as e:  # noqa: BLE001
            tally.add("malformed_" + name, False, repr(e))
        time.sleep(0.02)


def disconnect_client(port, tally, stop):
    k = 0
    while not stop.is_set():
        k += 1
        try:
            if k % 2:  # a stream dropped after its first event
                body = json.dumps({"input_ids": [1, 2, 3], "parameters": {"max_new_tokens": 64}}).encode()
                with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                    s.sendall(post(b"/v2/models/soak/generate_stream", body))
                    buf = read_until(s, b"data: ")
                tally.add("disconnect_stream", b"data: " in buf, buf[:100])
            else:  # a body cut short: the connection closes before the rest
                raw(port, post(b"/v2/models/soak/infer", b'{"inputs": [', length=4000), read=False)
                tally.add("disconnect_body", True)
        except Exception as e:  # noqa: BLE001
            tally.add("disconnect", False, repr(e))
        time.sleep(0.05)


def export_once(port, work, tally, name):
    h = {"Authorization": "Bearer " + TOKEN}
    try:
        st, data = http_req(port, "POST", "/admin/v1/export", {"name": name}, headers=h)
        job = json.loads(data)["job"]
        while True:
            st, data = http_req(port, "GET", "/admin/v1/jobs/%s" % job, headers=h)
            state = json.loads(data)["state"]
            if state in ("done", "failed", "cancelled"):
                break
            time.sleep(0.2)
        files = list((work / "exports" / name).glob("*.safetensors"))
        good = state == "done" and files and all(f.stat().st_size > 8 for f in files)
        for f in files:  # each file's header parses
            with open(f, "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                json.loads(fh.read(n))
        tally.add("admin_export", bool(good), state)
    except Exception as e:  # noqa: BLE001
        tally.add("admin_export", False, repr(e))


# --------------------------------------------------------------------------
# the sampler and the verdict
# --------------------------------------------------------------------------

def sample(proc, port):
    status = Path("/proc/%d/status" % proc.pid).read_text()
    kb = lambda key: int(re.search(key + r":\s+(\d+) kB", status).group(1)) * 1024  # noqa: E731
    rss, anon, file_ = kb("VmRSS"), kb("RssAnon"), kb("RssFile") + kb("RssShmem")
    fds = len(os.listdir("/proc/%d/fd" % proc.pid))
    st, text = http_req(port, "GET", "/metrics")
    used = int(re.search(rb'ferry_kv_blocks\{state="used"\} (\d+)', text).group(1))
    return {"t": time.monotonic(), "rss": rss, "anon": anon, "file": file_, "fds": fds, "kv_used": used}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=600)
    ap.add_argument("--ferry", default=os.environ.get("FERRY_BIN", str(ROOT / "build" / "ferry")))
    ap.add_argument("--json", help="write the report here too")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        sys.exit("soak: wrk not found (Debian package wrk; `make deps` installs it)")
    work = Path(tempfile.mkdtemp(prefix="ferry-soak-"))
    proc, ports = start_server(args, work)
    tally, stop, out, samples = Tally(), threading.Event(), {}, []
    warm_s = max(20, args.seconds // 5) if args.seconds >= 120 else args.seconds // 3
    try:
        samples.append(sample(proc, ports["http"]))
        start = time.monotonic()
        threads = [threading.Thread(target=run_wrk, args=(ports["http"], args.seconds, work, out))]
        threads += [threading.Thread(target=f, args=(p, tally, stop)) for f, p in (
            (sse_stream, ports["http"]), (openai_client, ports["http"]), (grpc_client, ports["grpc"]),
            (malformed_client, ports["http"]), (disconnect_client, ports["http"]))]
        for t in threads:
            t.start()
        # an export in warm-up (its first-use costs - a thread's stack and
        # malloc arena, kept by glibc for the next one - belong there) and
        # one in the middle of the measured part
        exports = [warm_s / 3, (warm_s + args.seconds) / 2]
        warm = False
        while time.monotonic() - start < args.seconds and proc.poll() is None:
            time.sleep(1)
            samples.append(sample(proc, ports["http"]))
            if not warm and time.monotonic() - start >= warm_s:
                warm = samples[-1]
            if exports and time.monotonic() - start >= exports[0]:
                name = "export-%d" % (2 - len(exports))
                exports.pop(0)
                threading.Thread(target=export_once, args=(ports["admin"], work, tally, name)).start()
        stop.set()
        for t in threads:
            t.join(120)
        time.sleep(1)
        died = proc.poll() is not None
        end = sample(proc, ports["http"]) if not died else None
    finally:
        stop.set()
        if proc.poll() is None:
            proc.terminate()
            rc = proc.wait(60)
        else:
            rc = proc.returncode
    report = verdict(args, tally, out.get("wrk", ""), samples, warm, end, died, rc, work)
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if report["pass"]:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("soak: FAILED (server log and files kept in %s)" % work)
    sys.exit(0 if report["pass"] else 1)


def verdict(args, tally, wrk, samples, warm, end, died, rc, work):
    m = re.search(r"(\d+) requests in", wrk)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", wrk)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", wrk)
    ok = dict(tally.ok)
    failed = dict(tally.failed)
    ok["wrk_kserve_infer"] = int(m.group(1)) if m else 0
    wrk_bad = (int(non2xx.group(1)) if non2xx else 0) + (sum(int(x) for x in sock.groups()) if sock else 0)
    if wrk_bad or not m:
        failed["wrk_kserve_infer"] = wrk_bad or 1
    first = samples[0]
    checks = {
        "server alive, exit 0 on SIGTERM": not died and rc == 0,
        "no failed valid request": not failed,
        "every kind ran": all(ok.get(k, 0) > 0 for k in (
            "wrk_kserve_infer", "kserve_generate_stream", "openai_chat", "openai_chat_stream", "grpc_infer",
            "grpc_stream", "disconnect_stream")) and ok.get("admin_export", 0) == 2,
        "KV blocks in use back to 0": end is not None and end["kv_used"] == 0,
        "no fd growth after warm-up": end is not None and warm and end["fds"] <= warm["fds"],
    }
    rss_growth = (end["rss"] / warm["rss"] - 1) if end and warm else None
    if args.seconds >= 120:
        checks["RSS growth < 5% after warm-up"] = rss_growth is not None and rss_growth < 0.05
    mb = lambda s: round(s["rss"] / 2**20, 1) if s else None  # noqa: E731
    return {
        "seconds": args.seconds, "warm_up_seconds": round(warm["t"] - first["t"]) if warm else None,
        "requests_ok": dict(sorted(ok.items())), "requests_failed": dict(sorted(failed.items())),
        "failures": tally.examples,
        "rss_mib": {"start": mb(first), "warm": mb(warm), "end": mb(end), "peak": max(mb(s) for s in samples)},
        "rss_growth_after_warm_up": None if rss_growth is None else round(rss_growth, 4),
        # RSS, anonymous (heap) and file-backed (mapped checkpoint and blobs)
        # MiB, every tenth of the run
        "series_mib": [[round(s["t"] - first["t"]), mb(s), round(s["anon"] / 2**20, 1), round(s["file"] / 2**20, 1)]
                       for s in samples[::max(1, len(samples) // 10)]] + ([[round(end["t"] - first["t"]), mb(end),
                       round(end["anon"] / 2**20, 1), round(end["file"] / 2**20, 1)]] if end else []),
        "fds": {"start": first["fds"], "warm": warm["fds"] if warm else None, "end": end["fds"] if end else None},
        "kv_blocks_used": {"peak": max(s["kv_used"] for s in samples), "end": end["kv_used"] if end else None},
        "checks": checks, "pass": all(checks.values()), "work": str(work),
    }


if __name__ == "__main__":
    main()
