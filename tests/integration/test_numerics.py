"""ferry's logits and greedy tokens against the independent float64 reference
(tests/reference/llama_ref.py).

Metric: rel = max|ferry - ref| / max|ref| over the last prompt position's
logits; < 1e-4 for f32 checkpoints, < 1e-3 for f16/bf16. Greedy tokens must
be equal (see conftest.check_greedy for the only excuses).

The first group of tests checks the reference itself (no ferry needed).
"""

import math

import numpy as np
import pytest
import torch

import llama_ref
import st_util
from conftest import check_greedy, prompt_ids, rel_err

TOL = {"f32": 1e-4, "f16": 1e-3, "bf16": 1e-3}
N_NEW = 12

# --------------------------------------------------------------------------
# the reference checks itself
# --------------------------------------------------------------------------

REF_CASES = [
    dict(arch="llama", dtype="F32", kv_heads=2),
    dict(arch="llama", dtype="BF16", kv_heads=4, tied=True, attention_bias=True, shards=3),
    dict(arch="mistral", dtype="F16", kv_heads=1, sliding_window=3),
    dict(arch="qwen2", dtype="F32", kv_heads=2, shards=2),
    dict(arch="qwen3", dtype="BF16", kv_heads=2, head_dim=16, tied=True),
]


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: "-".join("%s=%s" % kv for kv in c.items()))
def test_reference_matches_loop_formulation(tmp_path, case):
    st_util.random_checkpoint(str(tmp_path), seed=3, **case)
    m = llama_ref.load_model(str(tmp_path))
    ids = [5, 17, 3, 60, 22, 9, 41]
    fast = llama_ref.forward(m, ids).numpy()
    slow = llama_ref.forward_naive(m, ids)
    assert rel_err(fast, slow) < 1e-12
    # causality: logits of a prefix do not depend on later tokens
    assert rel_err(llama_ref.forward(m, ids[:4]).numpy(), fast[:4]) < 1e-12


def test_reference_reads_what_st_util_wrote(tmp_path):
    st_util.random_checkpoint(str(tmp_path / "a"), dtype="F32", seed=1)
    st_util.random_checkpoint(str(tmp_path / "b"), dtype="BF16", seed=1, shards=3)
    st_util.random_checkpoint(str(tmp_path / "c"), dtype="F16", seed=1)
    a = llama_ref.read_checkpoint(str(tmp_path / "a"))
    b = llama_ref.read_checkpoint(str(tmp_path / "b"))
    c = llama_ref.read_checkpoint(str(tmp_path / "c"))
    assert set(a) == set(b) == set(c)
    for n in a:
        bf = torch.from_numpy(a[n].astype(np.float32)).to(torch.bfloat16).to(torch.float64).numpy()
        assert np.array_equal(b[n], bf), n  # round-to-nearest-even, same as torch
        assert np.array_equal(c[n], a[n].astype(np.float16).astype(np.float64)), n


def test_reference_rope_properties():
    hd, theta = 8, 10000.0
    rng = np.random.default_rng(0)
    q = torch.from_numpy(rng.standard_normal(hd))
    k = torch.from_numpy(rng.standard_normal(hd))
    cos, sin = llama_ref.rope_cos_sin(torch.arange(12), hd, theta)
    rq = llama_ref.apply_rope(q[None, :].expand(12, hd), cos, sin)
    rk = llama_ref.apply_rope(k[None, :].expand(12, hd), cos, sin)
    assert torch.allclose(rq[0], q)  # position 0 is the identity
    assert torch.allclose(rq.norm(dim=-1), q.norm().expand(12))
    # the score depends on the relative position only (to the float32
    # precision of the angles, which transformers computes in float32)
    assert abs(float(rq[7] @ rk[3]) - float(rq[4] @ rk[0])) < 1e-6
    # rotate_half pairs dimension j with j + hd/2, angle pos * theta^(-2j/hd)
    j, pos = 1, 5
    ang = pos * theta ** (-2.0 * j / hd)
    want = q[j] * math.cos(ang) - q[j + hd // 2] * math.sin(ang)
    assert abs(float(rq[pos][j]) - float(want)) < 1e-6


def test_reference_cli(tmp_path):
    import json
    import subprocess
    import sys
    st_util.random_checkpoint(str(tmp_path / "m"), arch="qwen2", seed=2)
    dump = tmp_path / "logits.bin"
    p = subprocess.run(["/usr/bin/python3", llama_ref.__file__, "--model", str(tmp_path / "m"),
                        "--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--dump-logits", str(dump)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True, timeout=120)
    out = json.loads(p.stdout)["output_ids"]
    m = llama_ref.load_model(str(tmp_path / "m"))
    assert out == llama_ref.greedy(m, [1, 2, 3], 5)
    got = np.fromfile(str(dump), dtype="<f4")
    assert rel_err(got, llama_ref.last_logits(m, [1, 2, 3])) < 1e-6


# --------------------------------------------------------------------------
# ferry against the reference
# --------------------------------------------------------------------------

# arch x dtype all 12 pairs; (kv, tied, sharded) spread so that every arch and
# every dtype sees both values of each of those axes.
COVER = [
    ("llama", "f32", "gqa", False, False),
    ("llama", "f16", "mha", True, False),
    ("llama", "bf16", "gqa", True, True),
    ("mistral", "f32", "mha", False, True),
    ("mistral", "f16", "gqa", False, True),
    ("mistral", "bf16", "mha", True, False),
    ("qwen2", "f32", "gqa", True, False),
    ("qwen2", "f16", "mha", False, False),
    ("qwen2", "bf16", "gqa", False, True),
    ("qwen3", "f32", "mha", True, True),
    ("qwen3", "f16", "gqa", True, False),
    ("qwen3", "bf16", "mha", False, False),
]

SHARD_SIZE = "16KiB"


def _build(models, arch, dtype, kv, tied, sharded, seed, preset="tiny"):
    d = models.get(arch, preset, dtype=dtype, seed=seed,
                   kv_heads="mha" if kv == "mha" else None, tied=tied,
                   shard_size=SHARD_SIZE if sharded else None)
    cfg = st_util.read_config(d)
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    if kv == "mha":
        assert nkv == nh, "mkmodel --kv-heads %d did not give MHA: %r" % (nh, dict(cfg))
    else:
        assert nkv < nh, "preset %s is expected to be GQA: %r" % (preset, dict(cfg))
    assert bool(cfg.get("tie_word_embeddings", False)) == tied
    files = st_util.model_files(d)
    if sharded:
        assert (d / "model.safetensors.index.json").exists()
        assert len(files) > 1, "--shard-size %s gave one shard" % SHARD_SIZE
    else:
        assert files == ["model.safetensors"] and (d / "model.safetensors").exists()
    want_dtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[dtype]
    for f in files:
        st = st_util.read(d / f)
        dts = {st.info(n)["dtype"] for n in st.names if n.endswith("proj.weight")}
        assert dts <= {want_dtype}, "%s: weight dtypes %s, expected %s" % (f, dts, want_dtype)
    return d, cfg


def _compare(ferry, ref, d, cfg, prompt, tol, tmp_path, n_new=N_NEW, extra=()):
    dump = tmp_path / "logits.bin"
    got, logits = ferry.generate(d, prompt, n_new, *extra, dump_logits=dump)
    m = ref(d)
    want_logits = llama_ref.last_logits(m, prompt)
    assert logits.shape == (1, cfg["vocab_size"])
    assert np.all(np.isfinite(logits))
    err = rel_err(logits[0], want_logits)
    assert err < tol, "rel logit error %.3g >= %.g" % (err, tol)
    check_greedy(d, m, prompt, got, n_new, tol)
    return got, logits[0], err


@pytest.mark.parametrize("arch,dtype,kv,tied,sharded", COVER,
                         ids=["%s-%s-%s-%s-%s" % (a, d, k, "tied" if t else "untied",
                                                  "shards" if s else "single")
                              for a, d, k, t, s in COVER])
def test_logits_and_greedy(ferry, models, ref, tmp_path, arch, dtype, kv, tied, sharded):
    seed = 100 + COVER.index((arch, dtype, kv, tied, sharded))
    d, cfg = _build(models, arch, dtype, kv, tied, sharded, seed)
    prompt = prompt_ids(cfg["vocab_size"], 6, seed)
    _compare(ferry, ref, d, cfg, prompt, TOL[dtype], tmp_path)


def test_qwen3_head_dim_differs(models):
    """The qwen3 tiny preset is meant to exercise head_dim != hidden/heads."""
    cfg = st_util.read_config(models.get("qwen3", "tiny"))
    assert cfg.get("head_dim") is not None
    assert cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]


def test_qwen2_has_qkv_bias(models):
    d = models.get("qwen2", "tiny")
    names = set(st_util.read(d / "model.safetensors").names)
    for k in "qkv":
        assert "model.layers.0.self_attn.%s_proj.bias" % k in names


def test_mistral_sliding_window(ferry, models, ref, tmp_path):
    d = models.get("mistral", "tiny", sliding_window=4, seed=7)
    cfg = st_util.read_config(d)
    assert cfg.get("sliding_window") == 4
    prompt = prompt_ids(cfg["vocab_size"], 11, 7)
    got, logits, _ = _compare(ferry, ref, d, cfg, prompt, TOL["f32"], tmp_path, n_new=16)
    # the window must actually matter for this prompt, or the test proves nothing
    m = ref(d)
    saved = m.sliding_window
    try:
        m.sliding_window = None
        full = llama_ref.last_logits(m, prompt)
    finally:
        m.sliding_window = saved
    assert rel_err(full, llama_ref.last_logits(m, prompt)) > 1e-3


@pytest.mark.parametrize("arch,preset,dtype", [("llama", "small", "f32"), ("qwen3", "tiny", "bf16")])
def test_long_prompt(ferry, models, ref, tmp_path, arch, preset, dtype):
    d = models.get(arch, preset, dtype=dtype, seed=11)
    cfg = st_util.read_config(d)
    prompt = prompt_ids(cfg["vocab_size"], 40, 11)
    _compare(ferry, ref, d, cfg, prompt, TOL[dtype], tmp_path, n_new=8)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_batch_equals_separate(ferry, models, ref, tmp_path, arch):
    d = models.get(arch, "tiny", seed=21)
    cfg = st_util.read_config(d)
    V = cfg["vocab_size"]
    prompts = [prompt_ids(V, 3, 1), prompt_ids(V, 17, 2), prompt_ids(V, 9, 3)]
    got, logits = ferry.generate(d, prompts, N_NEW, dump_logits=tmp_path / "batch.bin")
    assert logits.shape == (3, V)
    m = ref(d)
    for i, p in enumerate(prompts):
        one, one_logits = ferry.generate(d, p, N_NEW, dump_logits=tmp_path / ("one%d.bin" % i))
        assert got[i] == one, "prompt %d: batched %r vs alone %r" % (i, got[i], one)
        err = rel_err(logits[i], one_logits[0])
        assert err < 1e-5, "prompt %d: batched vs alone logits rel %.3g" % (i, err)
        err = rel_err(logits[i], llama_ref.last_logits(m, p))
        assert err < TOL["f32"], "prompt %d: rel logit error vs reference %.3g" % (i, err)
        check_greedy(d, m, p, got[i], N_NEW, TOL["f32"])
