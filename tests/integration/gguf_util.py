"""Hugging Face Llama-family checkpoints laid out as llama.cpp's converter
writes them into a GGUF (convert_hf_to_gguf.py): its tensor names and the
Q/K row permutation of LlamaModel. For tests/integration/test_gguf_model.py
and bench/gguf_bench.py, which make GGUF files the way llama.cpp does."""

HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


MOE_TO_GGUF = {  # a sparse layer's router (Mixtral, Qwen3-MoE)
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
EXPERTS_TO_GGUF = {  # an expert's weight -> the layer's merged [experts, rows, cols] tensor
    "w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight",
    "gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight", "down_proj": "ffn_down_exps.weight",
}


def expert_of(hf):
    """(layer, expert, merged GGUF name) of an expert's weight, else None."""
    parts = hf.split(".")
    if "experts" not in parts:
        return None
    i = parts.index("experts")
    return int(parts[2]), int(parts[i + 1]), "blk.%s.%s" % (parts[2], EXPERTS_TO_GGUF[parts[i + 2]])


def gguf_name(hf):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return "blk.%s.%s" % (layer, HF_TO_GGUF.get(rest) or MOE_TO_GGUF[rest])


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py, LlamaModel.permute (llama.cpp)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))
