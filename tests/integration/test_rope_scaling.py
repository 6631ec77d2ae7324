"""RoPE scaling (config.json rope_scaling, or v5's rope_parameters): ferry's
logits and greedy tokens against the float64 reference (llama_ref.py, whose
frequencies follow transformers' modeling_rope_utils.py), for linear, llama3
and yarn, on tiny random models whose original context is a few dozen
positions, so that prompts of 100 tokens run well inside the scaled regime.

Each case also proves that it could fail: the reference without the scaling
differs from the reference with it by far more than the tolerance. `ferry
inspect --json` shows the inverse frequencies the engine rotates by: they
must be transformers' to the bit, except where torch's float32 pow and
glibc's powf (which ferry calls) round theta^(2i/d) apart.

Errors: a type ferry does not implement, a missing factor and a factor that
is not positive are refused naming what is wrong.
"""

import ctypes
import json

import numpy as np
import pytest
import torch

import llama_ref
import st_util
from conftest import assert_ferry_error, check_greedy, copy_model, prompt_ids, rel_err

TOL = 1e-4  # f32 checkpoints, as test_numerics
N_NEW = 8
PROMPT_LEN = 100

# (id, arch, seed, changes to config.json: None removes a key)
CASES = [
    ("linear", "llama", 1, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    ("linear-legacy-type", "qwen2", 2, {"rope_scaling": {"type": "linear", "factor": 2.5}}),
    ("llama3", "llama", 3, {"rope_theta": 500000.0,
                            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    # transformers v5 writes everything, rope_theta included, in rope_parameters
    ("llama3-rope_parameters", "qwen3", 4, {"rope_theta": None, "rope_scaling": None,
                                            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,
                                                                "factor": 16.0, "low_freq_factor": 1.0,
                                                                "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 48}}),
    # Qwen2.5's long-context recipe, at a small scale
    ("yarn", "qwen2", 5, {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 32}}),
    # DeepSeek-style mscale / mscale_all_dim, other betas, a ramp not cut to whole dimensions
    ("yarn-mscale", "llama", 6, {"rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                                  "original_max_position_embeddings": 48, "mscale": 0.707,
                                                  "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2,
                                                  "truncate": False}}),
    # no original length: max_position_embeddings; an attention factor given
    ("yarn-given-attention", "qwen3", 7, {"max_position_embeddings": 128,
                                          "rope_scaling": {"rope_type": "yarn", "factor": 3.0,
                                                           "attention_factor": 1.25}}),
]
CASE_IDS = [c[0] for c in CASES]


def _with_config(d, changes):
    cfg = st_util.read_config(d)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    st_util.write_config(d, cfg)
    return cfg


@pytest.fixture(scope="module")
def scaled(models, tmp_path_factory):
    """case id -> a copy of a tiny model with the case's config.json."""
    root = tmp_path_factory.mktemp("rope")
    out = {}
    for cid, arch, seed, changes in CASES:
        d = copy_model(models.get(arch, "tiny", seed=seed), root / cid)
        _with_config(d, changes)
        out[cid] = d
    return out


def _plain(m):
    """The reference model with the scaling ignored: what ferry would give
    had it read rope_theta alone."""
    inv, att = llama_ref.rope_parameters({"rope_theta": m.theta}, m.head_dim)
    saved = m.inv_freq, m.attention_factor
    m.inv_freq, m.attention_factor = inv, att
    return saved


@pytest.mark.parametrize("cid", CASE_IDS)
def test_logits_and_greedy(ferry, ref, scaled, tmp_path, cid):
    d = scaled[cid]
    cfg = st_util.read_config(d)
    seed = CASE_IDS.index(cid) + 40
    prompt = prompt_ids(cfg["vocab_size"], PROMPT_LEN, seed)
    got, logits = ferry.generate(d, prompt, N_NEW, dump_logits=tmp_path / "l.bin")
    m = ref(d)
    assert m.attention_factor == 1.0 or "yarn" in cid
    want = llama_ref.last_logits(m, prompt)
    err = rel_err(logits[0], want)
    assert err < TOL, "rel logit error %.3g >= %g" % (err, TOL)
    check_greedy(d, m, prompt, got, N_NEW, TOL)

    # the test could fail: without the scaling the answer is far off
    saved = _plain(m)
    try:
        plain = llama_ref.last_logits(m, prompt)
    finally:
        m.inv_freq, m.attention_factor = saved
    unscaled = rel_err(plain, want)
    print("\nrope %s: rel logit error %.3g (scaling ignored: %.3g)" % (cid, err, unscaled))
    assert unscaled > 100 * TOL, "the scaling hardly changes the logits: the case proves nothing"


def _powf_table(theta, dim):
    """theta^(2i/dim) by glibc's powf, the float32 exponent as torch divides it."""
    libm = ctypes.CDLL("libm.so.6")
    libm.powf.restype = ctypes.c_float
    libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
    exps = (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim).numpy()
    return np.array([libm.powf(np.float32(theta), float(e)) for e in exps], dtype=np.float32)


@pytest.mark.parametrize("cid", CASE_IDS)
def test_inspect_shows_transformers_frequencies(ferry, ref, scaled, cid):
    d = scaled[cid]
    m = ref(d)
    cfg = st_util.read_config(d)
    rs = llama_ref.rope_scaling_dict(cfg)
    rope = json.loads(ferry.check("inspect", "--model", d, "--json").stdout)["rope"]
    assert rope["rope_type"] == rs.get("rope_type", rs.get("type"))
    assert rope["factor"] == rs["factor"]
    assert np.float32(rope["attention_scaling"]) == np.float32(m.attention_factor)
    got = np.array(rope["inv_freq"], dtype=np.float32)
    want = m.inv_freq.numpy()
    assert got.shape == want.shape
    # where torch's pow and powf agree on theta^(2i/d), the bits must too;
    # elsewhere that one ulp may carry through
    torch_pow = (m.theta ** (torch.arange(0, m.head_dim, 2, dtype=torch.int64).float() / m.head_dim)).numpy()
    pow_differs = _powf_table(m.theta, m.head_dim) != torch_pow
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    assert np.all(ulps[~pow_differs] == 0), "inv_freq differs from transformers': %s vs %s" % (got, want)
    assert np.all(ulps[pow_differs] <= 2), (got, want)

    text = ferry.check("inspect", "--model", d).stdout.decode()
    line = [l for l in text.splitlines() if l.startswith("rope scaling")]
    assert line and rope["rope_type"] in line[0] and ("factor %g" % rs["factor"]) in line[0], text


def test_plain_default_and_null_give_the_same_bits(ferry, models, work):
    """rope_type "default", rope_scaling null or absent, rope_parameters with
    rope_theta alone: plain RoPE, every one the same logits."""
    base = models.get("qwen2", "tiny", seed=9)
    prompt = prompt_ids(256, 70, 9)
    variants = {
        "absent": {"rope_scaling": None},
        "null": {},  # mkmodel writes "rope_scaling": null
        "default": {"rope_scaling": {"rope_type": "default"}},
        "params": {"rope_scaling": None, "rope_theta": None,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    }
    out = {}
    for name, changes in variants.items():
        d = copy_model(base, work / name)
        _with_config(d, changes)
        out[name] = ferry.generate(d, prompt, 4, dump_logits=work / (name + ".bin"))
    for name in variants:
        assert out[name][0] == out["null"][0]
        assert np.array_equal(out[name][1], out["null"][1]), name


def test_same_bits_on_every_placement(ferry, scaled, work):
    """The table lives in device memory: cpu-split (separate device memory)
    and weights streamed from disk give the CPU's bits."""
    d = scaled["yarn"]
    prompt = prompt_ids(256, PROMPT_LEN, 3)
    cpu = ferry.generate(d, prompt, N_NEW, dump_logits=work / "cpu.bin")
    split = ferry.generate(d, prompt, N_NEW, "--device", "cpu-split", "--max-memory", "device=0,host=0",
                           "--offload-dir", work / "od", dump_logits=work / "split.bin")
    assert split[0] == cpu[0]
    assert np.array_equal(split[1], cpu[1])


def test_reference_matches_loop_formulation_scaled(scaled):
    """The reference's two formulations agree with scaling too."""
    for cid in ("llama3", "yarn-mscale"):
        m = llama_ref.load_model(str(scaled[cid]))
        ids = list(range(3, 70, 3))
        assert rel_err(llama_ref.forward(m, ids).numpy(), llama_ref.forward_naive(m, ids)) < 1e-12


# --------------------------------------------------------------------------
# refused configs
# --------------------------------------------------------------------------

@pytest.fixture
def victim(models, work):
    return copy_model(models.get("llama", "tiny", seed=1), work / "m")


def gen(ferry, d):
    return ferry.run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 2)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope", "su", "fancy"])
def test_unknown_type_refused(ferry, victim, rope_type):
    _with_config(victim, {"rope_scaling": {"rope_type": rope_type, "factor": 2.0,
                                           "long_factor": [1.0] * 8, "short_factor": [1.0] * 8}})
    line = assert_ferry_error(gen(ferry, victim), ["'%s'" % rope_type])
    assert "not supported" in line and "config.json" in line
    assert_ferry_error(ferry.run("inspect", "--model", victim), ["'%s'" % rope_type])


def test_unknown_type_in_rope_parameters_refused(ferry, victim):
    _with_config(victim, {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}})
    assert_ferry_error(gen(ferry, victim), ["rope_parameters type 'dynamic'"])


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear"},
    {"type": "yarn", "original_max_position_embeddings": 32},
    {"rope_type": "llama3", "factor": None, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
], ids=["linear", "yarn", "llama3-null"])
def test_missing_factor_refused(ferry, victim, scaling):
    _with_config(victim, {"rope_scaling": scaling})
    assert_ferry_error(gen(ferry, victim), ["needs 'factor'"])


@pytest.mark.parametrize("factor", [0, -2.0, 0.0])
@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_factor_not_positive_refused(ferry, victim, rope_type, factor):
    _with_config(victim, {"rope_scaling": {"rope_type": rope_type, "factor": factor, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
    line = assert_ferry_error(gen(ferry, victim), ["rope_scaling.factor = %g" % factor])
    assert "positive" in line


@pytest.mark.parametrize("factor", [1e-320, 1e-40])
@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_factor_too_small_for_a_float_refused(ferry, victim, rope_type, factor):
    """A factor that is positive as a double but 0 (or subnormal) as the
    kernels' float used to load and then fail every step with inf/NaN
    blamed on the weights; it is refused at load, naming the field."""
    _with_config(victim, {"rope_scaling": {"rope_type": rope_type, "factor": factor, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
    line = assert_ferry_error(gen(ferry, victim), ["config.json", "rope_scaling.factor = ", "within float range"])
    assert "weights" not in line, line


def test_llama3_missing_field_refused(ferry, victim):
    _with_config(victim, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0}})
    assert_ferry_error(gen(ferry, victim), ["original_max_position_embeddings"])
