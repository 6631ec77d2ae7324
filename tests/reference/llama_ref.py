#!/usr/bin/python3
"""Independent float64 PyTorch reference for Hugging Face Llama-family checkpoints.

Implements the Hugging Face `transformers` semantics of LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and the mixtures of
experts MixtralForCausalLM and Qwen3MoeForCausalLM directly from the
checkpoint (config.json + model.safetensors, or a sharded
model.safetensors.index.json), without `transformers` or `safetensors`:

  * RMSNorm: x * rsqrt(mean(x^2) + eps) * weight
  * RoPE in the rotate_half convention, positions from 0; rope_scaling (or
    v5's rope_parameters) of type default, linear, llama3 or yarn, its
    inverse frequencies and attention factor computed as transformers'
    modeling_rope_utils.py does (float32 tensors, Python floats)
  * GQA: query head h uses kv head h // (n_heads / n_kv_heads)
  * causal softmax attention scaled by 1/sqrt(head_dim); Mistral sliding window
  * SwiGLU MLP: down(silu(gate(x)) * up(x))
  * Qwen2 q/k/v biases; Llama/Qwen3 q/k/v/o biases when attention_bias is true
  * Qwen3 per-head q_norm / k_norm before RoPE
  * tied or separate lm_head
  * mixtures of experts, as transformers' MixtralSparseMoeBlock and
    Qwen3MoeSparseMoeBlock (models/mixtral/modeling_mixtral.py,
    models/qwen3_moe/modeling_qwen3_moe.py): router logits = gate(h) over
    all experts, softmax over all of them, the top_k most probable experts,
    their probabilities divided by their sum (Mixtral always, Qwen3-MoE
    where norm_topk_prob), each chosen expert's SwiGLU output
    down(silu(gate(h)) * up(h)) times its weight, summed over the choices.
    Mixtral: every layer sparse, `block_sparse_moe.gate` and
    `block_sparse_moe.experts.E.w1/w3/w2` (gate/up/down), expert size
    intermediate_size, defaults num_local_experts 8, num_experts_per_tok 2,
    rms_norm_eps 1e-5, rope_theta 1e6, num_key_value_heads 8, sliding_window
    as Mistral's. Qwen3-MoE: layer l sparse iff l is not in mlp_only_layers
    and num_experts > 0 and (l + 1) % decoder_sparse_step == 0 (else a dense
    `mlp.gate_proj/up_proj/down_proj` of intermediate_size); `mlp.gate`,
    `mlp.experts.E.gate_proj/up_proj/down_proj` of moe_intermediate_size;
    defaults num_experts 128, num_experts_per_tok 8, moe_intermediate_size
    768, intermediate_size 6144, decoder_sparse_step 1, norm_topk_prob false,
    num_key_value_heads 4; q_norm/k_norm as Qwen3, but head_dim, when absent,
    is hidden_size / num_attention_heads (Qwen3MoeConfig has no head_dim
    default, unlike Qwen3Config's 128). Expert tensors' shapes are checked
    against the config, as transformers' loading would. Read from
    github.com/huggingface/transformers src/transformers/models/
    {mixtral/modeling_mixtral.py, mixtral/configuration_mixtral.py,
    qwen3_moe/modeling_qwen3_moe.py, qwen3_moe/configuration_qwen3_moe.py}.

    Top-k ties: the experts are chosen by a stable descending sort of the
    probabilities, so equal probabilities go to the lower expert index -
    ferry's rule (engine/moe.h). torch.topk leaves the order of equal values
    unspecified: on Debian's torch 1.13, torch.topk(torch.full((8,), 0.125), 2)
    gives indices [6, 5]. So where a tie straddles the top-k boundary,
    transformers' choice is an accident of the kernel; the reference states
    the rule instead (select_experts). Ties inside the top-k set give the same
    answer under any rule.

Every weight is upcast to float64 and every computation is done in float64,
so the result is the "exact" answer for the weights as stored.
Generation is greedy by full recompute (no KV cache), argmax = first maximum.

Usage:
  /usr/bin/python3 tests/reference/llama_ref.py --model DIR --prompt-ids 1,2,3 \
      --max-new-tokens N [--dump-logits FILE]
prints {"output_ids": [...]} (generated ids only). Several prompts may be given
separated by ';' in which case output_ids is a list of lists and --dump-logits
writes the prompts' last-position logits one after the other.

Importable API: load_model(dir), forward(model, ids, trace=None),
last_logits(model, ids), greedy(model, ids, n), forward_naive(model, ids) (a
slow, loop-based second formulation used to self-check this file),
rope_parameters(cfg, head_dim) (the inverse frequencies and attention factor;
a model's are m.inv_freq and m.attention_factor, which a test may swap for
plain RoPE's), select_experts(probs, k, norm) (the routing rule), and for a
mixture of experts m.n_experts, m.top_k, m.norm_topk, m.sparse (the sparse
layers); forward(..., trace=list) appends one dict per sparse layer: layer,
probs [T, n_experts], experts [T, top_k] and weights [T, top_k] (numpy).
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

SUPPORTED_ARCHS = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen3MoeForCausalLM",
)

# Config defaults where an architecture's differ from Llama's (the
# transformers config classes: MixtralConfig, Qwen3MoeConfig).
_ARCH_DEFAULTS = {
    "MixtralForCausalLM": dict(rms_norm_eps=1e-5, rope_theta=1e6, num_key_value_heads=8,
                               num_local_experts=8, num_experts_per_tok=2, intermediate_size=14336),
    "Qwen3MoeForCausalLM": dict(rms_norm_eps=1e-6, rope_theta=10000.0, num_key_value_heads=4,
                                num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                intermediate_size=6144, decoder_sparse_step=1, norm_topk_prob=False),
}

_ELEM_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


# --------------------------------------------------------------------------
# safetensors reading (pure numpy; no `safetensors` package)
# --------------------------------------------------------------------------

def _decode(buf, dtype, shape):
    """Raw little-endian bytes (numpy uint8 array) -> float64 ndarray."""
    if dtype == "F64":
        arr = buf.view("<f8")
    elif dtype == "F32":
        arr = buf.view("<f4")
    elif dtype == "F16":
        arr = buf.view("<f2")
    elif dtype == "BF16":
        arr = (buf.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        raise ValueError("unsupported dtype %r" % (dtype,))
    return arr.astype(np.float64).reshape(shape)


def read_safetensors(path):
    """Return {name: float64 ndarray} for every tensor of one .safetensors file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise ValueError("%s: shorter than 8 bytes" % path)
        (hlen,) = struct.unpack("<Q", raw_len)
        if 8 + hlen > size:
            raise ValueError("%s: header length past end of file" % path)
        header = json.loads(f.read(hlen).decode("utf-8"))
    data_start = 8 + hlen
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = [int(d) for d in info["shape"]]
        start, end = (int(x) for x in info["data_offsets"])
        if dtype not in _ELEM_SIZE:
            raise ValueError("%s: tensor %s has unsupported dtype %s" % (path, name, dtype))
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - start != n * _ELEM_SIZE[dtype] or data_start + end > size:
            raise ValueError("%s: tensor %s has inconsistent offsets" % (path, name))
        buf = np.array(mm[data_start + start:data_start + end])
        out[name] = _decode(buf, dtype, shape)
    del mm
    return out


def read_checkpoint(model_dir):
    """All tensors of a checkpoint directory (single file or sharded)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for fname in sorted(set(weight_map.values())):
            part = read_safetensors(os.path.join(model_dir, fname))
            for name, arr in part.items():
                if weight_map.get(name) == fname:
                    tensors[name] = arr
        missing = [n for n in weight_map if n not in tensors]
        if missing:
            raise ValueError("index names tensors not found in their shard: %s" % missing[:5])
        return tensors
    return read_safetensors(single)


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------

class Model:
    pass


def _cfg_get(cfg, key, default):
    v = cfg.get(key)
    return default if v is None else v


def _arch_of(cfg):
    archs = cfg.get("architectures") or []
    return archs[0] if archs else None


def _arch_default(cfg, key, default):
    """cfg[key], else the architecture's default (_ARCH_DEFAULTS), else default."""
    return _cfg_get(cfg, key, _ARCH_DEFAULTS.get(_arch_of(cfg), {}).get(key, default))


def sparse_layers(cfg):
    """The layers whose MLP is a mixture of experts (transformers' decoder
    layer constructors): Mixtral all of them; Qwen3-MoE layer l iff l not in
    mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0."""
    arch = _arch_of(cfg)
    n = int(cfg["num_hidden_layers"])
    if arch == "MixtralForCausalLM":
        return list(range(n))
    if arch == "Qwen3MoeForCausalLM":
        n_experts = int(_arch_default(cfg, "num_experts", None))
        step = int(_arch_default(cfg, "decoder_sparse_step", None))
        only = set(int(x) for x in (cfg.get("mlp_only_layers") or []))
        return [l for l in range(n) if l not in only and n_experts > 0 and (l + 1) % step == 0]
    return []


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = _arch_of(cfg)
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError("unsupported architecture %r" % (arch,))
    act = _cfg_get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError("hidden_act %r" % (act,))
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM") and cfg.get("use_sliding_window"):
        raise NotImplementedError("Qwen use_sliding_window")

    m = Model()
    m.cfg = cfg
    m.arch = arch
    m.hidden = int(cfg["hidden_size"])
    m.n_layers = int(cfg["num_hidden_layers"])
    m.n_heads = int(cfg["num_attention_heads"])
    m.n_kv = int(_arch_default(cfg, "num_key_value_heads", m.n_heads))
    if cfg.get("head_dim") is not None:
        m.head_dim = int(cfg["head_dim"])
    elif arch == "Qwen3ForCausalLM":
        m.head_dim = 128  # Qwen3Config's default when the field is absent
    else:
        m.head_dim = m.hidden // m.n_heads  # Qwen3-MoE included: no head_dim default
    if m.n_heads % m.n_kv != 0:
        raise ValueError("num_attention_heads not a multiple of num_key_value_heads")
    m.eps = float(_arch_default(cfg, "rms_norm_eps", 1e-6))
    m.theta = rope_theta(cfg)
    m.inv_freq, m.attention_factor = rope_parameters(cfg, m.head_dim)
    m.vocab = int(cfg["vocab_size"])
    m.tied = bool(_cfg_get(cfg, "tie_word_embeddings", False))
    sw = cfg.get("sliding_window")
    m.sliding_window = int(sw) if (arch in ("MistralForCausalLM", "MixtralForCausalLM") and isinstance(sw, int)
                                    and not isinstance(sw, bool)) else None
    attention_bias = bool(_cfg_get(cfg, "attention_bias", False))
    if arch == "Qwen2ForCausalLM":
        m.qkv_bias, m.o_bias = True, False
    elif arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        m.qkv_bias = m.o_bias = attention_bias
    else:
        m.qkv_bias = m.o_bias = False
    m.mlp_bias = bool(_cfg_get(cfg, "mlp_bias", False)) and arch == "LlamaForCausalLM"
    m.qk_norm = arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
    m.sparse = sparse_layers(cfg)
    if arch == "MixtralForCausalLM":
        m.n_experts = int(_arch_default(cfg, "num_local_experts", None))
        m.moe_hidden = int(_arch_default(cfg, "intermediate_size", None))
        m.norm_topk = True  # MixtralSparseMoeBlock always renormalizes
    elif arch == "Qwen3MoeForCausalLM":
        m.n_experts = int(_arch_default(cfg, "num_experts", None))
        m.moe_hidden = int(_arch_default(cfg, "moe_intermediate_size", None))
        m.norm_topk = bool(_arch_default(cfg, "norm_topk_prob", None))
    else:
        m.n_experts = m.moe_hidden = 0
        m.norm_topk = False
    m.top_k = int(_arch_default(cfg, "num_experts_per_tok", 0)) if m.sparse else 0
    if m.sparse and not 0 < m.top_k <= m.n_experts:
        raise ValueError("num_experts_per_tok %d with %d experts" % (m.top_k, m.n_experts))

    raw = read_checkpoint(model_dir)

    def w(name, shape=None):
        if name not in raw:
            raise KeyError("checkpoint lacks tensor %s" % name)
        if shape is not None and list(raw[name].shape) != list(shape):
            raise ValueError("tensor %s has shape %s, the config says %s" % (name, list(raw[name].shape), list(shape)))
        return torch.from_numpy(raw[name])

    m.embed = w("model.embed_tokens.weight")
    m.layers = []
    for i in range(m.n_layers):
        p = "model.layers.%d." % i
        L = {
            "in_norm": w(p + "input_layernorm.weight"),
            "post_norm": w(p + "post_attention_layernorm.weight"),
        }
        for k in ("q", "k", "v", "o"):
            L[k] = w(p + "self_attn.%s_proj.weight" % k)
            has_b = m.qkv_bias if k != "o" else m.o_bias
            L[k + "_b"] = w(p + "self_attn.%s_proj.bias" % k) if has_b else None
        if i in m.sparse:
            _load_experts(m, L, p, w)
        else:
            dense = None
            if arch == "Qwen3MoeForCausalLM":
                dense = int(_arch_default(cfg, "intermediate_size", None))
            for k in ("gate", "up", "down"):
                shape = None if dense is None else ((m.hidden, dense) if k == "down" else (dense, m.hidden))
                L[k] = w(p + "mlp.%s_proj.weight" % k, shape)
                L[k + "_b"] = w(p + "mlp.%s_proj.bias" % k) if m.mlp_bias else None
        if m.qk_norm:
            L["q_norm"] = w(p + "self_attn.q_norm.weight")
            L["k_norm"] = w(p + "self_attn.k_norm.weight")
        m.layers.append(L)
    m.norm = w("model.norm.weight")
    m.lm_head = m.embed if m.tied else w("lm_head.weight")
    return m


# Checkpoint names of a sparse layer's router and experts: (router, expert
# prefix, gate, up, down) under "model.layers.L.".
_MOE_NAMES = {
    "MixtralForCausalLM": ("block_sparse_moe.gate.weight", "block_sparse_moe.experts.%d.", "w1", "w3", "w2"),
    "Qwen3MoeForCausalLM": ("mlp.gate.weight", "mlp.experts.%d.", "gate_proj", "up_proj", "down_proj"),
}


def _load_experts(m, L, p, w):
    router, expert, gate, up, down = _MOE_NAMES[m.arch]
    L["router"] = w(p + router, (m.n_experts, m.hidden))
    L["experts"] = []
    for e in range(m.n_experts):
        q = p + expert % e
        L["experts"].append({
            "gate": w(q + gate + ".weight", (m.moe_hidden, m.hidden)),
            "up": w(q + up + ".weight", (m.moe_hidden, m.hidden)),
            "down": w(q + down + ".weight", (m.hidden, m.moe_hidden)),
        })


def rms_norm(x, weight, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def _linear(x, weight, bias):
    y = x @ weight.T
    return y if bias is None else y + bias


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# --------------------------------------------------------------------------
# RoPE: transformers' modeling_rope_utils.py (ROPE_INIT_FUNCTIONS), written
# from its source. Tensors are float32 as there; Python numbers stay Python
# floats (doubles) until torch meets them.
# --------------------------------------------------------------------------

def rope_theta(cfg):
    """Top-level rope_theta, else v5's rope_parameters["rope_theta"], else the
    architecture's default (Mixtral 1e6), else 1e4."""
    if cfg.get("rope_theta") is not None:
        return float(cfg["rope_theta"])
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and rp.get("rope_theta") is not None:
        return float(rp["rope_theta"])
    return float(_ARCH_DEFAULTS.get(_arch_of(cfg), {}).get("rope_theta", 10000.0))


def rope_scaling_dict(cfg):
    """transformers v5: `rope_scaling or rope_parameters`; v4 reads rope_scaling."""
    rs = cfg.get("rope_scaling")
    if rs:
        return rs
    rp = cfg.get("rope_parameters")
    return rp if isinstance(rp, dict) else None


def _default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(rs, base, dim):
    inv_freq = _default_inv_freq(base, dim)
    factor = rs["factor"]
    low_freq_factor = rs["low_freq_factor"]
    high_freq_factor = rs["high_freq_factor"]
    old_context_len = rs["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama), 1.0


def _yarn(rs, base, dim, max_position_embeddings):
    factor = rs["factor"]
    attention_factor = rs.get("attention_factor")
    mscale = rs.get("mscale")
    mscale_all_dim = rs.get("mscale_all_dim")
    original_max = rs.get("original_max_position_embeddings") or max_position_embeddings

    def get_mscale(scale, mscale=1):
        if scale <= 1:
            return 1.0
        return 0.1 * mscale * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq, attention_factor


def rope_parameters(cfg, head_dim):
    """(inv_freq float32 [head_dim/2], attention_factor) for a config.json dict."""
    base = rope_theta(cfg)
    rs = rope_scaling_dict(cfg)
    rope_type = "default" if rs is None else rs.get("rope_type", rs.get("type"))
    if rope_type is None and rs is cfg.get("rope_parameters"):
        rope_type = "default"
    if rope_type == "default":
        return _default_inv_freq(base, head_dim), 1.0
    if rope_type == "linear":
        return _default_inv_freq(base, head_dim) / rs["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(rs, base, head_dim)
    if rope_type == "yarn":
        return _yarn(rs, base, head_dim, cfg.get("max_position_embeddings"))
    raise NotImplementedError("rope type %r is not implemented by the reference" % (rope_type,))


def rope_cos_sin(positions, head_dim, theta, inv_freq=None, attention_factor=1.0):
    """As transformers' rotary embedding computes them: inv_freq and the
    angles in float32 (what users of transformers get, which differs from
    exact angles by up to ~1e-3 at 100k positions); cos/sin are then taken in
    float64 of those float32 angles, times the attention factor. inv_freq
    defaults to plain RoPE's for theta."""
    if inv_freq is None:
        inv_freq = _default_inv_freq(theta, head_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).to(torch.float64)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def apply_rope(x, cos, sin):
    """x: [..., T, head_dim]; cos/sin: [T, head_dim]."""
    return x * cos + rotate_half(x) * sin


def attention_mask(T, sliding_window):
    p = torch.arange(T)[:, None]
    k = torch.arange(T)[None, :]
    allowed = k <= p
    if sliding_window is not None:
        allowed = allowed & ((p - k) < sliding_window)
    return allowed


def select_experts(probs, k, norm):
    """The routing rule: probs [T, E] -> (experts [T, k] long, weights [T, k]).
    Each token's k most probable experts by a stable descending sort (equal
    probabilities: the lower index first; torch.topk leaves that order
    unspecified), in that order; weights their probabilities, divided by
    their sum where norm."""
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = torch.gather(probs, 1, order)
    if norm:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return order, weights


def _swiglu(h, gate, up, down):
    return (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T


def moe_block(m, L, h, trace=None, layer=None):
    """A sparse layer's MLP on h [T, hidden], as MixtralSparseMoeBlock /
    Qwen3MoeSparseMoeBlock: each expert on the tokens routed to it, its
    output times the routing weight, index_add_ into zeros."""
    probs = torch.softmax(h @ L["router"].T, dim=-1)
    experts, weights = select_experts(probs, m.top_k, m.norm_topk)
    out = torch.zeros_like(h)
    for e in range(m.n_experts):
        tok, j = torch.where(experts == e)
        if tok.numel() == 0:
            continue
        E = L["experts"][e]
        y = _swiglu(h[tok], E["gate"], E["up"], E["down"]) * weights[tok, j, None]
        out.index_add_(0, tok, y)
    if trace is not None:
        trace.append({"layer": layer, "probs": probs.numpy().copy(), "experts": experts.numpy().copy(),
                      "weights": weights.numpy().copy()})
    return out


def forward(m, ids, trace=None):
    """Logits [T, vocab] (float64 torch tensor) for every position of ids.
    trace: a list to append each sparse layer's routing to (module doc)."""
    ids = torch.as_tensor(list(ids), dtype=torch.long)
    if ids.numel() == 0:
        raise ValueError("empty prompt")
    if int(ids.min()) < 0 or int(ids.max()) >= m.vocab:
        raise ValueError("token id out of range")
    T = ids.shape[0]
    nh, nkv, hd = m.n_heads, m.n_kv, m.head_dim
    group = nh // nkv
    cos, sin = rope_cos_sin(torch.arange(T), hd, m.theta, m.inv_freq, m.attention_factor)
    allowed = attention_mask(T, m.sliding_window)
    scale = 1.0 / math.sqrt(hd)

    x = m.embed[ids]
    for li, L in enumerate(m.layers):
        h = rms_norm(x, L["in_norm"], m.eps)
        q = _linear(h, L["q"], L["q_b"]).view(T, nh, hd).transpose(0, 1)
        k = _linear(h, L["k"], L["k_b"]).view(T, nkv, hd).transpose(0, 1)
        v = _linear(h, L["v"], L["v_b"]).view(T, nkv, hd).transpose(0, 1)
        if m.qk_norm:
            q = rms_norm(q, L["q_norm"], m.eps)
            k = rms_norm(k, L["k_norm"], m.eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(1, 2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        attn = (probs @ v).transpose(0, 1).reshape(T, nh * hd)
        x = x + _linear(attn, L["o"], L["o_b"])
        h = rms_norm(x, L["post_norm"], m.eps)
        if "router" in L:
            x = x + moe_block(m, L, h, trace, li)
            continue
        g = _linear(h, L["gate"], L["gate_b"])
        u = _linear(h, L["up"], L["up_b"])
        x = x + _linear(torch.nn.functional.silu(g) * u, L["down"], L["down_b"])
    x = rms_norm(x, m.norm, m.eps)
    return x @ m.lm_head.T


def last_logits(m, ids):
    """Logits of the last position as a float64 numpy array [vocab]."""
    return forward(m, ids)[-1].numpy().copy()


def greedy(m, ids, n):
    """n greedy tokens by full recompute; returns the generated ids only."""
    seq = list(int(i) for i in ids)
    out = []
    for _ in range(int(n)):
        logits = last_logits(m, seq)
        tok = int(np.argmax(logits))  # first maximum
        out.append(tok)
        seq.append(tok)
    return out


# --------------------------------------------------------------------------
# second, loop-based formulation (numpy, per position / per head), used only
# to self-check forward(): pairwise-rotation RoPE, explicit kv-head index.
# --------------------------------------------------------------------------

def forward_naive(m, ids):
    ids = [int(i) for i in ids]
    T = len(ids)
    nh, nkv, hd = m.n_heads, m.n_kv, m.head_dim
    half = hd // 2

    def np_(t):
        return None if t is None else t.numpy()

    def rms(v, w):
        return v / math.sqrt(float(np.dot(v, v)) / v.shape[0] + m.eps) * w

    def lin(v, W, b):
        y = W.dot(v)
        return y if b is None else y + b

    def rot(vec, pos):
        outv = np.empty_like(vec)
        for j in range(half):
            # float32 frequency and angle, as transformers computes them
            ang = float(np.float32(pos) * np.float32(m.inv_freq[j].item()))
            c, s = m.attention_factor * math.cos(ang), m.attention_factor * math.sin(ang)
            a, b = vec[j], vec[j + half]
            outv[j] = a * c - b * s
            outv[j + half] = b * c + a * s
        return outv

    def swiglu(h, W):
        g = W["gate"].dot(h)
        return W["down"].dot(g / (1.0 + np.exp(-g)) * W["up"].dot(h))

    def route(h, Ln):
        """One token: softmax over all experts, the top_k by (-p, index)."""
        logits = Ln["router"].dot(h)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = sorted(range(m.n_experts), key=lambda e: (-p[e], e))[:m.top_k]
        total = sum(p[e] for e in chosen) if m.norm_topk else 1.0
        return [(e, p[e] / total) for e in chosen]

    E = np_(m.embed)
    xs = [E[t].copy() for t in ids]
    for L in m.layers:
        Ln = {k: np_(v) for k, v in L.items() if k != "experts"}
        if "experts" in L:
            Ln["experts"] = [{k: v.numpy() for k, v in ex.items()} for ex in L["experts"]]
        qs, ks, vs = [], [], []
        for pos in range(T):
            h = rms(xs[pos], Ln["in_norm"])
            q = lin(h, Ln["q"], Ln["q_b"]).reshape(nh, hd)
            k = lin(h, Ln["k"], Ln["k_b"]).reshape(nkv, hd)
            v = lin(h, Ln["v"], Ln["v_b"]).reshape(nkv, hd)
            if m.qk_norm:
                q = np.stack([rms(q[i], Ln["q_norm"]) for i in range(nh)])
                k = np.stack([rms(k[i], Ln["k_norm"]) for i in range(nkv)])
            qs.append(np.stack([rot(q[i], pos) for i in range(nh)]))
            ks.append(np.stack([rot(k[i], pos) for i in range(nkv)]))
            vs.append(v)
        new_xs = []
        for p in range(T):
            heads = []
            for hh in range(nh):
                kvh = hh * nkv // nh
                keys = [kk for kk in range(p + 1)
                        if m.sliding_window is None or p - kk < m.sliding_window]
                sc = np.array([qs[p][hh].dot(ks[kk][kvh]) / math.sqrt(hd) for kk in keys])
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                heads.append(sum(sc[i] * vs[kk][kvh] for i, kk in enumerate(keys)))
            x = xs[p] + lin(np.concatenate(heads), Ln["o"], Ln["o_b"])
            h = rms(x, Ln["post_norm"])
            if "router" in Ln:
                moe = np.zeros_like(x)
                for e, wt in route(h, Ln):
                    moe += wt * swiglu(h, Ln["experts"][e])
                x = x + moe
            else:
                g = lin(h, Ln["gate"], Ln["gate_b"])
                u = lin(h, Ln["up"], Ln["up_b"])
                x = x + lin(g / (1.0 + np.exp(-g)) * u, Ln["down"], Ln["down_b"])
            new_xs.append(x)
        xs = new_xs
    lm = np_(m.lm_head)
    return np.stack([lm.dot(rms(x, np_(m.norm))) for x in xs])


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def _parse_prompts(s):
    prompts = []
    for part in s.split(";"):
        part = part.strip()
        if not part:
            raise SystemExit("llama_ref: empty prompt in --prompt-ids")
        prompts.append([int(t) for t in part.split(",")])
    return prompts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--dump-logits")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    m = load_model(args.model)
    prompts = _parse_prompts(args.prompt_ids)
    outs = [greedy(m, p, args.max_new_tokens) for p in prompts]
    if args.dump_logits:
        np.concatenate([last_logits(m, p) for p in prompts]).astype("<f4").tofile(args.dump_logits)
    json.dump({"output_ids": outs[0] if len(outs) == 1 else outs}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
