#!/usr/bin/env python3
"""Export benchmark (not a test), issue 13's figures:

1. throughput: `ferry export` of a model half on disk, MB/s against the
   write rate `dd ... conv=fsync` gets on the same file system in the same
   run; RSS before the export and its peak during it (ferry export --json);
2. serving while exporting: `ferry serve` with the admin API; the time of
   greedy generate requests (decode steps) with no export running, then while
   an export of the same model runs (POST /admin/v1/export), interleaved.

    build/venv/bin/python bench/export_bench.py --model build/bench-1b-l32 \\
        --max-memory device=0,host=2GiB --offload-dir build/offload-export-bench --root build/export-bench
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.path.join(ROOT, "build", "ferry")
TOKEN = "bench-token-0123456789"


def dd_rate(root, mib):
    path = os.path.join(root, "dd.tmp")
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=%d" % mib, "conv=fsync"], check=True,
                   capture_output=True)
    dt = time.perf_counter() - t
    os.unlink(path)
    return mib * 1048576 / dt / 1e6


def offline(a):
    print("== ferry export (offline), %s, --max-memory %s" % (a.model, a.max_memory))
    for run in range(a.runs):
        out = os.path.join(a.root, "offline")
        shutil.rmtree(out, ignore_errors=True)
        dd = dd_rate(a.root, 2000)
        t = time.perf_counter()
        p = subprocess.run([FERRY, "export", "--model", a.model, "--max-memory", a.max_memory, "--offload-dir",
                            a.offload_dir, "--out", out, "--json"], capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        r = json.loads(p.stdout)
        print("  run %d: %.2f GB written in %.1f s of export = %.0f MB/s (whole command %.1f s, load included); "
              "dd conv=fsync %.0f MB/s; RSS before the export %.0f MB, peak during it %.0f MB" % (
                  run + 1, r["bytes"] / 1e9, r["seconds"], r["bytes"] / r["seconds"] / 1e6, dt, dd,
                  r["rss_before"] / 1e6, r["rss_peak"] / 1e6))
    shutil.rmtree(os.path.join(a.root, "offline"), ignore_errors=True)


def serve(a):
    env = dict(os.environ, FERRY_ADMIN_TOKEN=TOKEN)
    p = subprocess.Popen([FERRY, "serve", "--model", a.model, "--max-memory", a.max_memory, "--offload-dir",
                          a.offload_dir, "--http-port", "0", "--grpc-port", "-1", "--admin-port", "-1",
                          "--host", "127.0.0.1", "--export-dir", a.root, "--batch", "4", "--context", "256"],
                         stderr=subprocess.PIPE, text=True, env=env)
    ports = {}
    for line in p.stderr:
        m = re.search(r"admin listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            ports["admin"] = int(m.group(1))
        m = re.search(r"ferry: listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            ports["http"] = int(m.group(1))
        if len(ports) == 2:
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, ports


def req(port, method, path, body=None, token=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = "Bearer " + token
    c.request(method, path, json.dumps(body) if body is not None else None, h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def while_serving(a):
    name = os.path.basename(os.path.normpath(a.model))
    p, ports = serve(a)
    try:
        t0 = time.time()
        while True:
            try:
                if req(ports["http"], "GET", "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() - t0 > 900:
                raise SystemExit("not ready")
            time.sleep(0.5)
        body = {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "parameters": {"max_new_tokens": a.new_tokens}}
        req(ports["http"], "POST", "/v2/models/%s/generate" % name, body)  # warm-up
        print("\n== serving: greedy generate, prompt 8, %d new tokens; alone vs while an export runs" % a.new_tokens)
        alone, during = [], []
        for run in range(a.runs):
            t = time.perf_counter()
            req(ports["http"], "POST", "/v2/models/%s/generate" % name, body)
            alone.append((time.perf_counter() - t) / a.new_tokens)
            shutil.rmtree(os.path.join(a.root, "live"), ignore_errors=True)
            st, r = req(ports["admin"], "POST", "/admin/v1/export", {"name": "live", "overwrite": True}, TOKEN)
            assert st == 202, (st, r)
            job = r["job"]
            n = 0
            te = time.perf_counter()
            while True:
                t = time.perf_counter()
                req(ports["http"], "POST", "/v2/models/%s/generate" % name, body)
                st, j = req(ports["admin"], "GET", "/admin/v1/jobs/" + job, token=TOKEN)
                if j["state"] == "running":  # the request ran entirely or mostly during the export
                    during.append((time.perf_counter() - t) / a.new_tokens)
                    n += 1
                if j["state"] in ("done", "failed", "cancelled"):
                    break
            print("  run %d: export %s in %.1f s, %d requests during it" % (run + 1, j["state"],
                                                                         time.perf_counter() - te, n))
        print("  per token (median): alone %.0f ms, during export %.0f ms (x%.2f); samples %d / %d" % (
            1e3 * statistics.median(alone), 1e3 * statistics.median(during),
            statistics.median(during) / statistics.median(alone), len(alone), len(during)))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=300)
        shutil.rmtree(os.path.join(a.root, "live"), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "bench-1b-l32"))
    ap.add_argument("--max-memory", default="device=0,host=2GiB")
    ap.add_argument("--offload-dir", default=os.path.join(ROOT, "build", "offload-export-bench"))
    ap.add_argument("--root", default=os.path.join(ROOT, "build", "export-bench"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--skip", default="")
    a = ap.parse_args()
    os.makedirs(a.root, exist_ok=True)
    if "offline" not in a.skip:
        offline(a)
    if "serving" not in a.skip:
        while_serving(a)


if __name__ == "__main__":
    sys.exit(main())
