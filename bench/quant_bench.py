#!/usr/bin/env python3
"""Quantized weights benchmark (not a test), issue 12's three figures:

1. streaming: decode step time with every group on disk (`--max-memory
   device=0,host=0`) for the checkpoint's bf16, --quantize int8 and int4,
   each with and without --quantize-head (lm_head int8 too), at batch 1 and
   16 (--batches), runs interleaved (bf16, int8, int8+head, ...) so that the
   machine's drift hits all alike; with the bytes streamed per step and the
   disk rate of each run;
2. resident: CPU decode at batch 1 with int8/int4 (and bf16), weight bytes
   read per second against the read bandwidth `ferry bench` measures in the
   same run (roofline_fraction);
3. accuracy: relative RMS of the last-position logits of int8/int4 against
   the unquantized model, on the given test models.

    build/venv/bin/python bench/quant_bench.py --model build/bench-1b-l32 \\
        --offload-root build/offload-quant --runs 2 --accuracy-models build/demo-model
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.path.join(ROOT, "build", "ferry")
MODES = ["none", "int8", "int4"]


STREAM_MODES = [("none", False), ("int8", False), ("int8", True), ("int4", False), ("int4", True)]


def mode_name(q, head):
    return ("bf16" if q == "none" else q) + ("+head" if head else "")


def bench(model, quant, batch, extra, steps, head=False):
    args = [FERRY, "bench", "--model", model, "--batch", str(batch), "--steps", str(steps), "--prompt-len", "64",
            "--json", "--quantize", quant] + (["--quantize-head"] if head else []) + extra
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("failed: %s\n%s" % (" ".join(args), p.stderr))
    return json.loads(p.stdout)


def streaming(a):
    print("== all on disk (device=0,host=0): decode step, %s, %d runs interleaved" % (a.model, a.runs))
    rows = {}
    batches = [int(b) for b in a.batches.split(",")]
    for batch in batches:
        for run in range(a.runs):
            for q, head in STREAM_MODES:
                od = os.path.join(a.offload_root, mode_name(q, head))
                r = bench(a.model, q, batch, ["--max-memory", "device=0,host=0", "--offload-dir", od], a.steps, head)
                rows.setdefault((batch, q, head), []).append(r)
                print("  batch %2d %-9s run %d: step %8.1f ms, %6.0f MB from disk per step, disk %.2f GB/s, "
                      "compute %.1f ms, stall %.1f ms" % (batch, mode_name(q, head), run + 1, r["decode_step_ms"],
                                                           r["step_disk_bytes"] / 1e6, r["disk_gb_per_s"],
                                                           r["step_compute_ms"], r["step_stall_ms"]), flush=True)
    print("\n  | batch | weights | step ms (median) | x bf16 | bytes/step | x bf16 | disk GB/s |")
    print("  |---|---|---|---|---|---|---|")
    for batch in batches:
        base = statistics.median(r["decode_step_ms"] for r in rows[(batch, "none", False)])
        base_b = statistics.median(r["step_disk_bytes"] for r in rows[(batch, "none", False)])
        for q, head in STREAM_MODES:
            ms = statistics.median(r["decode_step_ms"] for r in rows[(batch, q, head)])
            b = statistics.median(r["step_disk_bytes"] for r in rows[(batch, q, head)])
            gb = statistics.median(r["disk_gb_per_s"] for r in rows[(batch, q, head)])
            print("  | %d | %s | %.1f | %.2f | %.0f MB | %.2f | %.2f |" % (
                batch, mode_name(q, head), ms, ms / base, b / 1e6, b / base_b, gb))


def resident(a):
    print("\n== resident CPU decode, batch 1: weight bytes/s against the read bandwidth of the same run")
    print("  | weights | step ms | weight bytes/step | GB/s | read GB/s | fraction | prefill tok/s |")
    print("  |---|---|---|---|---|---|---|")
    for q in MODES:
        r = bench(a.model, q, 1, [], a.steps)
        print("  | %s | %.1f | %.0f MB | %.2f | %.2f | %.2f | %.1f |" % (
            "bf16" if q == "none" else q, r["decode_step_ms"], r["weight_bytes_per_step"] / 1e6,
            r["weight_read_gb_per_s"], r["read_gb_per_s"], r["roofline_fraction"], r["prefill_tokens_per_s"]))


def accuracy(models):
    print("\n== logit error against the unquantized model (relative RMS, last position, 3 prompts)")
    print("  | model | int8 | int4 |")
    print("  |---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            errs = {}
            for q in MODES:
                f = os.path.join(tmp, q + ".bin")
                subprocess.run([FERRY, "generate", "--model", m, "--prompt-ids", "1,2,3,4,5;7,8,9;11,300,12,13",
                                "--max-new-tokens", "1", "--quantize", q, "--dump-logits", f], check=True,
                               capture_output=True)
                errs[q] = np.fromfile(f, dtype="<f4")
            ref = errs["none"]
            rr = lambda x: float(np.sqrt(np.mean((x - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))  # noqa: E731
            print("  | %s | %.4f | %.4f |" % (os.path.basename(m), rr(errs["int8"]), rr(errs["int4"])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "bench-1b-l32"))
    ap.add_argument("--offload-root", default=os.path.join(ROOT, "build", "offload-quant"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batches", default="1,16", help="comma list of batch sizes for the streaming part")
    ap.add_argument("--accuracy-models", default="")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: streaming,resident,accuracy")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    if "streaming" not in skip:
        streaming(a)
    if "resident" not in skip:
        resident(a)
    if a.accuracy_models and "accuracy" not in skip:
        accuracy(a.accuracy_models.split(","))


if __name__ == "__main__":
    sys.exit(main())
