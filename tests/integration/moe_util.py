"""Small random mixture-of-experts checkpoints (MixtralForCausalLM,
Qwen3MoeForCausalLM) written from Python, for the cases `ferry mkmodel` does
not make: exact routing ties, routing steered to chosen experts, Qwen3-MoE
dense layers (decoder_sparse_step, mlp_only_layers), configs that leave
fields to their defaults.

A checkpoint is made in two steps so that a test can edit the tensors in
between: moe_config() + random_tensors() give the config dict and an ordered
{name: float32 array}; write_checkpoint() writes them (st_util's writer: F32,
F16 or BF16, one file or shards). random_moe_checkpoint() does all three.

Steering (steer()): residual dimension 0 is made the same constant for every
token in every layer - embedding column 0 is C, and every matrix that writes
into the residual (o_proj, the dense and expert down projections) has row 0
zero - so that after post_attention_layernorm h[0] > 0 for every token.
Router column 0 then acts as a per-expert bias: pref[e] * strength * h[0].
Rows of experts given the same `share` key get the same values in every
other column, so their logits differ exactly by their preference terms (an
exact tie where the preferences are equal, for any input).
"""

import os
from collections import OrderedDict

import numpy as np

import st_util

ARCHS = {"mixtral": "MixtralForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}
MODEL_TYPES = {"mixtral": "mixtral", "qwen3moe": "qwen3_moe"}


def moe_config(arch, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=None, intermediate=48,
               moe_intermediate=24, experts=4, top_k=2, vocab=64, tied=False, norm_topk_prob=None,
               decoder_sparse_step=None, mlp_only_layers=None, sliding_window=None, attention_bias=None,
               rope_theta=10000.0, omit=()):
    """config.json for a small model. Mixtral's experts are of
    intermediate_size (moe_intermediate is ignored); Qwen3-MoE's of
    moe_intermediate_size, its dense layers of intermediate_size. Keys in `omit` are
    left out (their transformers defaults apply); None values are left out
    too."""
    cfg = OrderedDict(
        architectures=[ARCHS[arch]], model_type=MODEL_TYPES[arch], hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=rope_theta, hidden_act="silu",
        tie_word_embeddings=tied, max_position_embeddings=512, torch_dtype="float32",
        num_experts_per_tok=top_k, head_dim=head_dim,
    )
    if arch == "mixtral":
        cfg["intermediate_size"] = intermediate
        cfg["num_local_experts"] = experts
        cfg["sliding_window"] = sliding_window
        cfg["norm_topk_prob"] = norm_topk_prob  # ignored by Mixtral: it always renormalizes
    else:
        cfg["intermediate_size"] = intermediate
        cfg["moe_intermediate_size"] = moe_intermediate
        cfg["num_experts"] = experts
        cfg["norm_topk_prob"] = norm_topk_prob
        cfg["decoder_sparse_step"] = decoder_sparse_step
        cfg["mlp_only_layers"] = mlp_only_layers
        cfg["attention_bias"] = attention_bias
    for k in list(cfg):
        if cfg[k] is None or k in omit:
            del cfg[k]
    return cfg


def _get(cfg, key, default):
    v = cfg.get(key)
    return default if v is None else v


def shape_of(cfg):
    """The model's shape as transformers reads it (defaults as
    MixtralConfig / Qwen3MoeConfig, written out here independently of the
    reference): dict of hidden, heads, kv_heads, head_dim, experts, top_k,
    expert_hidden, dense_hidden, sparse (list of layers)."""
    arch = cfg["architectures"][0]
    mix = arch == "MixtralForCausalLM"
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    n_layers = int(cfg["num_hidden_layers"])
    s = dict(hidden=hidden, heads=heads, kv_heads=int(_get(cfg, "num_key_value_heads", 8 if mix else 4)),
             head_dim=int(_get(cfg, "head_dim", hidden // heads)))
    if mix:
        s.update(experts=int(_get(cfg, "num_local_experts", 8)), top_k=int(_get(cfg, "num_experts_per_tok", 2)),
                 expert_hidden=int(_get(cfg, "intermediate_size", 14336)), dense_hidden=None,
                 sparse=list(range(n_layers)))
    else:
        experts = int(_get(cfg, "num_experts", 128))
        step = int(_get(cfg, "decoder_sparse_step", 1))
        only = set(_get(cfg, "mlp_only_layers", []))
        s.update(experts=experts, top_k=int(_get(cfg, "num_experts_per_tok", 8)),
                 expert_hidden=int(_get(cfg, "moe_intermediate_size", 768)),
                 dense_hidden=int(_get(cfg, "intermediate_size", 6144)),
                 sparse=[l for l in range(n_layers) if l not in only and experts > 0 and (l + 1) % step == 0])
    return s


def router_name(cfg, layer):
    if cfg["architectures"][0] == "MixtralForCausalLM":
        return "model.layers.%d.block_sparse_moe.gate.weight" % layer
    return "model.layers.%d.mlp.gate.weight" % layer


def expert_names(cfg, layer, e):
    """{gate, up, down: checkpoint name} of expert e of a sparse layer."""
    if cfg["architectures"][0] == "MixtralForCausalLM":
        p = "model.layers.%d.block_sparse_moe.experts.%d." % (layer, e)
        return {"gate": p + "w1.weight", "up": p + "w3.weight", "down": p + "w2.weight"}
    p = "model.layers.%d.mlp.experts.%d." % (layer, e)
    return {k: p + "%s_proj.weight" % k for k in ("gate", "up", "down")}


def random_tensors(cfg, seed=0, scale=0.2):
    """{name: float32 array} for every tensor the config needs, in execution
    order (embedding; per layer attention, norms, router or MLP, experts; head)."""
    rng = np.random.default_rng(seed)
    s = shape_of(cfg)
    H, hd = s["hidden"], s["head_dim"]
    V, L = int(cfg["vocab_size"]), int(cfg["num_hidden_layers"])
    qwen = cfg["architectures"][0] == "Qwen3MoeForCausalLM"
    bias = qwen and bool(cfg.get("attention_bias"))

    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    t = OrderedDict()
    t["model.embed_tokens.weight"] = r(V, H)
    for i in range(L):
        p = "model.layers.%d." % i
        st_util.attention_tensors(t, p, r, norm_w, H, s["heads"], s["kv_heads"], hd, qkv_bias=bias, o_bias=bias,
                                  qk_norm=qwen)
        t[p + "post_attention_layernorm.weight"] = norm_w(H)
        if i in s["sparse"]:
            # router rows a little larger than the rest: routing that is not
            # near-uniform, so f32 and f64 agree on the top-k set
            t[router_name(cfg, i)] = r(s["experts"], H) * 3
            F = s["expert_hidden"]
            for e in range(s["experts"]):
                n = expert_names(cfg, i, e)
                t[n["gate"]] = r(F, H)
                t[n["up"]] = r(F, H)
                t[n["down"]] = r(H, F)
        else:
            F = s["dense_hidden"]
            t[p + "mlp.gate_proj.weight"] = r(F, H)
            t[p + "mlp.up_proj.weight"] = r(F, H)
            t[p + "mlp.down_proj.weight"] = r(H, F)
    t["model.norm.weight"] = norm_w(H)
    if not cfg.get("tie_word_embeddings"):
        t["lm_head.weight"] = r(V, H)
    return t


def steer(cfg, t, prefs, strength=3.0, share=None, const=4.0, layers=None):
    """Make routing follow prefs (module doc). prefs: [n_experts] numbers,
    or {layer: [n_experts]}; share: [n_experts] keys (None: no sharing) -
    experts with the same key get the same router row apart from column 0.
    layers: the sparse layers to steer (default all)."""
    s = shape_of(cfg)
    t["model.embed_tokens.weight"][:, 0] = const
    for name in t:
        if name.endswith(("o_proj.weight", "down_proj.weight", "w2.weight")):
            t[name][0, :] = 0.0
        if name.endswith("o_proj.bias"):
            t[name][0] = 0.0
    if "lm_head.weight" in t:
        t["lm_head.weight"][:, 0] = 0.0  # the constant would favour some tokens (tied: all alike)
    for layer in s["sparse"] if layers is None else layers:
        p = prefs[layer] if isinstance(prefs, dict) else prefs
        R = t[router_name(cfg, layer)]
        if share is not None:
            first = {}
            for e, key in enumerate(share):
                if key in first:
                    R[e, 1:] = R[first[key], 1:]
                else:
                    first[key] = e
        R[:, 0] = np.asarray(p, dtype=np.float32) * np.float32(strength)
    return t


def write_checkpoint(model_dir, cfg, t, dtype="F32", shards=1):
    """Write config.json and the tensors (st_util's safetensors writer)."""
    os.makedirs(model_dir, exist_ok=True)
    cfg = OrderedDict(cfg)
    cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    st_util.write_config(model_dir, cfg)
    names = list(t)
    if shards <= 1:
        st_util.write(os.path.join(model_dir, "model.safetensors"), t, dtype=dtype, metadata={"format": "pt"})
        return cfg
    weight_map = OrderedDict()
    total = 0
    for k in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        part = OrderedDict((n, t[n]) for n in names[k::shards])
        st_util.write(os.path.join(model_dir, fname), part, dtype=dtype, metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += t[n].size * st_util.DTYPE_SIZE[dtype]
    st_util.write_index(model_dir, OrderedDict(metadata={"total_size": total}, weight_map=weight_map))
    return cfg


def random_moe_checkpoint(model_dir, arch="mixtral", dtype="F32", seed=0, shards=1, edit=None, **kw):
    """moe_config(arch, **kw), random_tensors, edit(cfg, tensors) if given,
    write_checkpoint. Returns the config dict."""
    cfg = moe_config(arch, **kw)
    t = random_tensors(cfg, seed)
    if edit is not None:
        edit(cfg, t)
    return write_checkpoint(model_dir, cfg, t, dtype=dtype, shards=shards)
