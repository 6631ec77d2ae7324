#!/usr/bin/env python3
"""Chat latency on the demo model: time to first token and total time of
/v1/chat/completions requests (streamed), with the official openai client.

Starts `ferry serve` on a model with a tokenizer - by default the demo model
`make run` serves (random weights, config/demo-tokenizer; made here with
`ferry mkmodel --preset small --tokenizer config/demo-tokenizer` when
--model is not given) - sends one warm-up request, then N requests one
after another, and prints the median (and min, max) of:
  ttft   submit -> the first chunk holding text (the role chunk comes first
         and does not count)
  total  submit -> data: [DONE]
  tok/s  completion tokens / (total - ttft)
then the same for C concurrent clients (--concurrency), where continuous
batching shares each step among them.

    build/venv/bin/python bench/chat_bench.py [--n 20] [--max-tokens 64] [--concurrency 4]
        [--model DIR] [--serve-flag=--max-memory=device=0,host=0 ...]

Benchmarks are not tests: nothing here asserts on time.
"""

import argparse
import concurrent.futures
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[1]
LISTEN_RE = re.compile(r"listening on http://[0-9.]+:(\d+)")


def start_server(ferry, model, flags):
    argv = [ferry, "serve", "--model", str(model), "--http-port", "0", "--grpc-port", "-1", "--host", "127.0.0.1",
            "--name", "demo"] + flags
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    port, ready = [None], threading.Event()

    def drain():
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode(errors="replace")
            m = LISTEN_RE.search(line)
            if m and port[0] is None:
                port[0] = int(m.group(1))
            if "ready" in line:
                ready.set()
        ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(120) or port[0] is None or proc.poll() is not None:
        proc.kill()
        sys.exit("chat_bench: the server did not become ready: %s" % " ".join(argv))
    return proc, port[0]


def one_chat(client, max_tokens, i):
    msgs = [{"role": "system", "content": "You are the ferry demo model."},
            {"role": "user", "content": "Request %d: tell me how ferry streams weights from disk." % i}]
    t0 = time.perf_counter()
    ttft = None
    n = 0
    stream = client.chat.completions.create(model="demo", messages=msgs, max_tokens=max_tokens, temperature=0.7,
                                            seed=i, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - t0
        if chunk.usage:
            n = chunk.usage.completion_tokens
    total = time.perf_counter() - t0
    return ttft if ttft is not None else total, total, n


def row(name, results):
    ttft = [r[0] * 1e3 for r in results]
    total = [r[1] * 1e3 for r in results]
    rate = [r[2] / (r[1] - r[0]) for r in results if r[1] > r[0]]
    fmt = "%-22s %8.1f %8.1f %8.1f   %8.1f %8.1f %8.1f   %7.1f"
    print(fmt % (name, statistics.median(ttft), min(ttft), max(ttft), statistics.median(total), min(total),
                 max(total), statistics.median(rate) if rate else 0.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ferry", default=str(REPO / "build" / "ferry"))
    ap.add_argument("--model", help="a model directory with tokenizer.json (default: a demo model made here)")
    ap.add_argument("--n", type=int, default=20, help="requests per measurement")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--serve-flag", action="append", default=[], help="a flag for ferry serve (repeatable)")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="chat-bench-")
    model = args.model
    if not model:
        model = Path(tmp.name) / "demo-model"
        subprocess.run([args.ferry, "mkmodel", "--out", str(model), "--arch", "llama", "--preset", "small", "--seed",
                        "1", "--tokenizer", str(REPO / "config" / "demo-tokenizer")], check=True)
    flags = [f for fl in args.serve_flag for f in fl.split("=", 1)] if args.serve_flag else []
    proc, port = start_server(args.ferry, model, flags)
    try:
        client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="unused", max_retries=0,
                               timeout=300)
        one_chat(client, args.max_tokens, -1)  # warm-up
        print("model %s, max_tokens %d (ignore_eos), %d requests each; serve flags: %s" % (
            model if args.model else "demo (small preset, config/demo-tokenizer)", args.max_tokens, args.n,
            " ".join(flags) or "(none)"))
        print("%-22s %8s %8s %8s   %8s %8s %8s   %7s" % ("", "ttft ms", "min", "max", "total ms", "min", "max",
                                                        "tok/s"))
        print("%-22s %8s %8s %8s   %8s %8s %8s   %7s" % ("", "(median)", "", "", "(median)", "", "", "(med)"))
        row("sequential", [one_chat(client, args.max_tokens, i) for i in range(args.n)])
        c = args.concurrency
        with concurrent.futures.ThreadPoolExecutor(c) as ex:
            res = list(ex.map(lambda i: one_chat(client, args.max_tokens, i), range(args.n)))
        row("%d concurrent" % c, res)
    finally:
        proc.terminate()
        proc.wait(30)
        tmp.cleanup()


if __name__ == "__main__":
    main()
