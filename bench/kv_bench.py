#!/usr/bin/python3
"""Paged-KV serving benchmark (not a test, issue 14): aggregate generated
tokens/s of `ferry serve` with k concurrent clients against one client, on a
freshly started server (cold: the first burst after start, before any other
request) and again after warm-up. The server runs with its defaults (--batch,
--context, the KV pool) unless --serve-args says otherwise. With --perf FILE
the cold burst runs under `perf record -g -p <server>` (timings of that run
are perf's, not the benchmark's).

    /usr/bin/python3 bench/kv_bench.py --model /tmp/kvb/m300 \\
        --max-memory device=0,host=0 --offload-dir /tmp/kvb/off --clients 16
"""
import argparse
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import clients_run, generate, start, stop  # noqa: E402


def burst(port, name, k, n, label):
    toks, dt, errs = clients_run(port, name, k, n, 1)
    print("%-6s clients %2d: %4d tokens in %7.2f s = %7.3f tok/s aggregate, errors %d"
          % (label, k, toks, dt, toks / dt, len(errs)), flush=True)
    for e in errs:
        print("  error:", e)
    return toks / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-memory", default="device=0,host=0")
    ap.add_argument("--offload-dir", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="warm repetitions of (1 client, k clients)")
    ap.add_argument("--serve-args", default="", help="more `ferry serve` flags, space separated")
    ap.add_argument("--perf", default=None, help="perf.data path: record the cold burst")
    a = ap.parse_args()
    name = os.path.basename(os.path.normpath(a.model))
    t0 = time.time()
    p, port = start(a.model, ["--max-memory", a.max_memory, "--offload-dir", a.offload_dir] + a.serve_args.split())
    print("server ready in %.1f s (pid %d)" % (time.time() - t0, p.pid), flush=True)
    perf = None
    try:
        if a.perf:
            perf = subprocess.Popen(["perf", "record", "-g", "-o", a.perf, "-p", str(p.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        cold = burst(port, name, a.clients, a.max_new_tokens, "cold")
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=120)
            perf = None
        generate(port, name, [1, 2, 3], 2)  # warm-up
        for r in range(a.rounds):
            one = burst(port, name, 1, a.max_new_tokens, "warm")
            many = burst(port, name, a.clients, a.max_new_tokens, "warm")
            print("round %d: cold %.2fx, warm %.2fx the 1-client rate (ideal %dx)"
                  % (r, cold / one, many / one, a.clients), flush=True)
    finally:
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=120)
        stop(p)


if __name__ == "__main__":
    main()
