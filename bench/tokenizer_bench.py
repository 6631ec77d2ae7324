#!/usr/bin/python3
"""Tokenizer benchmark (not a test): load time of each tokenizer.json and
single-threaded encode throughput on 1 MB of mixed text (English, code,
Japanese, Russian, Arabic, emoji, digits, whitespace runs, special-token
text), ferry (build/tests/tok_tool, text/) against HF tokenizers,
in the same run, on the same files. Every encode's ids are compared too.

    build/venv/bin/python bench/tokenizer_bench.py [--reps 5] [--mb 1]

Needs the venv (HF `tokenizers`), the tokenizers `make deps` builds from
llama.cpp's vocabularies (build/ref/tokenizers: llama-spm is Llama 2,
llama-bpe Llama 3, qwen2 Qwen2 with Qwen2.5's added tokens; tok_ref.py)
and build/tests/tok_tool (`make build/tests/tok_tool`). HF runs with
RAYON_NUM_THREADS=1; one encode call of one text is single-threaded in both.
Encode times are the best of --reps; load is one cold-ish load each
(ferry's in a fresh process, HF's in this one).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from tok_ref import BUILDERS, NAMES, SPECIALS, mixed_text  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--tool", default=str(REPO / "build" / "tests" / "tok_tool"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            d = Path(tmp) / name
            BUILDERS[name](d)
            hf_json = d / "tokenizer.json"
            text = mixed_text(int(args.mb * (1 << 20)), SPECIALS[name])
            tf = d / "text.txt"
            tf.write_bytes(text.encode())
            size = len(text.encode())

            t0 = time.perf_counter()
            hf = Tokenizer.from_file(str(hf_json))
            hf_load = time.perf_counter() - t0
            hf_best = 1e30
            for _ in range(args.reps):
                t0 = time.perf_counter()
                ids = hf.encode(text, add_special_tokens=False).ids
                hf_best = min(hf_best, time.perf_counter() - t0)

            p = subprocess.run([args.tool, str(d), "--bench", str(tf), str(args.reps)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, check=True)
            fe = json.loads(p.stdout)
            # same ids? (one more encode, through the cases interface)
            case = d / "case.bin"
            case.write_bytes(b"E 0 1 %d\n" % size + text.encode() + b"\n")
            out = subprocess.run([args.tool, str(d), "--cases", str(case)], stdout=subprocess.PIPE,
                                 check=True).stdout.decode().split()
            same = out[0] == "OK" and [int(x) for x in out[1:]] == ids
            rows.append((name, (d / "tokenizer.json").stat().st_size / 1e6, fe["load_s"], hf_load,
                         size / 1e6 / fe["encode_s"], size / 1e6 / hf_best, len(ids), same))

    print("tokenizer   file MB  load ferry   load HF   encode ferry    encode HF    tokens  same ids")
    for name, mb, fl, hl, fr, hr, n, same in rows:
        print("%-9s %8.1f %9.3f s %8.3f s %9.1f MB/s %9.1f MB/s %9d  %s" % (name, mb, fl, hl, fr, hr, n,
                                                                          "yes" if same else "NO"))
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
