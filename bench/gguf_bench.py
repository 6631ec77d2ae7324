#!/usr/bin/env python3
"""Decode speed on GGUF files, ferry against llama.cpp (issue 31's benchmark).

    python bench/gguf_bench.py [--llama-cpp BIN_DIR] [--types Q8_0,Q4_0,Q4_K_M]
                               [--threads 2] [--layers 16] [--steps 32] [--disk]
                               [--isas auto|avx2,avx512] [--activations exact,int8]
                               [--reps 3] [--json OUT]

The model is `ferry mkmodel --preset 1b` (Llama 3.2 1B's shape, random bf16
weights; --layers overrides its 16), written as a BF16 GGUF the way
llama.cpp's converter lays a Llama out (names, Q/K row permutation,
metadata; the tokenizer metadata of llama.cpp's ggml-vocab-llama-bpe.gguf,
which has the same 128256 tokens), then quantized by llama.cpp's own
llama-quantize to each type. Both programs decode from the same files with
the same thread count: llama-bench (tg, -p 0) and `ferry bench --batch 1`
(resident; with --disk also every group streamed from an offload dir,
against the disk's raw O_DIRECT read rate that ferry bench measures).

llama.cpp's tools come from --llama-cpp (a directory holding llama-bench and
llama-quantize), else are built once with cmake from the llama-cpp-python
source distribution `make deps` downloaded (build/registry) into
build/llama.cpp. Files go under build/gguf-bench. Prints one line per type
and run; --json writes every figure. --isas runs ferry once per instruction
set named (--cpu-isa), --activations once per activation mode named
(--cpu-activations; with --isas, every pair); --reps repeats every run that many times,
interleaved (llama.cpp, then ferry for each ISA, then again), and reports
medians.
"""

import argparse
import glob
import json
import os
import subprocess
import statistics
import sys
import tarfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"
OUT = BUILD / "gguf-bench"
sys.path.insert(0, str(REPO / "tests" / "integration"))


def run(*args, **kw):
    p = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        sys.exit("gguf_bench: %s failed (%d):\n%s" % (" ".join(map(str, args)), p.returncode, p.stderr[-3000:]))
    return p.stdout


def llama_cpp_tools(given):
    if given:
        return Path(given)
    bin_dir = BUILD / "llama.cpp" / "build" / "bin"
    if (bin_dir / "llama-bench").exists() and (bin_dir / "llama-quantize").exists():
        return bin_dir
    sdists = sorted(glob.glob(str(BUILD / "registry" / "llama_cpp_python-*.tar.gz")))
    if not sdists:
        sys.exit("gguf_bench: no llama-cpp-python source distribution in build/registry (run `make deps`)")
    src = BUILD / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        with tarfile.open(sdists[-1]) as tf:
            top = tf.getnames()[0].split("/")[0]
            prefix = top + "/vendor/llama.cpp/"
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            keep = [m for m in members if m.name]
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links and paths leaving src
                tf.extractall(src, members=keep, filter="data")
            else:  # bookworm's 3.11.2: the same refusals by hand
                for m in keep:
                    if m.name.startswith("/") or ".." in m.name.split("/") or m.issym() or m.islnk():
                        sys.exit("gguf_bench: unsafe member in the sdist: %s" % m.name)
                tf.extractall(src, members=keep)
    print("gguf_bench: building llama.cpp's llama-bench and llama-quantize (a few minutes)", file=sys.stderr)
    run("cmake", "-S", src, "-B", src / "build", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
        "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")
    run("cmake", "--build", src / "build", "-j", str(os.cpu_count() or 2), "--target", "llama-bench", "llama-quantize")
    return bin_dir


def bf16_gguf(ferry, layers, path):
    """The 1b preset as a BF16 GGUF laid out as llama.cpp's converter does."""
    import gguf
    import st_util
    from gguf_util import gguf_name, permute
    from test_gguf import write_gguf
    hf = BUILD / ("gguf-bench-1b-l%d" % layers)
    if not (hf / "config.json").exists():
        run(ferry, "mkmodel", "--out", hf, "--arch", "llama", "--preset", "1b", "--dtype", "bf16", "--seed", "1",
            "--layers", layers)
    cfg = json.loads((hf / "config.json").read_text())
    shards = [hf / "model.safetensors"] if (hf / "model.safetensors").exists() else [
        hf / f for f in sorted(set(json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"].values()))]
    vocab = gguf.GGUFReader(str(BUILD / "ref" / "llama.cpp" / "ggml-vocab-llama-bpe.gguf"))
    a, heads, kv = "llama", cfg["num_attention_heads"], cfg["num_key_value_heads"]
    meta = {a + ".context_length": cfg["max_position_embeddings"], a + ".embedding_length": cfg["hidden_size"],
            a + ".block_count": cfg["num_hidden_layers"], a + ".feed_forward_length": cfg["intermediate_size"],
            a + ".attention.head_count": heads, a + ".attention.head_count_kv": kv,
            a + ".rope.dimension_count": cfg["head_dim"], a + ".rope.freq_base": float(cfg["rope_theta"]),
            a + ".attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]), a + ".vocab_size": cfg["vocab_size"],
            "general.file_type": 32}  # MOSTLY_BF16
    meta.update({name: f.contents() for name, f in vocab.fields.items() if name.startswith("tokenizer.")})
    tensors = []
    for f in shards:
        st = st_util.read(f)
        for name, m in st.header.items():
            if name == "__metadata__":
                continue
            lo, hi = m["data_offsets"]
            raw = np.frombuffer(st.data[lo:hi], dtype=np.uint16).reshape(m["shape"])
            if ".q_proj." in name:
                raw = permute(raw, heads, heads)
            elif ".k_proj." in name:
                raw = permute(raw, heads, kv)
            if raw.ndim == 1:  # the converter writes 1-D tensors (norms) as F32
                tensors.append((gguf_name(name), "F32", (raw.astype(np.uint32) << 16).view(np.float32)))
            else:
                tensors.append((gguf_name(name), "BF16", np.ascontiguousarray(raw)))
    write_gguf(path, tensors, meta)


def ferry_decode(ferry, model, threads, steps, extra=()):
    out = run(ferry, "bench", "--model", model, "--batch", 1, "--steps", steps, "--prompt-len", 32, "--threads",
              threads, "--kv-memory", "256MiB", "--context", 1024, "--json", *extra)
    return json.loads(out)


def llama_decode(tools, model, threads, steps):
    out = run(tools / "llama-bench", "-m", model, "-t", threads, "-p", 0, "-n", steps, "-r", 3, "-o", "json")
    rows = json.loads(out)
    return rows[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp")
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--disk", action="store_true")
    ap.add_argument("--isas", default="auto")
    ap.add_argument("--activations", default="exact")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    ferry = Path(os.environ.get("FERRY_BIN") or BUILD / "ferry")
    tools = llama_cpp_tools(args.llama_cpp)
    OUT.mkdir(parents=True, exist_ok=True)
    base = OUT / ("1b-l%d-bf16.gguf" % args.layers)
    if not base.exists():
        tmp = base.with_suffix(".partial")
        bf16_gguf(ferry, args.layers, tmp)
        tmp.rename(base)
    results = []
    for t in args.types.split(","):
        q = OUT / ("1b-l%d-%s.gguf" % (args.layers, t))
        if not q.exists():
            tmp = q.with_suffix(".partial")
            run(tools / "llama-quantize", base, tmp, t, args.threads)
            tmp.rename(q)
        isas = [(i, a) for i in args.isas.split(",") for a in args.activations.split(",")
                if not (a == "int8" and i == "avx2")]
        lcs, frs = [], {i: [] for i in isas}
        for _ in range(args.reps):
            lcs.append(llama_decode(tools, q, args.threads, args.steps))
            for i in isas:
                frs[i].append(ferry_decode(ferry, q, args.threads, args.steps,
                                           ("--cpu-isa", i[0], "--cpu-activations", i[1])))
        lc = statistics.median(lcs)
        row = {"type": t, "file_bytes": q.stat().st_size, "llama_cpp_tokens_per_s": lc, "llama_cpp_runs": lcs,
               "ferry": {}}
        for i in isas:
            tps = [f["decode_tokens_per_s"] for f in frs[i]]
            fr = statistics.median(tps)
            row["ferry"]["%s/%s" % i] = {"kernels": frs[i][0]["kernels"], "tokens_per_s": fr, "runs": tps, "ratio": fr / lc,
                               "weight_bytes_per_step": frs[i][0]["weight_bytes_per_step"]}
            print("%-7s %6.0f MiB  llama.cpp %6.2f tok/s  ferry (%s) %6.2f tok/s  ferry/llama.cpp %.2f" % (
                t, row["file_bytes"] / 2**20, lc, frs[i][0]["kernels"], fr, fr / lc), flush=True)
        first = row["ferry"]["%s/%s" % isas[0]]
        row["ferry_tokens_per_s"], row["ratio"] = first["tokens_per_s"], first["ratio"]
        if args.disk:
            d = ferry_decode(ferry, q, args.threads, args.steps,
                             ("--max-memory", "device=0,host=0", "--offload-dir", OUT / ("offload-" + t)))
            step_s = d["decode_step_ms"] / 1e3
            rate = d["step_disk_bytes"] / step_s / 1e9 if step_s else 0
            row.update({"disk_tokens_per_s": d["decode_tokens_per_s"], "disk_bytes_per_step": d["step_disk_bytes"],
                        "disk_gb_per_s": rate, "raw_direct_read_gb_per_s": d["raw_direct_read_gb_per_s"]})
            print("        disk: ferry %6.2f tok/s, %.0f MiB a step read at %.2f GB/s; the disk's raw O_DIRECT rate "
                  "%.2f GB/s" % (d["decode_tokens_per_s"], d["step_disk_bytes"] / 2**20, rate,
                                 d["raw_direct_read_gb_per_s"]), flush=True)
        results.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "layers": args.layers, "reps": args.reps,
                                               "results": results},
                                              indent=1) + "\n")


if __name__ == "__main__":
    main()
