"""Tiny safetensors reader/writer in pure Python (struct + json + numpy).

Used by the integration tests to inspect the files ferry writes and to craft
deliberately broken ones. Nothing here validates: the point is to be able to
write any byte sequence we like.

File layout: u64 little-endian header length N, N bytes of UTF-8 JSON header
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}),
then the raw little-endian tensor data; offsets are relative to the data start.
"""

import json
import os
import struct
from collections import OrderedDict

import numpy as np

DTYPE_SIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
}


class SafeTensors:
    """A parsed file: header (OrderedDict, __metadata__ included if present),
    header_len, data (bytes after the header)."""

    def __init__(self, header, header_len, data):
        self.header = header
        self.header_len = header_len
        self.data = data

    @property
    def names(self):
        return [k for k in self.header if k != "__metadata__"]

    @property
    def metadata(self):
        return self.header.get("__metadata__")

    def info(self, name):
        return self.header[name]

    def raw(self, name):
        b, e = self.header[name]["data_offsets"]
        return self.data[b:e]

    def array(self, name):
        """Tensor as a float32 (or native integer) numpy array."""
        info = self.header[name]
        return decode(self.raw(name), info["dtype"], info["shape"])

    def nbytes_by_dtype(self):
        out = {}
        for n in self.names:
            b, e = self.header[n]["data_offsets"]
            out[self.header[n]["dtype"]] = out.get(self.header[n]["dtype"], 0) + (e - b)
        return out

    def entries(self):
        """[(name, dtype, shape, bytes)] in data-offset order."""
        names = sorted(self.names, key=lambda n: self.header[n]["data_offsets"][0])
        return [(n, self.header[n]["dtype"], list(self.header[n]["shape"]), self.raw(n))
                for n in names]


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"), object_pairs_hook=OrderedDict)
    return SafeTensors(header, hlen, blob[8 + hlen:])


def decode(buf, dtype, shape):
    a = np.frombuffer(buf, dtype=np.uint8)
    if dtype == "F32":
        arr = a.view("<f4")
    elif dtype == "F16":
        arr = a.view("<f2").astype(np.float32)
    elif dtype == "BF16":
        arr = (a.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    elif dtype == "F64":
        arr = a.view("<f8")
    elif dtype in ("I64", "I32", "I16", "I8", "U8"):
        arr = a.view({"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1"}[dtype])
    else:
        raise ValueError("dtype %s" % dtype)
    return arr.reshape(shape)


def encode(arr, dtype):
    """numpy array -> little-endian bytes in the given safetensors dtype.
    BF16 rounds to nearest even (like torch)."""
    arr = np.ascontiguousarray(arr)
    if dtype == "F32":
        return arr.astype("<f4").tobytes()
    if dtype == "F16":
        return arr.astype("<f2").tobytes()
    if dtype == "F64":
        return arr.astype("<f8").tobytes()
    if dtype == "BF16":
        u = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()
    raise ValueError("dtype %s" % dtype)


def header_bytes(header, align=8):
    """Serialize a header dict, padded with spaces to a multiple of align."""
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if align:
        text += b" " * ((-len(text)) % align)
    return text


def assemble(header_text, data, header_len=None):
    """u64 length + header text (bytes or str) + data. header_len overrides
    the length field (to lie about it)."""
    if isinstance(header_text, str):
        header_text = header_text.encode("utf-8")
    n = len(header_text) if header_len is None else header_len
    return struct.pack("<Q", n) + header_text + bytes(data)


def write_raw(path, header_text, data, header_len=None):
    with open(path, "wb") as f:
        f.write(assemble(header_text, data, header_len))


def write_entries(path, entries, metadata=None):
    """entries: [(name, dtype, shape, bytes)] laid out contiguously in order."""
    header = OrderedDict()
    if metadata is not None:
        header["__metadata__"] = metadata
    data = bytearray()
    for name, dtype, shape, buf in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(buf)]}
        data += buf
    write_raw(path, header_bytes(header), bytes(data))


def write(path, tensors, dtype="F32", metadata=None):
    """tensors: {name: numpy array} (ordered), all stored as dtype."""
    write_entries(path, [(n, dtype, list(a.shape), encode(a, dtype)) for n, a in tensors.items()],
                  metadata=metadata)


def write_header(path, header, data):
    """Write a header dict as given (offsets untouched) followed by data."""
    write_raw(path, header_bytes(header), data)


# --------------------------------------------------------------------------
# checkpoint directories
# --------------------------------------------------------------------------

def model_files(model_dir):
    """Safetensors files of a checkpoint dir: [model.safetensors] or the shards
    named by the index, sorted."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_index(model_dir):
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        return json.load(f, object_pairs_hook=OrderedDict)


def write_index(model_dir, index):
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f, object_pairs_hook=OrderedDict)


def write_config(model_dir, cfg):
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


# --------------------------------------------------------------------------
# random checkpoints (for testing the reference without ferry)
# --------------------------------------------------------------------------

ARCH_NAMES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def attention_tensors(t, p, r, norm_w, hidden, heads, kv_heads, hd, qkv_bias=False, o_bias=False, qk_norm=False):
    """A decoder layer's input norm and attention tensors, named under prefix p,
    added to t in this order (r draws a weight, norm_w a norm)."""
    t[p + "input_layernorm.weight"] = norm_w(hidden)
    t[p + "self_attn.q_proj.weight"] = r(heads * hd, hidden)
    t[p + "self_attn.k_proj.weight"] = r(kv_heads * hd, hidden)
    t[p + "self_attn.v_proj.weight"] = r(kv_heads * hd, hidden)
    t[p + "self_attn.o_proj.weight"] = r(hidden, heads * hd)
    if qkv_bias:
        t[p + "self_attn.q_proj.bias"] = r(heads * hd)
        t[p + "self_attn.k_proj.bias"] = r(kv_heads * hd)
        t[p + "self_attn.v_proj.bias"] = r(kv_heads * hd)
    if o_bias:
        t[p + "self_attn.o_proj.bias"] = r(hidden)
    if qk_norm:
        t[p + "self_attn.q_norm.weight"] = norm_w(hd)
        t[p + "self_attn.k_norm.weight"] = norm_w(hd)


def random_checkpoint(model_dir, arch="llama", dtype="F32", seed=0, hidden=32, layers=2,
                      heads=4, kv_heads=2, intermediate=48, vocab=64, head_dim=None,
                      tied=False, attention_bias=False, sliding_window=None, shards=1,
                      rope_theta=10000.0, scale=0.2):
    """Write a random HF-layout checkpoint; returns the config dict."""
    os.makedirs(model_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    hd = head_dim or hidden // heads
    cfg = OrderedDict(
        architectures=[ARCH_NAMES[arch]], model_type=arch, hidden_size=hidden,
        intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, rms_norm_eps=1e-6,
        rope_theta=rope_theta, hidden_act="silu", tie_word_embeddings=tied,
        max_position_embeddings=512, torch_dtype="float32",
    )
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = attention_bias
    if arch == "mistral":
        cfg["sliding_window"] = sliding_window

    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n):
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    t = OrderedDict()
    t["model.embed_tokens.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = "model.layers.%d." % i
        attention_tensors(t, p, r, norm_w, hidden, heads, kv_heads, hd, qkv_bias=arch == "qwen2" or attention_bias,
                          o_bias=attention_bias and arch != "qwen2", qk_norm=arch == "qwen3")
        t[p + "post_attention_layernorm.weight"] = norm_w(hidden)
        t[p + "mlp.gate_proj.weight"] = r(intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = r(intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = r(hidden, intermediate)
    t["model.norm.weight"] = norm_w(hidden)
    if not tied:
        t["lm_head.weight"] = r(vocab, hidden)
    write_config(model_dir, cfg)
    names = list(t)
    if shards <= 1:
        write(os.path.join(model_dir, "model.safetensors"), t, dtype=dtype,
              metadata={"format": "pt"})
    else:
        weight_map = OrderedDict()
        total = 0
        chunks = [names[i::shards] for i in range(shards)]
        for s, chunk in enumerate(chunks):
            fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
            part = OrderedDict((n, t[n]) for n in chunk)
            write(os.path.join(model_dir, fname), part, dtype=dtype, metadata={"format": "pt"})
            for n in chunk:
                weight_map[n] = fname
                total += t[n].size * DTYPE_SIZE[dtype]
        write_index(model_dir, OrderedDict(metadata={"total_size": total}, weight_map=weight_map))
    return cfg
