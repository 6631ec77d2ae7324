"""Mixtures of experts (MixtralForCausalLM, Qwen3MoeForCausalLM): ferry
against the float64 reference (llama_ref.py, transformers' sparse MoE
blocks), and every placement of the experts against all-resident.

The reference checks itself first (no ferry needed): its batched routing
against its per-token loop formulation, against transformers' own
formulation (torch.topk, one_hot, index_add_) where there are no ties, its
tie rule, and the config defaults it applies.

Then ferry, on small random checkpoints written here (moe_util.py) and on
`ferry mkmodel`'s presets:
  * numerics: last-position logits within TOL (rel, as test_numerics) and
    greedy tokens equal, for both architectures, f32 and bf16, tied and
    untied, Qwen3-MoE dense layers (decoder_sparse_step, mlp_only_layers),
    configs that leave fields to their defaults, a Mixtral config whose
    norm_topk_prob false Mixtral ignores;
  * placements: experts on host, on disk, mixed across the three tiers,
    expert caches from none to every expert, attention layers streamed
    too, cpu and cpu-split, batched prefill, chunked prefill, greedy and
    sampled decode: the all-resident run's tokens, logits within SAME;
  * routing ties: inside the top-k set (any rule, same answer) and at its
    boundary (the lower index), each with a twin checkpoint whose tied
    experts swap places, which shows whether the choice matters;
  * a batch whose tokens use every expert, and batches whose tokens all
    use the same expert(s);
  * `ferry plan`: expert groups, their tiers and the expert slots.

Every case checks from the reference's routing that it is what it claims
(which experts, ties exact), and that no token's top-k boundary is within
MARGIN of a tie where it is not meant to be one - f32 and float64 could
then pick different experts and the comparison would prove nothing.
"""

import json
import os

import numpy as np
import pytest
import torch

import llama_ref
import moe_util
import st_util
from conftest import check_greedy, prompt_ids, rel_err

TOL = {"F32": 1e-4, "BF16": 1e-4}  # the weights are exact in bf16; ferry computes in f32 like for f32
SAME = 1e-6    # max abs logit difference between two ferry runs of the same maths
MARGIN = 1e-5  # least probability gap at the top-k boundary of an untied routing
N_NEW = 8


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def routing(m, ids):
    """The reference's routing of every position of ids: one dict per sparse
    layer (llama_ref.forward's trace)."""
    trace = []
    llama_ref.forward(m, ids, trace)
    return trace


def boundary_gap(m, trace):
    """Least p[k-th] - p[(k+1)-th] over tokens and layers (inf when top_k is
    every expert)."""
    if m.top_k >= m.n_experts:
        return float("inf")
    gaps = []
    for t in trace:
        p = -np.sort(-t["probs"], axis=1)
        gaps.append(float((p[:, m.top_k - 1] - p[:, m.top_k]).min()))
    return min(gaps)


def ref_run(m, prompts, n_new=N_NEW):
    """(greedy tokens per prompt, last-position logits [n, vocab], traces of
    prompt + generated tokens per prompt)."""
    outs, logits, traces = [], [], []
    for p in prompts:
        g = llama_ref.greedy(m, p, n_new)
        outs.append(g)
        logits.append(llama_ref.last_logits(m, p))
        traces.append(routing(m, list(p) + g))
    return outs, np.stack(logits), traces


def assert_clear_routing(m, traces, what=""):
    gap = min(boundary_gap(m, t) for t in traces)
    assert gap > MARGIN, "%s: a top-k boundary within %.3g of a tie; choose another seed" % (what, gap)


def experts_used(traces):
    """{layer: set of experts any token of any trace chose}."""
    used = {}
    for tr in traces:
        for t in tr:
            used.setdefault(t["layer"], set()).update(int(e) for e in t["experts"].ravel())
    return used


class MoeModels:
    """Checkpoints from moe_util, written once per session by name."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def get(self, name, **spec):
        if name not in self.cache:
            spec = dict(spec)
            d = self.root / name
            moe_util.random_moe_checkpoint(str(d), **spec)
            self.cache[name] = d
        return self.cache[name]


@pytest.fixture(scope="session")
def moe_models(tmp_path_factory):
    return MoeModels(tmp_path_factory.mktemp("moe"))


def prompts_for(vocab, seed, lengths=(5, 9, 13)):
    return [prompt_ids(vocab, n, seed + n) for n in lengths]


def run(ferry, d, prompts, flags, dump, n_new=N_NEW):
    out, logits = ferry.generate(d, prompts, n_new, *flags, dump_logits=dump)
    assert logits.shape[0] == len(prompts)
    assert np.all(np.isfinite(logits)), "%s: logits not finite" % (flags,)
    return out, logits


def compare_ref(ferry, ref, d, prompts, tmp_path, dtype="F32", flags=(), what=""):
    """ferry's batched run of prompts against the reference; returns ferry's
    (tokens, logits) and the reference's traces."""
    m = ref(d)
    out, logits = run(ferry, d, prompts, list(flags), tmp_path / "l.bin")
    _, want, traces = ref_run(m, prompts)
    for i, p in enumerate(prompts):
        err = rel_err(logits[i], want[i])
        assert err < TOL[dtype], "%s prompt %d: rel logit error %.3g vs reference" % (what, i, err)
        check_greedy(d, m, p, out[i], N_NEW, TOL[dtype])
    return out, logits, traces


def plan_json(ferry, d, *flags):
    p = ferry.check("plan", "--model", d, "--json", *flags)
    return json.loads(p.stdout.decode())


# --------------------------------------------------------------------------
# the reference checks itself
# --------------------------------------------------------------------------

REF_CASES = [
    dict(arch="mixtral", dtype="F32", experts=4, top_k=2),
    dict(arch="mixtral", dtype="BF16", experts=8, top_k=3, tied=True, sliding_window=3, kv_heads=1, shards=2),
    dict(arch="qwen3moe", dtype="F32", layers=4, decoder_sparse_step=2, experts=6, top_k=2),
    dict(arch="qwen3moe", dtype="BF16", layers=3, mlp_only_layers=[0], norm_topk_prob=True, attention_bias=True,
         tied=True, head_dim=16, experts=4, top_k=1),
]


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: "-".join("%s=%s" % kv for kv in c.items()))
def test_reference_moe_matches_loop_formulation(tmp_path, case):
    moe_util.random_moe_checkpoint(str(tmp_path), seed=3, **case)
    m = llama_ref.load_model(str(tmp_path))
    assert m.sparse == moe_util.shape_of(st_util.read_config(tmp_path))["sparse"]
    ids = [5, 17, 3, 60, 22, 9, 41]
    fast = llama_ref.forward(m, ids).numpy()
    slow = llama_ref.forward_naive(m, ids)
    assert rel_err(fast, slow) < 1e-12
    assert rel_err(llama_ref.forward(m, ids[:4]).numpy(), fast[:4]) < 1e-12


def _transformers_moe_block(m, L, h, trace=None, layer=None):
    """transformers' Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock forward
    as written there (torch.topk, one_hot expert mask, index_add_)."""
    routing_weights = torch.softmax(h @ L["router"].T, dim=1)
    routing_weights, selected = torch.topk(routing_weights, m.top_k, dim=-1)
    if m.norm_topk:
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
    final = torch.zeros_like(h)
    expert_mask = torch.nn.functional.one_hot(selected, num_classes=m.n_experts).permute(2, 1, 0)
    for e in range(m.n_experts):
        idx, top_x = torch.where(expert_mask[e])
        if top_x.numel() == 0:
            continue
        E = L["experts"][e]
        x = h[top_x]
        y = (torch.nn.functional.silu(x @ E["gate"].T) * (x @ E["up"].T)) @ E["down"].T
        final.index_add_(0, top_x, y * routing_weights[top_x, idx, None])
    return final


@pytest.mark.parametrize("case", REF_CASES[::2] + REF_CASES[3:], ids=lambda c: c["arch"])
def test_reference_moe_matches_transformers_formulation(tmp_path, monkeypatch, case):
    moe_util.random_moe_checkpoint(str(tmp_path), seed=5, **case)
    m = llama_ref.load_model(str(tmp_path))
    ids = list(range(3, 40, 3))
    ours = llama_ref.forward(m, ids).numpy()
    assert_clear_routing(m, [routing(m, ids)])  # no ties: torch.topk's order cannot matter
    monkeypatch.setattr(llama_ref, "moe_block", _transformers_moe_block)
    theirs = llama_ref.forward(m, ids).numpy()
    assert rel_err(ours, theirs) < 1e-12


def test_reference_tie_rule():
    # equal probabilities: the lower index first (torch.topk's order of equal
    # values is unspecified - on torch 1.13 topk of 8 equal values gives [6, 5])
    p = torch.full((1, 8), 0.125, dtype=torch.float64)
    e, w = llama_ref.select_experts(p, 2, True)
    assert e.tolist() == [[0, 1]] and w.tolist() == [[0.5, 0.5]]
    # a tie at the boundary: the lower of the tied pair
    p = torch.tensor([[0.1, 0.2, 0.4, 0.2, 0.1]], dtype=torch.float64)
    e, w = llama_ref.select_experts(p, 2, False)
    assert e.tolist() == [[2, 1]] and w.tolist() == [[0.4, 0.2]]
    e, w = llama_ref.select_experts(p, 2, True)
    assert abs(w[0, 0].item() - 2 / 3) < 1e-15
    # ties everywhere, several rows: stable per row
    p = torch.tensor([[0.25] * 4, [0.1, 0.3, 0.3, 0.3]], dtype=torch.float64)
    assert llama_ref.select_experts(p, 3, False)[0].tolist() == [[0, 1, 2], [1, 2, 3]]


def test_reference_config_defaults(tmp_path):
    """What a config that leaves fields out means (MixtralConfig,
    Qwen3MoeConfig defaults)."""
    d = tmp_path / "mix"
    moe_util.random_moe_checkpoint(str(d), "mixtral", heads=8, kv_heads=8, experts=8, top_k=2, omit=(
        "num_local_experts", "num_experts_per_tok", "rms_norm_eps", "rope_theta", "num_key_value_heads",
        "head_dim", "sliding_window"))
    m = llama_ref.load_model(str(d))
    assert (m.n_experts, m.top_k, m.norm_topk, m.eps, m.theta, m.n_kv, m.head_dim, m.sliding_window) == (
        8, 2, True, 1e-5, 1e6, 8, 4, None)
    assert m.sparse == [0, 1]
    d = tmp_path / "q3"
    moe_util.random_moe_checkpoint(str(d), "qwen3moe", layers=3, heads=8, kv_heads=4, experts=8, top_k=8,
                                   moe_intermediate=768, intermediate=6144, mlp_only_layers=[1], omit=(
        "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "rms_norm_eps", "rope_theta", "num_key_value_heads", "head_dim"))
    m = llama_ref.load_model(str(d))
    assert (m.n_experts, m.top_k, m.norm_topk, m.moe_hidden, m.eps, m.theta, m.n_kv, m.head_dim) == (
        8, 8, False, 768, 1e-6, 10000.0, 4, 4)
    assert m.sparse == [0, 2] and m.layers[1]["gate"].shape == (6144, 32)
    # the experts' shapes are checked against the config
    cfg = st_util.read_config(d)
    cfg["moe_intermediate_size"] = 24
    st_util.write_config(d, cfg)
    with pytest.raises(ValueError, match="moe_intermediate|shape"):
        llama_ref.load_model(str(d))


def test_reference_sparse_layers():
    base = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 6, "num_experts": 4}
    assert llama_ref.sparse_layers(base) == [0, 1, 2, 3, 4, 5]
    assert llama_ref.sparse_layers(dict(base, decoder_sparse_step=2)) == [1, 3, 5]
    assert llama_ref.sparse_layers(dict(base, decoder_sparse_step=3, mlp_only_layers=[5])) == [2]
    assert llama_ref.sparse_layers(dict(base, mlp_only_layers=[0, 4])) == [1, 2, 3, 5]
    assert llama_ref.sparse_layers(dict(base, num_experts=0)) == []
    assert llama_ref.sparse_layers({"architectures": ["MixtralForCausalLM"], "num_hidden_layers": 3,
                                    "mlp_only_layers": [1]}) == [0, 1, 2]
