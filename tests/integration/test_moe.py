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
    untied, Qwen3-MoE dense layers (decoder_sparse_step, mlp_only_layers,
    no sparse layer at all), 64 experts of which 8, configs that leave
    fields to their defaults, a Mixtral config whose norm_topk_prob false
    Mixtral ignores, mkmodel's tiny and small presets, long prompts that
    give an expert more rows than the decode matmul path takes;
  * placements: experts on host, on disk, mixed across the three tiers,
    expert caches from the least (2 x top_k slots) to every expert,
    attention layers streamed too (group sizes 1 to 3), cpu and cpu-split,
    batched prefill, chunked prefill, greedy and sampled decode: the
    all-resident run's tokens, logits within SAME (max abs); `ferry serve`
    with concurrent requests whose prefill and decode share steps, and the
    expert metrics;
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

import concurrent.futures
import json

import numpy as np
import pytest
import torch

import llama_ref
import moe_util
import st_util
from conftest import check_greedy, prompt_ids, rel_err
from test_http import generate as http_generate
from test_http import metrics, msum, serve

TOL = {"F32": 1e-4, "BF16": 1e-4}  # the weights are exact in bf16; ferry computes in f32 like for f32
SAME = 1e-6    # max abs logit difference between two ferry runs of the same maths
MARGIN = 1e-4  # least router logit gap at the top-k boundary of an untied routing (boundary_gap)
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
    """Least log p[k-th] - log p[(k+1)-th], the router logits' gap at the
    top-k boundary, over tokens and layers (inf when top_k is every
    expert). ferry's router logits are f32: a gap of 1e-4 is some hundred
    times their rounding."""
    if m.top_k >= m.n_experts:
        return float("inf")
    gaps = []
    for t in trace:
        p = -np.sort(-t["probs"], axis=1)
        gaps.append(float((np.log(p[:, m.top_k - 1]) - np.log(p[:, m.top_k])).min()))
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
    """ferry generate of a list of prompts: (tokens per prompt, logits [n, vocab])."""
    return ferry.generate_all(d, prompts, n_new, *flags, dump_logits=dump)


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
    moe_util.random_moe_checkpoint(str(d), "mixtral", heads=16, kv_heads=8, experts=8, top_k=2, omit=(
        "num_local_experts", "num_experts_per_tok", "rms_norm_eps", "rope_theta", "num_key_value_heads",
        "head_dim", "sliding_window"))
    m = llama_ref.load_model(str(d))
    assert (m.n_experts, m.top_k, m.norm_topk, m.eps, m.theta, m.n_kv, m.head_dim, m.sliding_window) == (
        8, 2, True, 1e-5, 1e6, 8, 2, None)
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


# --------------------------------------------------------------------------
# ferry against the reference
# --------------------------------------------------------------------------

# name -> moe_util.random_moe_checkpoint arguments
MODELS = {
    # Mixtral ignores norm_topk_prob: it always renormalizes
    "mix-f32": dict(arch="mixtral", dtype="F32", layers=3, experts=8, top_k=2, norm_topk_prob=False, seed=305),
    # a head_dim of its own (not hidden / heads), a sliding window, experts across shards
    "mix-bf16-tied": dict(arch="mixtral", dtype="BF16", layers=2, experts=4, top_k=2, tied=True, head_dim=16,
                          sliding_window=4, kv_heads=1, shards=2, seed=302),
    "q3-f32-tied": dict(arch="qwen3moe", dtype="F32", layers=4, decoder_sparse_step=2, experts=8, top_k=2,
                        tied=True, head_dim=16, seed=303),
    "q3-bf16": dict(arch="qwen3moe", dtype="BF16", layers=3, mlp_only_layers=[1], experts=6, top_k=3,
                    norm_topk_prob=True, attention_bias=True, seed=309),
    # many small experts, as Qwen3-30B-A3B's 128 of which 8 (most of them idle in a step)
    "q3-many": dict(arch="qwen3moe", dtype="F32", layers=2, experts=64, top_k=8, moe_intermediate=8, seed=305),
}


def moe_model(moe_models, name):
    spec = dict(MODELS[name])
    return moe_models.get(name, **spec), spec


@pytest.mark.parametrize("name", list(MODELS))
def test_logits_and_greedy(ferry, moe_models, ref, tmp_path, name):
    d, spec = moe_model(moe_models, name)
    m = ref(d)
    assert m.sparse == moe_util.shape_of(st_util.read_config(d))["sparse"] and m.sparse
    prompts = prompts_for(m.vocab, spec["seed"])
    _, _, traces = compare_ref(ferry, ref, d, prompts, tmp_path, spec["dtype"], what=name)
    assert_clear_routing(m, traces, name)
    if spec.get("sliding_window"):  # the window matters to these prompts, or the case proves nothing
        saved, m.sliding_window = m.sliding_window, None
        try:
            full = llama_ref.last_logits(m, prompts[-1])
        finally:
            m.sliding_window = saved
        assert rel_err(full, llama_ref.last_logits(m, prompts[-1])) > 1e-3


@pytest.mark.parametrize("arch", ["mixtral", "qwen3moe"])
def test_mkmodel_presets(ferry, models, ref, tmp_path, arch):
    """ferry mkmodel's MoE presets against the reference."""
    d = models.get(arch, "tiny", seed=311)
    m = ref(d)
    assert m.arch == moe_util.ARCHS[arch] and m.sparse and m.n_experts > m.top_k
    prompts = prompts_for(m.vocab, 311, (6, 11))
    _, _, traces = compare_ref(ferry, ref, d, prompts, tmp_path, "F32", what=arch)
    assert_clear_routing(m, traces, arch)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3moe"])
@pytest.mark.slow
def test_long_prompts_small_presets(ferry, models, ref, tmp_path, arch):
    """mkmodel's small presets (Qwen3-MoE: 16 experts, top 4, not
    renormalized, a dense layer 0) with prompts of 60 and 45 tokens: more
    rows per expert than the matmul's decode path takes (16), in one prefill
    step; the reference's answer, and the same with the experts on disk."""
    d = models.get(arch, "small", seed=401)
    m = ref(d)
    prompts = [prompt_ids(m.vocab, 60, 401), prompt_ids(m.vocab, 45, 402)]
    out, logits, traces = compare_ref(ferry, ref, d, prompts, tmp_path, "F32", what=arch)
    assert_clear_routing(m, traces, arch)
    rows = [np.bincount(t["experts"].ravel(), minlength=m.n_experts) for t in routing(m, prompts[0])]
    assert max(int(r.max()) for r in rows) > 16
    flags, _ = placement_flags(ferry, d, "experts-disk", tmp_path / "od", 0)
    got, got_logits = run(ferry, d, prompts, flags, tmp_path / "disk.bin")
    assert got == out and float(np.max(np.abs(got_logits - logits))) <= SAME


def test_config_defaults(ferry, ref, tmp_path):
    """Configs that leave the MoE fields, eps, theta, kv heads and head_dim
    to their defaults: ferry reads them as transformers does (the
    reference's defaults are checked against transformers' above)."""
    cases = {
        # num_key_value_heads absent: 8 (MixtralConfig), not num_attention_heads
        "mixtral": dict(arch="mixtral", heads=16, kv_heads=8, experts=8, top_k=2, seed=321, omit=(
            "num_local_experts", "num_experts_per_tok", "rms_norm_eps", "rope_theta", "num_key_value_heads",
            "head_dim", "sliding_window", "norm_topk_prob")),
        # head_dim absent: hidden / heads (4), not Qwen3's 128; num_key_value_heads absent: 4
        "qwen3moe": dict(arch="qwen3moe", layers=3, heads=8, kv_heads=4, experts=8, top_k=8, moe_intermediate=768,
                         intermediate=6144, mlp_only_layers=[1], seed=322, omit=(
            "num_experts_per_tok", "moe_intermediate_size", "intermediate_size", "norm_topk_prob",
            "decoder_sparse_step", "rms_norm_eps", "rope_theta", "num_key_value_heads", "head_dim")),
    }
    for name, spec in cases.items():
        d = tmp_path / name
        moe_util.random_moe_checkpoint(str(d), **spec)
        m = ref(d)
        compare_ref(ferry, ref, d, prompts_for(m.vocab, spec["seed"], (7,)), tmp_path, what=name)


@pytest.mark.parametrize("spec", [dict(experts=0), dict(experts=4, decoder_sparse_step=3)],
                         ids=["no-experts", "step-past-the-layers"])
def test_qwen3moe_without_sparse_layers(ferry, ref, tmp_path, spec):
    """num_experts 0, or a decoder_sparse_step no layer meets: every layer a
    dense MLP of intermediate_size (Qwen3MoeDecoderLayer)."""
    d = tmp_path / "m"
    moe_util.random_moe_checkpoint(str(d), "qwen3moe", layers=2, seed=323, **spec)
    m = ref(d)
    assert m.sparse == [] and not [n for n in st_util.read(d / "model.safetensors").names if ".experts." in n]
    compare_ref(ferry, ref, d, prompts_for(m.vocab, 323, (6,)), tmp_path, what=str(spec))


# --------------------------------------------------------------------------
# routing ties, all experts, one expert
# --------------------------------------------------------------------------

def steered(moe_models, name, prefs, share=None, swap=None, **spec):
    """A checkpoint whose routing follows prefs (moe_util.steer); swap=(a, b)
    exchanges experts a and b's weights (not their router rows)."""
    def edit(cfg, t):
        moe_util.steer(cfg, t, prefs, share=share)
        if swap:
            a, b = swap
            for l in moe_util.shape_of(cfg)["sparse"]:
                na, nb = moe_util.expert_names(cfg, l, a), moe_util.expert_names(cfg, l, b)
                for k in na:
                    t[na[k]], t[nb[k]] = t[nb[k]].copy(), t[na[k]].copy()
    return moe_models.get(name, edit=edit, **spec)


# (name, spec, prefs, share, tied pair, where the tie is)
TIES = [
    ("tie-inside-mix", dict(arch="mixtral", experts=4, top_k=2, seed=331), [-3, 1, 1, -3], [0, 1, 1, 2], (1, 2),
     "inside"),
    ("tie-inside-q3", dict(arch="qwen3moe", experts=6, top_k=3, layers=3, mlp_only_layers=[0], seed=332),
     [-3, 1.2, -3, 1, 1, -3], [0, 1, 2, 3, 3, 4], (3, 4), "inside"),
    ("tie-boundary-mix", dict(arch="mixtral", experts=4, top_k=2, seed=333), [1.05, 1, 1, -3], [0, 0, 0, 1],
     (1, 2), "boundary"),
    ("tie-boundary-q3", dict(arch="qwen3moe", experts=6, top_k=2, layers=3, norm_topk_prob=False, seed=334),
     [-3, -3, 1.0, -3, 0.95, 0.95], [0, 1, 2, 3, 2, 2], (4, 5), "boundary"),
]


@pytest.mark.parametrize("name,spec,prefs,share,pair,where", TIES, ids=[t[0] for t in TIES])
def test_routing_ties(ferry, moe_models, ref, tmp_path, name, spec, prefs, share, pair, where):
    """Two experts with identical router rows tie exactly for every token.
    Inside the top-k set both are chosen whatever the rule: swapping their
    weights changes nothing. At the boundary one is chosen: ferry takes the
    lower index as the reference does, and the twin checkpoint with the pair
    swapped shows the choice matters."""
    d = steered(moe_models, name, prefs, share, **spec)
    twin = steered(moe_models, name + "-swapped", prefs, share, swap=pair, **spec)
    m = ref(d)
    prompts = prompts_for(m.vocab, spec["seed"])
    out, logits, traces = compare_ref(ferry, ref, d, prompts, tmp_path, what=name)
    a, b = pair
    k = m.top_k
    for tr in traces:
        for t in tr:
            assert np.array_equal(t["probs"][:, a], t["probs"][:, b]), "the tie is not exact"
            rank = np.argsort(np.argsort(-t["probs"], axis=1, kind="stable"), axis=1, kind="stable")
            if where == "inside":
                assert np.all(rank[:, b] < k), "the tied pair is not inside the top-k set"
                assert np.all(np.any(t["experts"] == a, axis=1) & np.any(t["experts"] == b, axis=1))
            else:
                assert np.all(rank[:, a] == k - 1) and np.all(rank[:, b] == k), "the tie is not at the boundary"
                assert not np.any(t["experts"] == b), "the reference chose the higher index"
    out2, logits2, _ = compare_ref(ferry, ref, twin, prompts, tmp_path, what=name + " swapped")
    moved = max(rel_err(llama_ref.last_logits(ref(twin), p), llama_ref.last_logits(m, p)) for p in prompts)
    if where == "inside":
        assert moved < 1e-12, "swapping two experts both chosen changed the reference (%.3g)" % moved
        # the same sum in another order (with top_k 2 the same to the bit: a + b == b + a)
        assert out2 == out and rel_err(logits2, logits) < 1e-5
    else:
        assert moved > 100 * TOL["F32"], "the tie's choice does not matter to the output (%.3g)" % moved


def test_every_expert_in_one_batch(ferry, moe_models, ref, tmp_path):
    """A batch whose tokens route to every expert of every sparse layer, in
    one prefill step: the reference's answer, resident and with the experts
    on disk and no expert cache."""
    name = "mix-f32"
    d, spec = moe_model(moe_models, name)
    m = ref(d)
    prompts = prompts_for(m.vocab, 341, (9, 12, 15))
    out, logits, traces = compare_ref(ferry, ref, d, prompts, tmp_path, what="every expert")
    prefill = [routing(m, p) for p in prompts]
    used = experts_used(prefill)
    assert all(used[l] == set(range(m.n_experts)) for l in m.sparse), used
    assert_clear_routing(m, traces)
    flags, _ = placement_flags(ferry, d, "experts-disk", tmp_path / "od", cache=0)
    got, got_logits = run(ferry, d, prompts, flags, tmp_path / "disk.bin")
    assert got == out and float(np.max(np.abs(got_logits - logits))) <= SAME


# (name, spec, prefs, the experts every token uses)
SAME_EXPERT = [
    ("one-expert-mix", dict(arch="mixtral", experts=4, top_k=1, seed=351), [-3, 2, -3, -3], {1}),
    ("same-pair-q3", dict(arch="qwen3moe", experts=4, top_k=2, layers=3, decoder_sparse_step=1, seed=352),
     [2, -3, -3, 1.8], {0, 3}),
]


@pytest.mark.parametrize("name,spec,prefs,want", SAME_EXPERT, ids=[s[0] for s in SAME_EXPERT])
def test_every_token_same_experts(ferry, moe_models, ref, tmp_path, name, spec, prefs, want):
    d = steered(moe_models, name, prefs, **spec)
    m = ref(d)
    prompts = prompts_for(m.vocab, spec["seed"])
    out, logits, traces = compare_ref(ferry, ref, d, prompts, tmp_path, what=name)
    for tr in traces:
        for t in tr:
            assert all(set(int(e) for e in row) == want for row in t["experts"]), t["experts"]
    assert_clear_routing(m, traces, name)
    for cache in (0, None):
        flags, _ = placement_flags(ferry, d, "experts-disk", tmp_path / "od", cache=cache)
        got, got_logits = run(ferry, d, prompts, flags, tmp_path / "disk.bin")
        assert got == out and float(np.max(np.abs(got_logits - logits))) <= SAME, flags


# --------------------------------------------------------------------------
# placements: the all-resident run's outputs
# --------------------------------------------------------------------------

def split_groups(groups):
    """(embed, layer groups and head in execution order, experts) of a
    plan's groups: the experts are the groups after the head (plan.h)."""
    names = [g["name"] for g in groups]
    head = names.index("head")
    return groups[0], groups[1:head + 1], groups[head + 1:]


def moe_budgets(groups, placement):
    """--max-memory for a placement and the tiers it gives each group, in
    plan order. Placement order (plan.h): the layer groups and head, then
    the experts layer by layer, then the embedding; first fit."""
    embed, core, experts = split_groups(groups)
    core_b = sum(g["bytes"] for g in core)
    ex = [g["bytes"] for g in experts]
    n = len(ex)
    et = "device" if embed["bytes"] == 0 else None  # an empty (tied) embedding group
    if placement == "resident":
        return None, ["device"] * len(groups)
    if placement == "experts-host":
        return "device=%d" % core_b, [et or "host"] + ["device"] * len(core) + ["host"] * n
    if placement == "experts-disk":
        return "device=%d,host=0" % core_b, [et or "disk"] + ["device"] * len(core) + ["disk"] * n
    if placement == "mixed":
        a, b = n // 3, n // 3
        spec = "device=%d,host=%d" % (core_b + sum(ex[:a]), sum(ex[a:a + b]))
        return spec, [et or "disk"] + ["device"] * len(core) + ["device"] * a + ["host"] * b + ["disk"] * (n - a - b)
    if placement == "all-host":
        return "device=0", ["host"] * len(groups)
    if placement == "all-disk":
        return "device=0,host=0", ["disk"] * len(groups)
    raise AssertionError(placement)


def expert_cache_bytes(groups, cache):
    """--expert-cache: None (not given), 0 (the least: 2 x top_k slots),
    "half" the experts' bytes, "all" of them."""
    _, _, experts = split_groups(groups)
    if cache is None or cache == 0:
        return cache
    b = [g["bytes"] for g in experts]
    return {"half": sum(b[:len(b) // 2]), "all": sum(b)}[cache]


def placement_flags(ferry, d, placement, od, cache=None, group=1, prefetch=2, device=None, extra=()):
    """Flags that give the placement, checked against `ferry plan` (extra:
    flags that change the groups' bytes, such as --quantize)."""
    flags = ["--group-size", group, "--prefetch", prefetch] + (["--device", device] if device else []) + list(extra)
    plan0 = plan_json(ferry, d, *flags)
    spec, want = moe_budgets(plan0["groups"], placement)
    if spec is not None:
        flags += ["--max-memory-scope", "weights", "--max-memory", spec]
    c = expert_cache_bytes(plan0["groups"], cache)
    if c is not None:
        flags += ["--expert-cache", c]
    plan = plan_json(ferry, d, *flags)
    got = [g["tier"] for g in plan["groups"]]
    for i, g in enumerate(plan["groups"]):
        if g["bytes"] == 0:
            got[i] = want[i] = "-"
    assert got == want, "placement %s (%s): plan tiers %r, expected %r" % (placement, flags, got, want)
    if "disk" in got:
        flags += ["--offload-dir", od]
    return flags, plan


def workloads(vocab, seed):
    p5, p9, p13 = prompts_for(vocab, seed)
    return {
        "b3": ([p5, p9, p13], ()),
        "b1": ([p9], ()),
        # sampled tokens follow every decode step's logits more closely than greedy ones
        "sample": ([p5, p9, p13], ("--temperature", 1.0, "--seed", 5)),
        # chunked prefill: 3-token steps; compared with one-step prefill
        "chunk": ([p9, p13], ("--max-step-tokens", 3)),
    }


# (placement, group size, prefetch, expert cache, device, (split compute, copy delay us), workload,
#  --expert-prefetch: the next sparse layer's predicted experts fetched speculatively)
RUNS = [
    ("experts-host", 1, 2, None, None, None, "b3", False),
    ("experts-disk", 1, 2, 0, None, None, "b3", False),
    ("experts-disk", 1, 2, 0, None, None, "b1", True),
    ("experts-disk", 1, 2, "half", None, None, "sample", False),
    ("experts-disk", 1, 2, "all", None, None, "b3", True),
    ("mixed", 2, 1, 0, None, None, "b3", True),
    ("mixed", 1, 3, "half", None, None, "chunk", False),
    ("all-host", 2, 2, None, None, None, "sample", True),
    ("all-disk", 1, 1, 0, None, None, "b3", False),
    ("all-disk", 3, 2, "all", None, None, "chunk", True),
    ("experts-disk", 1, 2, 0, "cpu-split", ("thread", 300), "b3", False),
    ("experts-disk", 1, 2, 0, "cpu-split", ("thread", 300), "sample", True),
    ("experts-disk", 1, 2, "half", "cpu-split", ("inline", 100), "b1", False),
    ("mixed", 2, 1, "half", "cpu-split", ("inline", 0), "sample", False),
    ("mixed", 1, 2, 0, "cpu-split", ("thread", 0), "b1", True),
    ("all-disk", 1, 3, 0, "cpu-split", ("thread", 0), "b3", False),
    ("experts-host", 1, 2, "all", "cpu-split", ("inline", 200), "chunk", True),
]
PLACEMENT_MODELS = ["mix-f32", "q3-f32-tied", "mix-bf16-tied", "q3-bf16"]

_BASE = {}


def baseline(ferry, d, seed, wl, tmp):
    """The all-resident CPU run of workload wl (chunk: without
    --max-step-tokens)."""
    key = (str(d), wl)
    if key not in _BASE:
        prompts, extra = workloads(ref_vocab(d), seed)[wl]
        _BASE[key] = run(ferry, d, prompts, [] if wl == "chunk" else list(extra), tmp / ("base-%s.bin" % wl))
    return _BASE[key]


def ref_vocab(d):
    return int(st_util.read_config(d)["vocab_size"])


@pytest.mark.parametrize("name,placement,group,prefetch,cache,device,split,wl,xp", [
    pytest.param(name, *r, id="%s-%s-g%d-p%d-cache%s%s-%s%s" % (
        name, r[0], r[1], r[2], r[3], "-split" if r[4] else "", r[6], "-xp" if r[7] else ""))
    for name in PLACEMENT_MODELS for r in RUNS])
def test_placement_matches_resident(ferry, moe_models, tmp_path, monkeypatch, name, placement, group, prefetch,
                                    cache, device, split, wl, xp):
    d, spec = moe_model(moe_models, name)
    if split:
        monkeypatch.setenv("FERRY_SPLIT_COMPUTE", split[0])
        monkeypatch.setenv("FERRY_SPLIT_DELAY_US", str(split[1]))
    want_out, want_logits = baseline(ferry, d, spec["seed"], wl, tmp_path)
    flags, _ = placement_flags(ferry, d, placement, tmp_path / "od", cache, group, prefetch, device)
    if xp:
        flags.append("--expert-prefetch")
    prompts, extra = workloads(ref_vocab(d), spec["seed"])[wl]
    out, logits = run(ferry, d, prompts, flags + list(extra), tmp_path / "l.bin")
    what = "%s %s %s" % (name, " ".join(str(f) for f in flags), wl)
    assert out == want_out, "%s: tokens %r, all-resident %r" % (what, out, want_out)
    diff = float(np.max(np.abs(logits - want_logits)))
    assert diff <= SAME, "%s: max abs logit difference %.3g vs all-resident" % (what, diff)


def test_serve_mixed_steps(ferry, ferry_bin, moe_models, tmp_path):
    """`ferry serve` with the experts on disk and the least expert cache:
    concurrent requests of mixed lengths, whose prefill chunks and decode
    steps share steps, give each prompt's tokens of a resident `ferry
    generate` run alone; fetched bytes are the fetches times the experts'
    size. Then with a cache of every expert (on host): a request repeated
    is served from the slots, nothing fetched."""
    d, spec = moe_model(moe_models, "mix-f32")
    vocab = ref_vocab(d)
    reqs = [(prompt_ids(vocab, 3 + (i * 5) % 17, 360 + i), 4 + (i * 3) % 9) for i in range(8)]
    want = [run(ferry, d, [p], [], tmp_path / "one.bin", n_new=n)[0][0] for p, n in reqs]
    flags, plan = placement_flags(ferry, d, "experts-disk", tmp_path / "od", 0)
    one = split_groups(plan["groups"])[2][0]["bytes"]
    gen = serve(ferry_bin, d, "--batch", 4, "--max-step-tokens", 8, *flags, name="moe")
    srv = next(gen)
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda r: http_generate(srv, r[0], max_new_tokens=r[1]), reqs))
        m = metrics(srv)
    finally:
        next(gen, None)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, "request %d: served %r, generate %r" % (i, g, w)
    fetched = msum(m, "ferry_expert_uses_total", source="fetched")
    assert fetched > 0 and msum(m, "ferry_expert_uses_total", source="device") == 0
    assert msum(m, "ferry_expert_fetched_bytes_total", tier="disk") == fetched * one, m
    flags, _ = placement_flags(ferry, d, "experts-host", tmp_path / "od2", "all")
    gen = serve(ferry_bin, d, *flags, name="moe")
    srv = next(gen)
    try:
        p, n = reqs[7]
        assert http_generate(srv, p, max_new_tokens=n) == want[7]
        before = metrics(srv)
        assert http_generate(srv, p, max_new_tokens=n) == want[7]
        after = metrics(srv)
    finally:
        next(gen, None)
    for src in ("fetched", "cache"):
        assert msum(before, "ferry_expert_uses_total", source=src) > 0, before
    uses = {src: msum(after, "ferry_expert_uses_total", source=src) - msum(before, "ferry_expert_uses_total",
                                                                          source=src)
            for src in ("device", "cache", "fetched")}
    assert uses["cache"] > 0 and uses["fetched"] == 0 and uses["device"] == 0, uses
    assert msum(after, "ferry_expert_fetched_bytes_total") == msum(before, "ferry_expert_fetched_bytes_total")


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_experts_placement(ferry, moe_models, tmp_path, quant):
    """--quantize quantizes the experts too (their groups shrink); quantized
    experts on disk and host give the quantized all-resident run's outputs."""
    d, spec = moe_model(moe_models, "q3-f32-tied")
    q = ["--quantize", quant]
    plain = split_groups(plan_json(ferry, d)["groups"])[2][0]["bytes"]
    assert split_groups(plan_json(ferry, d, *q)["groups"])[2][0]["bytes"] < plain
    prompts, _ = workloads(ref_vocab(d), spec["seed"])["b3"]
    want_out, want_logits = run(ferry, d, prompts, q, tmp_path / "base.bin")
    for placement, cache in (("experts-disk", 0), ("mixed", "half")):
        flags, _ = placement_flags(ferry, d, placement, tmp_path / "od", cache, extra=q)
        out, logits = run(ferry, d, prompts, flags, tmp_path / "l.bin")
        assert out == want_out and float(np.max(np.abs(logits - want_logits))) <= SAME, flags


def test_export_from_disk(ferry, moe_models, ref, tmp_path):
    """`ferry export` of a sharded, tied bf16 MoE checkpoint whose experts
    live on disk writes every tensor back as it was; the reference reads
    the same model from it."""
    d, spec = moe_model(moe_models, "mix-bf16-tied")
    flags, _ = placement_flags(ferry, d, "all-disk", tmp_path / "od", 0)
    ferry.check("export", "--model", d, "--out", tmp_path / "ex", *flags)
    a, b = llama_ref.read_checkpoint(str(d)), llama_ref.read_checkpoint(str(tmp_path / "ex"))
    assert set(a) == set(b)
    bad = [n for n in a if not np.array_equal(a[n], b[n])]
    assert not bad, bad[:5]
    p = prompts_for(ref_vocab(d), 370, (7,))[0]
    assert np.array_equal(llama_ref.last_logits(ref(d), p), llama_ref.last_logits(ref(tmp_path / "ex"), p))


# --------------------------------------------------------------------------
# ferry plan
# --------------------------------------------------------------------------

@pytest.mark.slow
def test_plan_expert_groups(ferry, moe_models, work):
    """Each expert of each sparse layer is a group of its own after the
    head; budgets place the layers and head first, then the experts in
    order, then the embedding (moe_budgets); experts off the device get
    expert slots: what --expert-cache asks for, at least 2 x top_k, at most
    the experts off the device; disk reads on cpu-split land in as many
    bounce buffers as reads in flight."""
    for name in PLACEMENT_MODELS:
        d, spec = moe_model(moe_models, name)
        shape = moe_util.shape_of(st_util.read_config(d))
        base = plan_json(ferry, d)
        embed, core, experts = split_groups(base["groups"])
        assert [(g["name"], g["first_layer"], g["n_layers"], g["expert"]) for g in experts] == [
            ("layer %d expert %d" % (l, e), l, 1, e) for l in shape["sparse"] for e in range(shape["experts"])]
        assert all(g["bytes"] > 0 and g["bytes"] % 4096 == 0 for g in experts)
        assert len({g["bytes"] for g in experts}) == 1  # experts are alike
        assert [g["name"] for g in core[:-1]] == ["layers %d-%d" % (l, l) for l in range(shape_layers(d))]
        assert base["tier_bytes"] == {t: sum(g["bytes"] for g in base["groups"] if g["tier"] == t)
                                      for t in ("device", "host", "disk")}
        w = base["working"]
        assert (w["expert_slots"], w["expert_slots_bytes"]) == (0, 0)  # all resident: no slots
        # the text form: a layer's experts on one line
        text = ferry.check("plan", "--model", d, "--max-memory-scope", "weights", "--max-memory", moe_budgets(base["groups"], "mixed")[0],
                           "--offload-dir", work / "od").stdout.decode()
        for l in shape["sparse"]:
            assert "layer %d experts" % l in text, text
        assert "expert slots" in text, text
        least = 2 * shape["top_k"]  # PLAN_EXPERT_MIN_SLOTS x top_k
        for device in (None, "cpu-split"):
            for placement in ("experts-host", "experts-disk", "mixed", "all-disk"):
                for cache in (None, 0, "half", "all"):
                    flags, plan = placement_flags(ferry, d, placement, work / "od", cache, device=device)
                    w = plan["working"]
                    off = [g for g in split_groups(plan["groups"])[2] if g["tier"] != "device"]
                    assert off
                    what = "%s %s cache %s: %r" % (device, placement, cache, w)
                    assert w["expert_slot_bytes"] == max(g["bytes"] for g in off), what
                    c = expert_cache_bytes(plan["groups"], cache) or 0
                    assert w["expert_slots"] == min(max(least, c // w["expert_slot_bytes"]), len(off)), what
                    assert w["expert_slots_bytes"] == w["expert_slots"] * w["expert_slot_bytes"], what
                    disk = [g["bytes"] for g in off if g["tier"] == "disk"]
                    reads = min(16, w["expert_slots"])  # PLAN_EXPERT_READS in flight, at most the slots
                    bounce = reads * max(disk) if device and disk else 0
                    assert w["expert_bounce_bytes"] == bounce, what
    assert not (work / "od").exists()  # planning writes nothing


def shape_layers(d):
    return int(st_util.read_config(d)["num_hidden_layers"])
