#!/usr/bin/env python3
"""One-off check: a model ferry exported loads in transformers and gives the
greedy tokens ferry gives on the model it was exported from.

    PYTHON_WITH_TRANSFORMERS bench/export_transformers_check.py \\
        --source build/ref/smollm2-gguf/SmolLM2-135M-Instruct.Q4_1.gguf [--layout original] [--tokens 16]

Run with a Python that has transformers and torch (not part of `make test`:
transformers is not among the tests' dependencies). It exports --source
with `ferry export` into a temporary folder, loads that with
AutoModelForCausalLM (float32), and for each prompt compares
model.generate's greedy tokens with `ferry generate --temperature 0` on the
source; the prompt's ids come from `ferry tokenize`, so the check is of the
weights and the config, whatever transformers' tokenizers version. Prints a
line a prompt and exits 1 on any difference.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def ferry_json(ferry, *args):
    p = subprocess.run([str(ferry)] + [str(a) for a in args] + ["--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("ferry %s failed: %s" % (args[0], p.stderr.strip()))
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--layout", default="original")
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    ferry = Path(os.environ.get("FERRY_BIN") or REPO / "build" / "ferry")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "export"
        p = subprocess.run([str(ferry), "export", "--model", args.source, "--out", str(out), "--layout", args.layout],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("ferry export failed: " + p.stderr.strip())
        model = AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
        print("transformers %s, torch %s: loaded %s" % (transformers.__version__, torch.__version__,
                                                        type(model).__name__))
        for prompt in PROMPTS:
            ids = ferry_json(ferry, "tokenize", "--model", args.source, "--text", prompt)["ids"]
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
            hf = gen[0, len(ids):].tolist()
            fe = ferry_json(ferry, "generate", "--model", args.source, "--prompt-ids", ",".join(map(str, ids)),
                            "--max-new-tokens", args.tokens, "--temperature", 0)["output_ids"]
            same = hf == fe
            bad += not same
            print("%-28r %s%s" % (prompt, "same greedy tokens" if same else "DIFFERENT",
                                  "" if same else "\n  transformers %s\n  ferry        %s" % (hf, fe)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
