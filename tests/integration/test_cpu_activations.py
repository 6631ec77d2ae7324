"""--cpu-activations on a real model. bf16: SmolLM2-135M-Instruct with its
weights as BF16 (--weights-dtype bf16), the activations rounded to bf16
(AVX-512 BF16), against the same weights with exact f32 activations.

int8 on ferry's int4 weights (--quantize int4), against the same weights
with exact activations. Where the processor lacks AVX-512 BF16 or VNNI
the setting is refused naming it, and the comparison is skipped. (The
GGUF int8 mode's test is in test_gguf_model; the kernels' bounds in
test_ops.)"""

import numpy as np
import pytest

import refdata
from conftest import rel_err

PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173], [1, 504, 3033, 282, 4649, 314, 253, 1485, 30]]
BF16_TOL = 0.05  # measured 0.017 (docs/cli.md): bf16 activations move each logit by ~1-2% of the largest


def compare_modes(ferry, tmp_path, weights, mode, tol):
    """SmolLM2 with `weights` flags under --cpu-activations `mode` against
    the same weights with exact activations: logits within tol (relative
    to the largest), and a step's rows independent of each other. Skipped,
    with the refusal checked, where the processor does not offer the mode."""
    model = refdata.smollm2()
    act = ("--cpu-activations", mode)
    r = ferry.run("generate", "--model", model, "--prompt-ids", "1", "--max-new-tokens", "1", *weights, *act)
    if r.returncode != 0:
        err = r.stderr.decode()
        assert "cpu_activations " + mode in err, err
        pytest.skip(err.strip())
    _, base = ferry.generate_all(model, PROMPTS, 8, *weights, dump_logits=tmp_path / "e.bin")
    out, logits = ferry.generate_all(model, PROMPTS, 8, *weights, *act, dump_logits=tmp_path / "m.bin")
    err = rel_err(logits, base)
    d = np.abs(np.asarray(logits, dtype=np.float64) - np.asarray(base, dtype=np.float64))
    print("%s, %s activations: rel logit error %.4f, mean |d| %.4f, max |d| %.4f" % (
        " ".join(weights), mode, err, d.mean(), d.max()))
    assert err < tol, err
    for i, p in enumerate(PROMPTS):
        alone, l1 = ferry.generate_all(model, [p], 8, *weights, *act, dump_logits=tmp_path / ("a%d.bin" % i))
        assert alone[0] == out[i]
        assert np.array_equal(l1[0], logits[i]), i


def test_smollm2_bf16_activations(ferry, tmp_path):
    compare_modes(ferry, tmp_path, ("--weights-dtype", "bf16"), "bf16", BF16_TOL)


INT4_INT8_TOL = 0.15  # measured 0.060 (docs/cli.md): 8-bit activations on top of int4 weights


def test_smollm2_int4_weights_int8_activations(ferry, tmp_path):
    """ferry's int4 weights (groups of 64 and 128 columns: whole 32-column
    chunks) against 8-bit activations."""
    compare_modes(ferry, tmp_path, ("--quantize", "int4"), "int8", INT4_INT8_TOL)


def test_unknown_activations_are_refused(ferry, tmp_path):
    r = ferry.run("generate", "--model", tmp_path, "--prompt-ids", "1", "--cpu-activations", "fp8")
    err = r.stderr.decode()
    assert r.returncode == 2 and "cpu-activations" in err and "bf16" in err, err


def test_cpu_choices_are_refused_on_cuda(ferry, tmp_path):
    """--cpu-isa and --cpu-activations mean nothing to the CUDA backend:
    refused naming the setting, on any machine (checked before a GPU is
    looked for)."""
    model = refdata.smollm2()
    for flag, value in (("--cpu-activations", "int8"), ("--cpu-isa", "avx2")):
        r = ferry.run("generate", "--model", model, "--prompt-ids", "1", "--device", "cuda", flag, value)
        err = r.stderr.decode()
        assert r.returncode != 0 and flag[2:].replace("-", "_") + " " + value in err and "not cuda" in err, err


def test_inspect_says_what_this_cpu_offers(ferry, tmp_path):
    """inspect names the instruction sets and activation modes offered here,
    auto's choice first - the kernels bench then reports - and each mode it
    names is taken by generate."""
    import json
    model = refdata.smollm2()
    cpu = json.loads(ferry.check("inspect", "--model", model, "--json").stdout)["cpu"]
    assert "avx2" in cpu["isas"] and cpu["activations"][0] == "exact", cpu
    bench = json.loads(ferry.check("bench", "--model", model, "--device", "cpu", "--steps", "1", "--prompt-len", "4",
                                   "--json").stdout)
    assert bench["kernels"] == cpu["isas"][0], (bench["kernels"], cpu)
    for mode in cpu["activations"]:
        ferry.check("generate", "--model", model, "--device", "cpu", "--prompt-ids", "1", "--max-new-tokens", "1",
                    "--cpu-activations", mode)
    text = ferry.check("inspect", "--model", model).stdout.decode()
    assert "cpu kernels    %s (auto)" % cpu["isas"][0] in text, text
