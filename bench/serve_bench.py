#!/usr/bin/python3
"""Serving benchmark (not a test): aggregate generated tokens/s of `ferry
serve` for 1, 4 and 16 concurrent clients, each sending greedy generate
requests, with the model mostly on disk; then a wrk load run on
/v2/health/ready and on small infer requests (if wrk is installed).

    /usr/bin/python3 bench/serve_bench.py --model build/bench-1b-l32 \\
        --max-memory device=1GiB,host=0 --offload-dir build/offload-l32-serve \\
        --max-new-tokens 8 --clients 1,4,16 [--load-model build/demo-model]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.path.join(ROOT, "build", "ferry")


def start(model, extra):
    p = subprocess.Popen([FERRY, "serve", "--model", model, "--http-port", "0", "--host", "127.0.0.1"] + extra,
                         stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("ferry serve did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    t0 = time.time()
    while time.time() - t0 < 600:
        try:
            if urllib.request.urlopen("http://127.0.0.1:%d/v2/health/ready" % port, timeout=5).status == 200:
                return p, port
        except Exception:
            time.sleep(0.5)
    raise SystemExit("ferry serve never became ready")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)


def generate(port, name, ids, n):
    body = json.dumps({"input_ids": ids, "parameters": {"max_new_tokens": n}}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v2/models/%s/generate" % (port, name), data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        return len(json.loads(r.read())["output_ids"])


def clients_run(port, name, k, n, per_client):
    counts = [0] * k
    errors = []

    def worker(i):
        try:
            for j in range(per_client):
                counts[i] += generate(port, name, [1 + i, 2 + j, 3, 4 + i % 5], n)
        except Exception as e:  # report, do not hide
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.time() - t0
    return sum(counts), dt, errors


def wrk(url, seconds, conns, script=None):
    if not shutil.which("wrk"):
        return "wrk not installed (apt-get install wrk)"
    cmd = ["wrk", "-t2", "-c%d" % conns, "-d%ds" % seconds, "--latency"] + (["-s", script] if script else []) + [url]
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-memory", default="device=1GiB,host=0")
    ap.add_argument("--offload-dir", default=os.path.join(ROOT, "build", "offload-serve"))
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--load-model", default=None, help="small model for the wrk load run")
    a = ap.parse_args()
    name = os.path.basename(os.path.normpath(a.model))
    p, port = start(a.model, ["--max-memory", a.max_memory, "--offload-dir", a.offload_dir, "--batch", "16",
                              "--context", "64"])
    try:
        generate(port, name, [1, 2, 3], 2)  # warm-up
        base = None
        for k in [int(x) for x in a.clients.split(",")]:
            toks, dt, errs = clients_run(port, name, k, a.max_new_tokens, 1)
            rate = toks / dt
            base = base or rate
            print("clients %2d: %4d tokens in %7.2f s = %7.3f tok/s aggregate (%.2fx the 1-client rate; "
                  "ideal %dx), errors %d" % (k, toks, dt, rate, rate / base, k, len(errs)))
            for e in errs:
                print("  error:", e)
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(("ferry_batch_size_bucket", "ferry_fetched_bytes_total", "ferry_stall")):
                    print("  " + line)
    finally:
        stop(p)
    if a.load_model:
        lname = os.path.basename(os.path.normpath(a.load_model))
        p, port = start(a.load_model, ["--batch", "16"])
        try:
            print("\n== wrk GET /v2/health/ready (10 s, 32 connections)")
            print(wrk("http://127.0.0.1:%d/v2/health/ready" % port, 10, 32))
            lua = os.path.join("/tmp", "ferry_infer.lua")
            with open(lua, "w") as f:
                f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                        'wrk.body = \'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 4], '
                        '"data": [1, 2, 3, 4]}], "parameters": {"max_new_tokens": 4}}\'\n')
            print("== wrk POST /v2/models/%s/infer, 4 new tokens (10 s, 16 connections)" % lname)
            print(wrk("http://127.0.0.1:%d/v2/models/%s/infer" % (port, lname), 10, 16, lua))
        finally:
            stop(p)


if __name__ == "__main__":
    main()
