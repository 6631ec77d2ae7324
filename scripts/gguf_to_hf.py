#!/usr/bin/env python3
"""A llama-architecture GGUF file as a Hugging Face checkpoint.

    python scripts/gguf_to_hf.py FILE.gguf OUT_DIR [--generation KEY=VALUE ...]

OUT_DIR gets what `transformers` (and ferry) read for a LlamaForCausalLM:

  model.safetensors       every tensor dequantized to float32 (gguf.quants),
                          under HF Llama's names, with llama.cpp's Q/K row
                          permutation undone; no lm_head.weight when the GGUF
                          has no output.weight (tied embeddings)
  config.json             LlamaForCausalLM from the GGUF's llama.* metadata
  tokenizer.json          HF tokenizers' byte-level BPE from tokenizer.ggml.*
                          (tokens, merges, token types: control tokens become
                          special added tokens), with the pre-tokenizer
                          llama.cpp uses for the GGUF's tokenizer.ggml.pre
  tokenizer_config.json   bos/eos/unk/pad tokens, add_bos_token, chat_template
  generation_config.json  bos/eos/pad token ids, and each --generation
                          KEY=VALUE (VALUE as JSON): sampling defaults a GGUF
                          does not carry, such as those of the model's card

The weights are streamed: the safetensors header is computed from the
metadata, then each tensor is dequantized (large ones in row chunks) and
appended, so memory stays near one tensor however large the model is.

Anything it cannot convert faithfully - another architecture, a tensor type
gguf.quants cannot dequantize, an unknown tensor, a tokenizer model other
than gpt2 or an unknown pre-tokenizer - is refused with one line on stderr
naming it (exit status 1).

The Q/K permutation: llama.cpp's converter (conversion/llama.py,
LlamaModel.permute) stores q_proj/k_proj rows as

    w.reshape(n_head, 2, rows // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape)

(n_head = the KV head count for k_proj), interleaving each head's two
rotary halves; unpermute() below is its exact inverse.
"""

import json
import os
import struct
import sys

import numpy as np

import vocab_to_hf  # the byte-level tokenizer builder (this script's folder is on sys.path)

PROG = "gguf_to_hf.py"
CHUNK_BYTES = 16 << 20  # float32 bytes dequantized at a time for unpermuted tensors


class Refused(Exception):
    pass


def fail(msg):
    raise Refused(msg)


# --------------------------------------------------------------------------
# metadata
# --------------------------------------------------------------------------

def field(reader, key, default=None, required=False):
    f = reader.fields.get(key)
    if f is None:
        if required:
            fail("metadata key %s is missing" % key)
        return default
    return f.contents()


def f32_float(x):
    """A float32 metadata value as the shortest decimal that rounds to it
    (9.999999747378752e-06 -> 1e-05, what the original config said)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-")) if x is not None else None


# --------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------

LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name, n_layers):
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        if int(parts[1]) >= n_layers:
            fail("tensor %s is past llama.block_count %d" % (name, n_layers))
        return "model.layers.%s.%s" % (parts[1], LAYER_NAMES[parts[2]])
    fail("tensor %s has no Hugging Face Llama counterpart" % name)


def unpermute(w, n_head):
    """The inverse of LlamaModel.permute(w, n_head, n_head) (rows only; w may
    be a weight [rows, cols] or a bias [rows])."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        fail("%d rows do not split into %d heads of two rotary halves" % (rows, n_head))
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def dequantizable(qtype):
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    return qtype in (T.F32, T.F16) or qtype in getattr(quants, "_type_traits", {})


def dequant_rows(t, lo, hi):
    """float32 rows [lo, hi) of tensor t, shaped [hi - lo, cols...] (numpy order)."""
    from gguf import quants
    shape = tuple(int(x) for x in reversed(t.shape))  # numpy / HF order
    data = t.data
    if len(shape) == 1:
        out = quants.dequantize(data, t.tensor_type)
        return np.asarray(out, dtype=np.float32).reshape(shape)[lo:hi]
    raw = data.reshape(shape[0], -1)[lo:hi]
    out = quants.dequantize(raw, t.tensor_type)
    return np.asarray(out, dtype=np.float32).reshape((hi - lo,) + shape[1:])


def write_safetensors(path, plan):
    """plan: [(hf name, shape, produce)] where produce(f) writes the tensor's
    float32 little-endian bytes to f. The header is written first, from the
    shapes alone."""
    header, off = {}, 0
    for name, shape, _ in plan:
        n = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        base = f.tell()
        for name, shape, produce in plan:
            start = f.tell()
            produce(f)
            want = header[name]["data_offsets"]
            if f.tell() - base != want[1] or start - base != want[0]:
                fail("internal error: %s wrote %d bytes, expected %d" % (name, f.tell() - start, want[1] - want[0]))


def tensor_plan(reader, n_layers, n_head, n_kv):
    plan = []
    for t in reader.tensors:
        name = hf_name(t.name, n_layers)
        if not dequantizable(t.tensor_type):
            fail("tensor %s has type %s, which gguf.quants cannot dequantize" % (t.name, t.tensor_type.name))
        shape = tuple(int(x) for x in reversed(t.shape))
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = n_head
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = n_kv
        else:
            heads = None

        def produce(f, t=t, shape=shape, heads=heads):
            if heads is not None:
                w = unpermute(dequant_rows(t, 0, shape[0]), heads)
                f.write(np.ascontiguousarray(w, dtype="<f4").tobytes())
                return
            row = 4 * int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 4 * shape[0]
            step = shape[0] if len(shape) == 1 else max(1, CHUNK_BYTES // row)
            for lo in range(0, shape[0], step):
                hi = min(shape[0], lo + step)
                f.write(np.ascontiguousarray(dequant_rows(t, lo, hi), dtype="<f4").tobytes())
        plan.append((name, shape, produce))
    names = [p[0] for p in plan]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        fail("tensors map to the same name twice: %s" % ", ".join(sorted(dup)))
    return plan


# --------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------

# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp) as HF pre-tokenizers.
# Each entry: HF tokenizers pre-tokenizers before ByteLevel(use_regex=True),
# which applies the GPT-2 regex llama.cpp lists last.
# (llama.cpp's "default" for a BPE vocabulary is a different set of regexes:
# refused.)
GPT2_LIKE = ("gpt-2", "phi-2", "mellum")
DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2")


def pre_tokenizer_for(pre):
    """The Hugging Face pre-tokenizer of llama.cpp's pre-tokenizer type."""
    if pre in GPT2_LIKE:
        return vocab_to_hf.bl(True)
    if pre in DIGITS_THEN_GPT2:
        # llama.cpp: "\p{N}" then the GPT-2 regex. HF writes the first as
        # Digits(individual_digits=True) (Rust's char::is_numeric, i.e. \p{N},
        # each match isolated); ferry reads it as the equivalent Split.
        from tokenizers import pre_tokenizers
        return pre_tokenizers.Sequence([vocab_to_hf.split(r"\p{N}"), vocab_to_hf.bl(True)])
    fail("tokenizer.ggml.pre '%s' has no known Hugging Face pre-tokenizer here" % pre)


def build_tokenizer(reader, out_dir):
    """tokenizer.json and tokenizer_config.json; the tokenizer is built as
    vocab_to_hf.py builds byte-level ones (which llama.cpp's vectors check)."""
    from tokenizers import processors

    model = field(reader, "tokenizer.ggml.model", required=True)
    if model != "gpt2":
        fail("tokenizer.ggml.model '%s' is not supported (only gpt2, byte-level BPE)" % model)
    pre = field(reader, "tokenizer.ggml.pre", "default")
    tokens = list(field(reader, "tokenizer.ggml.tokens", required=True))
    types = list(field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = list(field(reader, "tokenizer.ggml.merges", required=True))
    if len(types) != len(tokens):
        fail("tokenizer.ggml.token_type has %d entries for %d tokens" % (len(types), len(tokens)))
    seen = {}
    for i, t in enumerate(tokens):
        if t in seen:
            fail("token %r appears twice (ids %d and %d)" % (t, seen[t], i))
        seen[t] = i
    try:
        tok = vocab_to_hf.byte_level({"tokens": tokens, "types": types, "merges": merges}, pre_tokenizer_for(pre))
    except vocab_to_hf.Mismatch as e:
        fail(str(e))

    def tok_of(key):
        i = field(reader, key)
        if i is None:
            return None, None
        i = int(i)
        if not 0 <= i < len(tokens):
            fail("%s %d is not a token id (vocabulary of %d)" % (key, i, len(tokens)))
        return i, tokens[i]

    bos_id, bos = tok_of("tokenizer.ggml.bos_token_id")
    eos_id, eos = tok_of("tokenizer.ggml.eos_token_id")
    unk_id, unk = tok_of("tokenizer.ggml.unknown_token_id")
    pad_id, pad = tok_of("tokenizer.ggml.padding_token_id")
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False))

    byte_post = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    if (add_bos and bos is None) or (add_eos and eos is None):
        fail("add_bos_token/add_eos_token set without the token id")
    if add_bos or add_eos:
        b = ["%s:0" % bos] if add_bos else []
        e = ["%s:0" % eos] if add_eos else []
        specials = sorted(({(bos, bos_id)} if add_bos else set()) | ({(eos, eos_id)} if add_eos else set()))
        tmpl = processors.TemplateProcessing(
            single=" ".join(b + ["$A:0"] + e),
            pair=" ".join(b + ["$A:0"] + e + [x.replace(":0", ":1") for x in b] + ["$B:1"] +
                          [x.replace(":0", ":1") for x in e]),
            special_tokens=specials)
        tok.post_processor = processors.Sequence([byte_post, tmpl])
    else:
        tok.post_processor = byte_post

    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        fail("tokenizer has %d tokens, the GGUF %d" % (tok.get_vocab_size(with_added_tokens=True), len(tokens)))
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    ctx = field(reader, "llama.context_length")
    cfg = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": ty == 3}
            for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)},
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": unk,
        "pad_token": pad,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(ctx) if ctx is not None else None,
        "tokenizer_class": "GPT2Tokenizer",
    }
    tmpl = field(reader, "tokenizer.chat_template")
    if tmpl is not None:
        cfg["chat_template"] = tmpl
    cfg = {k: v for k, v in cfg.items() if v is not None}
    dump_json(os.path.join(out_dir, "tokenizer_config.json"), cfg)
    return {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}


# --------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------

def model_config(reader, ids, tied, has_attn_bias, has_mlp_bias, vocab):
    a = "llama."
    n_head = int(field(reader, a + "attention.head_count", required=True))
    n_kv = field(reader, a + "attention.head_count_kv", n_head)
    hidden = int(field(reader, a + "embedding_length", required=True))
    head_dim = int(field(reader, a + "attention.key_length", hidden // n_head))
    rope_dim = int(field(reader, a + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        fail("llama.rope.dimension_count %d differs from the head dimension %d (partial rotary)" % (
            rope_dim, head_dim))
    vdim = int(field(reader, a + "attention.value_length", head_dim))
    if vdim != head_dim:
        fail("llama.attention.value_length %d differs from key_length %d" % (vdim, head_dim))
    if int(field(reader, a + "expert_count", 0) or 0):
        fail("llama.expert_count: mixtures of experts are not supported")
    rope_scaling = None
    st = field(reader, a + "rope.scaling.type")
    if st not in (None, "none"):
        if st != "linear":
            fail("llama.rope.scaling.type '%s' is not supported (only linear)" % st)
        rope_scaling = {"type": "linear", "factor": f32_float(field(reader, a + "rope.scaling.factor", required=True))}
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(field(reader, a + "feed_forward_length", required=True)),
        "num_hidden_layers": int(field(reader, a + "block_count", required=True)),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(n_kv),
        "head_dim": head_dim,
        "max_position_embeddings": int(field(reader, a + "context_length", 2048)),
        "rms_norm_eps": f32_float(field(reader, a + "attention.layer_norm_rms_epsilon", required=True)),
        "rope_theta": f32_float(field(reader, a + "rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "attention_bias": has_attn_bias,
        "attention_dropout": 0.0,
        "mlp_bias": has_mlp_bias,
        "pretraining_tp": 1,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    for k, v in ids.items():
        if v is not None:
            cfg[k] = v
    return cfg


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# --------------------------------------------------------------------------

def convert(src, out_dir, generation=None):
    import gguf
    reader = gguf.GGUFReader(src)
    arch = field(reader, "general.architecture", required=True)
    if arch != "llama":
        fail("%s: architecture '%s' is not supported (only llama)" % (src, arch))
    bad = sorted({"%s (%s)" % (t.name, t.tensor_type.name) for t in reader.tensors
                  if not dequantizable(t.tensor_type)})
    if bad:
        kinds = sorted({t.tensor_type.name for t in reader.tensors if not dequantizable(t.tensor_type)})
        fail("%s: tensor type(s) %s cannot be dequantized by gguf.quants (%d tensors, e.g. %s)" % (
            src, ", ".join(kinds), len(bad), bad[0]))
    n_layers = int(field(reader, "llama.block_count", required=True))
    n_head = int(field(reader, "llama.attention.head_count", required=True))
    n_kv = field(reader, "llama.attention.head_count_kv", n_head)
    if isinstance(n_kv, list):
        fail("llama.attention.head_count_kv varies per layer, which HF Llama cannot express")
    n_kv = int(n_kv)

    plan = tensor_plan(reader, n_layers, n_head, n_kv)
    names = {p[0]: p[1] for p in plan}
    if "model.embed_tokens.weight" not in names:
        fail("%s: no token_embd.weight" % src)
    vocab = names["model.embed_tokens.weight"][0]
    tokens = field(reader, "tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != vocab:
        fail("%s: %d tokens but token_embd.weight has %d rows" % (src, len(tokens), vocab))
    tied = "lm_head.weight" not in names
    for i in range(n_layers):
        for part in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                     "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            if "model.layers.%d.%s.weight" % (i, part) not in names:
                fail("%s: layer %d has no %s weight" % (src, i, part))
    if "model.norm.weight" not in names:
        fail("%s: no output_norm.weight" % src)
    has_attn_bias = any(n.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias")) for n in names)
    has_mlp_bias = any(n.endswith(("gate_proj.bias", "up_proj.bias", "down_proj.bias")) for n in names)

    os.makedirs(out_dir, exist_ok=True)
    ids = build_tokenizer(reader, out_dir)
    cfg = model_config(reader, ids, tied, has_attn_bias, has_mlp_bias, vocab)
    dump_json(os.path.join(out_dir, "config.json"), cfg)
    gen = {k: v for k, v in ids.items() if v is not None}
    gen.update(generation or {})
    dump_json(os.path.join(out_dir, "generation_config.json"), gen)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), plan)


def main(argv):
    args, generation = argv[1:3], {}
    rest = argv[3:]
    while len(rest) >= 2 and rest[0] == "--generation" and "=" in rest[1]:
        key, value = rest[1].split("=", 1)
        try:
            generation[key] = json.loads(value)
        except ValueError:
            sys.stderr.write("%s: --generation %s: the value is not JSON\n" % (PROG, rest[1]))
            return 2
        rest = rest[2:]
    if len(args) != 2 or args[0].startswith("-") or rest:
        sys.stderr.write("usage: python %s FILE.gguf OUT_DIR [--generation KEY=VALUE ...]\n" % PROG)
        return 2
    try:
        convert(args[0], args[1], generation)
    except Refused as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return 1
    except (OSError, ValueError) as e:
        sys.stderr.write("%s: %s: %s\n" % (PROG, argv[1], str(e).splitlines()[0] if str(e) else type(e).__name__))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
