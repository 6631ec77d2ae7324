"""--cpu-activations bf16 on a real model: SmolLM2-135M-Instruct with its
weights as BF16 (--weights-dtype bf16), the activations rounded to bf16
(AVX-512 BF16), against the same weights with exact f32 activations.

Where the processor lacks AVX-512 BF16 the setting is refused naming it,
and the comparison is skipped. (The GGUF int8 mode's test is in
test_gguf_model; the kernels' bounds in test_ops.)"""

import numpy as np
import pytest

import refdata
from conftest import rel_err

PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173], [1, 504, 3033, 282, 4649, 314, 253, 1485, 30]]
BF16_TOL = 0.05  # measured 0.017 (docs/cli.md): bf16 activations move each logit by ~1-2% of the largest


def test_smollm2_bf16_activations(ferry, tmp_path):
    model = refdata.smollm2()
    r = ferry.run("generate", "--model", model, "--prompt-ids", "1", "--max-new-tokens", "1",
                  "--weights-dtype", "bf16", "--cpu-activations", "bf16")
    if r.returncode != 0:
        err = r.stderr.decode()
        assert "cpu_activations bf16" in err, err
        pytest.skip(err.strip())
    base_out, base = ferry.generate_all(model, PROMPTS, 8, "--weights-dtype", "bf16", dump_logits=tmp_path / "e.bin")
    out, logits = ferry.generate_all(model, PROMPTS, 8, "--weights-dtype", "bf16", "--cpu-activations", "bf16",
                                     dump_logits=tmp_path / "b.bin")
    err = rel_err(logits, base)
    d = np.abs(np.asarray(logits, dtype=np.float64) - np.asarray(base, dtype=np.float64))
    print("bf16 activations: rel logit error %.4f, mean |d| %.4f, max |d| %.4f" % (err, d.mean(), d.max()))
    assert err < BF16_TOL, err
    for i, p in enumerate(PROMPTS):  # a step's rows independent of each other
        alone, l1 = ferry.generate_all(model, [p], 8, "--weights-dtype", "bf16", "--cpu-activations", "bf16",
                                       dump_logits=tmp_path / ("a%d.bin" % i))
        assert alone[0] == out[i]
        assert np.array_equal(l1[0], logits[i]), i


def test_unknown_activations_are_refused(ferry, tmp_path):
    r = ferry.run("generate", "--model", tmp_path, "--prompt-ids", "1", "--cpu-activations", "fp8")
    err = r.stderr.decode()
    assert r.returncode == 2 and "cpu-activations" in err and "bf16" in err, err
