#!/usr/bin/env python3
"""Mixture-of-experts offloading benchmark (not a test), issue 16's figures.

A Qwen3-30B-A3B-shaped random model with a few layers (bf16; make it with
`ferry mkmodel --arch qwen3moe --preset 30b-a3b --layers 8`), attention,
norms, routers and head resident ("device" = the RAM compute reads on the
CPU backend), every expert on disk in the offload dir. For each
configuration `ferry bench --batch B --json` gives the decode step time and
the expert figures it measures in the same run: experts routed, slot hits
and fetches per step, expert bytes fetched per step, and the raw O_DIRECT
rate of the same blobs. From those:

  active floor  routed experts' bytes per step / raw O_DIRECT rate: a step
                that reads exactly what its tokens chose, at the disk's rate;
  dense floor   every expert's bytes / raw O_DIRECT rate: what streaming
                every expert each step (the dense layer-group way) needs at
                the very least.

Configurations run interleaved, `--runs` times each, so that the machine's
drift hits all alike; the median of each figure is printed, with min and max
of the step time.

    build/venv/bin/python bench/moe_bench.py --model /work/bench-moe \\
        --offload-dir /work/moe-od --runs 3
"""
import argparse
import json
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FERRY = os.path.join(ROOT, "build", "ferry")
GiB = 1 << 30


def run(args):
    p = subprocess.run([FERRY] + args, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("failed: ferry %s\n%s" % (" ".join(args), p.stderr))
    return p.stdout


def resident_bytes(model):
    """Bytes of every group but the experts and the embedding (read by rows)."""
    plan = json.loads(run(["plan", "--model", model, "--json"]))
    dense = sum(g["bytes"] for g in plan["groups"] if "expert" not in g and g["name"] != "embed")
    experts = [g["bytes"] for g in plan["groups"] if "expert" in g]
    return dense, experts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--offload-dir", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, nargs="+", default=[1])
    ap.add_argument("--caches", default="0,0.125,0.5,1", help="expert cache sizes as fractions of all experts")
    ap.add_argument("--prefetch", action="store_true", help="also run each configuration with --expert-prefetch")
    ap.add_argument("--resident", action="store_true", help="also run with every expert resident (compute alone)")
    ap.add_argument("--decode-input", default="random", choices=["greedy", "random"],
                    help="decode steps' input tokens (ferry bench --decode-input): a random model's greedy text "
                         "repeats itself, and so does its routing, which flatters the expert cache")
    a = ap.parse_args()

    dense, experts = resident_bytes(a.model)
    all_experts = sum(experts)
    configs = []
    for b in a.batch:
        for frac in [float(x) for x in a.caches.split(",")]:
            for pf in ([False, True] if a.prefetch else [False]):
                configs.append((b, frac, pf, False))
        if a.resident:
            configs.append((b, 1.0, False, True))
    results = {c: [] for c in configs}
    for r in range(a.runs):
        for c in configs:
            b, frac, pf, resident = c
            args = ["bench", "--model", a.model, "--batch", str(b), "--steps", str(a.steps), "--prompt-len", "16",
                    "--json", "--decode-input", a.decode_input]
            if not resident:
                args += ["--max-memory", "device=%d,host=0" % dense, "--offload-dir", a.offload_dir,
                         "--expert-cache", str(int(frac * all_experts))]
                if pf:
                    args.append("--expert-prefetch")
            results[c].append(json.loads(run(args)))

    print("model %s: resident %.2f GiB (attention, routers, head), %d experts of %.1f MiB = %.2f GiB on disk; "
          "decode input %s" % (a.model, dense / GiB, len(experts), experts[0] / (1 << 20), all_experts / GiB,
                               a.decode_input))
    print("%-5s %-9s %-8s %9s %9s %8s %8s %8s %9s %9s %8s %8s %7s %8s" % (
        "batch", "cache", "prefetch", "step ms", "(min-max)", "tok/s", "routed", "fetched", "MiB/step", "raw GB/s",
        "floor", "step/fl", "hit %", "spec ok"))
    for c in configs:
        b, frac, pf, resident = c
        rs = results[c]
        med = lambda f: statistics.median(f(x) for x in rs)
        steps = [x["decode_step_ms"] for x in rs]
        x = lambda k: (lambda j: j["experts"][k])
        floor = med(x("active_floor_ms"))
        label = "resident" if resident else ("%.0f%%" % (100 * frac))
        spec = med(lambda j: j["experts"].get("prefetched_per_step", 0))
        spec_ok = "%.0f%%" % (100 * med(lambda j: j["experts"].get("prefetch_hits_per_step", 0)) / spec) if spec else "-"
        print("%-5d %-9s %-8s %9.1f %4.0f-%-4.0f %8.2f %8.1f %8.1f %9.1f %9.3f %8.1f %8s %7.1f %8s" % (
            b, label, "on" if pf else "off", statistics.median(steps), min(steps), max(steps),
            med(lambda j: j["decode_tokens_per_s"]), med(x("routed_per_step")), med(x("fetched_per_step")),
            med(x("fetched_bytes_per_step")) / (1 << 20), med(lambda j: j["raw_direct_read_gb_per_s"]),
            floor, "%.2f" % (statistics.median(steps) / floor) if floor > 0 else "-", 100 * med(x("hit_rate")),
            spec_ok))
    d = results[configs[0]][0]["experts"]
    print("dense floor (every expert off the device at the raw rate): %.0f ms/step" % d["dense_floor_ms"])


if __name__ == "__main__":
    main()
