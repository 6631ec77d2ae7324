"""A quantized head (issue 28): `--quantize int8|int4 --quantize-head`
quantizes lm_head int8 with one scale per output row (compressed-tensors'
W8A16 "channel" scheme), through the real `ferry` binary.

The expected numbers never come from ferry: the head is quantized here by
test_quant_exact.py's numpy reference (`ref_numpy`, written from
docs/quantization.md), the linear layers as test_quant.py does, and the
float64 PyTorch-layout reference (tests/reference/llama_ref.py) runs on a
full-precision, untied checkpoint of the dequantized weights. Then:

1. numerics: ferry's logits are within TOL of that reference (tied and
   untied, F32 and BF16), and within HEAD_TOL of the reference whose head
   is left full precision - the head's own int8 rounding error; greedy
   tokens follow the reference's; runs streamed from disk and on cpu-split
   are bit-identical;
2. export: the head is written as compressed-tensors writes a quantized
   lm_head (weight_packed, weight_scale [vocab, 1], weight_shape; a config
   group of int8 per channel claims it, `ignore` does not name it), the bits
   the reference gives; a tied model is written untied with its embedding
   table as it was; the export reloads bit for bit and plans the same head;
3. a compressed-tensors checkpoint that quantizes lm_head (int8 channel,
   int-quantized or pack-quantized, beside int8 or int4 layers) loads as
   such: exactly the logits of --quantize-head on the original; --quantize
   none dequantizes it;
4. off (the default): the head group's bytes are those of the full-precision
   head, computed here from the shapes, and the logits are those of a run
   without the flag; on: the head group shrinks to the int8 head;
5. --quantize-head without --quantize int8/int4 is refused in one line.
"""

from collections import OrderedDict

import numpy as np
import pytest

import llama_ref
import st_util
from conftest import assert_ferry_error, prompt_ids, rel_err
from test_quant import (DISK, SCHEMES, TOL, as_f32, assert_identical, check_ref, ct_module_scheme, dequant, gen,
                        pack, plan_json, quantized, read_tensors, write_compressed, write_float, write_model)
from test_quant_exact import ref_numpy

# rel logit error (max |diff| / max |ref|) of the int8 head against the
# reference whose head is full precision: each head weight moves by at most
# half its row's scale, absmax / 255 (0.4% of the row's largest weight);
# over the 64 columns of a tiny model's rows, with errors of both signs, a
# logit moves by about 0.5% of a typical logit. 2e-2 leaves room; measured
# values are printed.
HEAD_TOL = 2e-2
HEAD = "lm_head.weight"
EMBED = "model.embed_tokens.weight"

MODELS = {
    "llama-tied-f32": dict(arch="llama", tied=True, seed=431),
    "llama-tied-bf16": dict(arch="llama", tied=True, dtype="bf16", seed=432),
    "qwen2-untied-bf16": dict(arch="qwen2", tied=False, dtype="bf16", seed=433),
    "llama-untied-f32": dict(arch="llama", tied=False, seed=434),
}


def _model(models, name):
    opts = dict(MODELS[name])
    d = models.get(opts.pop("arch"), **opts)
    return d, st_util.read_config(str(d))


def _prompts(vocab, seed):
    return [prompt_ids(vocab, 7, seed), prompt_ids(vocab, 11, seed + 1), prompt_ids(vocab, 19, seed + 2)]


def head_source(d):
    """(dtype, shape, raw) of checkpoint d's head: lm_head, or the embedding
    table of a tied model."""
    t = read_tensors(d)
    return t[HEAD] if HEAD in t else t[EMBED]


def quantized_head(d):
    """(q int8 [vocab, dim], scale [vocab, 1]) of d's head by the reference:
    int8 per channel, scales in the head's dtype."""
    dt, shape, raw = head_source(d)
    return ref_numpy(as_f32(dt, shape, raw), dt, "int8")


def write_head_float(d, out, mode):
    """An F32, untied checkpoint of d's weights with the linear layers
    quantized (mode) and the head int8 per channel, both dequantized: what
    `--quantize MODE --quantize-head` computes."""
    q = quantized(d, mode)
    tensors = []
    for name, (dt, shape, raw) in read_tensors(d).items():
        if name == HEAD:
            continue
        x = dequant(q[name][0], q[name][1], mode) if name in q else as_f32(dt, shape, raw)
        tensors.append((name, "F32", shape, st_util.encode(x, "F32")))
    qh, sh = quantized_head(d)
    tensors.append((HEAD, "F32", list(qh.shape), st_util.encode(dequant(qh, sh.astype(np.float32), "int8"), "F32")))
    cfg = st_util.read_config(str(d))
    cfg["tie_word_embeddings"] = False
    return write_model(d, out, tensors, cfg)


def head_bytes(plan):
    (g,) = [g for g in plan["groups"] if g["name"] == "head"]
    return g["bytes"]


def align(x, a):
    return -(-x // a) * a


def expected_head_bytes(cfg, dtype_size, quantized_head):
    """The head unit's layout (store.h): the final norm, then lm_head (or the
    tied table), each 256-aligned, the unit 4096-aligned; an int8 head is
    its data, its scales 256-aligned after it."""
    vocab, dim = cfg["vocab_size"], cfg["hidden_size"]
    norm = align(dim * dtype_size, 256)
    if quantized_head:
        head = align(vocab * dim, 256) + vocab * dtype_size
    else:
        head = vocab * dim * dtype_size
    return align(norm + head, 4096)


# ---- 1. numerics ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_head_matches_reference(ferry, models, ref, work, name, mode):
    d, cfg = _model(models, name)
    prompts = _prompts(cfg["vocab_size"], MODELS[name]["seed"])
    flags = ("--quantize", mode, "--quantize-head")
    got = gen(ferry, d, prompts, work, *flags)
    err = check_ref(ref, write_head_float(d, work / "deq", mode), prompts, got, TOL, "%s %s" % (name, " ".join(flags)))
    # against the head left full precision: the head's int8 rounding, and no more
    m = ref(str(write_float(d, work / "deq-linear", mode)))
    head_err = max(rel_err(got[1][i], llama_ref.last_logits(m, p)) for i, p in enumerate(prompts))
    print("%s --quantize %s --quantize-head: rel logit error %.3g vs the reference, %.3g vs a full-precision head"
          % (name, mode, err, head_err))
    assert TOL < head_err < HEAD_TOL, "the head's rounding: rel %.3g (TOL %g, HEAD_TOL %g)" % (head_err, TOL, HEAD_TOL)
    # the head streamed from disk (a tied model's copy made from the table in the blob), and through
    # a separate device memory (cpu-split): the same bits
    disk = gen(ferry, d, prompts, work, *flags, *DISK, "--offload-dir", work / "od")
    assert_identical(disk, got, "%s from disk" % name)
    assert_identical(gen(ferry, d, prompts, work, *flags, "--device", "cpu-split"), got, "%s on cpu-split" % name)


# ---- 2. export -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("name", ["llama-tied-bf16", "qwen2-untied-bf16"])
def test_head_export_reloads(ferry, models, work, name, mode):
    d, cfg = _model(models, name)
    flags = ("--quantize", mode, "--quantize-head")
    prompts = _prompts(cfg["vocab_size"], 7)
    got = gen(ferry, d, prompts, work, *flags)
    ex = work / "ex"
    ferry.check("export", "--model", d, "--out", ex, *flags)
    ecfg = st_util.read_config(str(ex))
    assert ecfg.get("tie_word_embeddings", False) is False, ecfg
    qc = ecfg["quantization_config"]
    assert "lm_head" not in qc["ignore"], qc
    g = ct_module_scheme(qc, "lm_head")
    assert g is not None, qc
    w = g["weights"]
    assert (w["num_bits"], w["strategy"], w["group_size"], w["symmetric"]) == (8, "channel", None, True), w
    assert ct_module_scheme(qc, "model.embed_tokens") is None, qc
    if mode == "int4":  # the layers' scheme does not claim the head, nor the head's the layers
        assert ct_module_scheme(qc, "model.layers.0.mlp.down_proj")["weights"]["num_bits"] == 4, qc

    out, src = read_tensors(ex), read_tensors(d)
    assert HEAD not in out, sorted(out)
    dt, shape, raw = head_source(d)
    qh, sh = quantized_head(d)
    pdt, pshape, praw = out["lm_head.weight_packed"]
    assert (pdt, pshape) == ("I32", [shape[0], -(-shape[1] // 4)])
    words = np.frombuffer(praw, "<u4").reshape(pshape)
    unpacked = ((words[:, :, None] >> (8 * np.arange(4, dtype=np.uint32))) & 0xFF).reshape(shape[0], -1)
    assert np.array_equal(unpacked[:, :shape[1]].astype(np.int64) - 128, qh.astype(np.int64)), \
        "lm_head.weight_packed: not the reference's int8 values"
    sdt, sshape, sraw = out["lm_head.weight_scale"]
    assert (sdt, sshape) == (dt, [shape[0], 1])
    assert np.array_equal(as_f32(sdt, sshape, sraw), sh.astype(np.float32)), "lm_head.weight_scale"
    assert np.frombuffer(out["lm_head.weight_shape"][2], "<i8").tolist() == shape
    assert out[EMBED] == src[EMBED], "the embedding table must be written as it was"

    assert_identical(gen(ferry, ex, prompts, work), got, "%s: the export reloaded" % name)
    assert head_bytes(plan_json(ferry, ex)) == head_bytes(plan_json(ferry, d, *flags))
    # the original layout is the checkpoint's: a tied model stays tied, no lm_head written
    orig = work / "orig"
    ferry.check("export", "--model", d, "--out", orig, "--layout", "original", *flags)
    assert (HEAD in read_tensors(orig)) == (HEAD in src)
    assert st_util.read_config(str(orig)).get("tie_word_embeddings", False) == cfg.get("tie_word_embeddings", False)


# ---- 3. a checkpoint that quantizes lm_head ----------------------------------------------------

def write_head_compressed(d, out, scheme, tmp):
    """write_compressed(d, scheme) plus lm_head int8 per channel in the
    scheme's format, claimed by a config group of its own ("lm_head"), and
    `ignore` no longer naming it."""
    fmt = SCHEMES[scheme][0]
    base = write_compressed(d, tmp, scheme)
    tensors = [(n, dt, shape, raw) for n, (dt, shape, raw) in read_tensors(base).items() if n != HEAD]
    dt, shape, _ = head_source(d)
    qh, sh = quantized_head(d)
    if fmt == "int-quantized":
        tensors.append((HEAD, "I8", shape, qh.astype(np.int8).tobytes()))
    else:
        p = pack(qh, 8)
        tensors.append(("lm_head.weight_packed", "I32", list(p.shape), p.astype("<i4").tobytes()))
        tensors.append(("lm_head.weight_shape", "I64", [2], np.array(shape, "<i8").tobytes()))
    tensors.append(("lm_head.weight_scale", dt, list(sh.shape), st_util.encode(sh, dt)))
    cfg = st_util.read_config(str(base))
    qc = cfg["quantization_config"]
    qc["config_groups"]["group_head"] = OrderedDict(
        targets=["lm_head"], weights=OrderedDict(num_bits=8, type="int", symmetric=True, strategy="channel",
                                                 group_size=None, dynamic=False, actorder=None),
        input_activations=None)
    qc["ignore"] = [t for t in qc["ignore"] if t != "lm_head"]
    return write_model(d, out, tensors, cfg)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_head_checkpoint_loads(ferry, models, ref, work, scheme):
    name = "llama-untied-f32"
    d, cfg = _model(models, name)
    mode = SCHEMES[scheme][2]
    ct = write_head_compressed(d, work / "ct", scheme, work / "base")
    prompts = _prompts(cfg["vocab_size"], 11)[:2]
    want = gen(ferry, d, prompts, work, "--quantize", mode, "--quantize-head")
    assert_identical(gen(ferry, ct, prompts, work), want, "%s checkpoint with an int8 lm_head" % scheme)
    assert head_bytes(plan_json(ferry, ct)) == head_bytes(plan_json(ferry, d, "--quantize", mode, "--quantize-head"))
    # --quantize none dequantizes the head with the layers
    deq = gen(ferry, ct, prompts, work, "--quantize", "none")
    check_ref(ref, write_head_float(d, work / "deq", mode), prompts, deq, TOL, "%s --quantize none" % scheme)


# ---- 4. off by default; on, the head group shrinks ---------------------------------------------

@pytest.mark.parametrize("name", ["llama-tied-f32", "qwen2-untied-bf16"])
def test_head_option_off_and_on(ferry, models, work, name):
    d, cfg = _model(models, name)
    size = 2 if MODELS[name].get("dtype") == "bf16" else 4
    # the same plan, but for what the machine has free when each runs (host_available, and the
    # default KV pool sized from it): a fixed pool, and that field left out
    fixed = ("--kv-memory", "1MiB")
    machine = ("host_available", "fits")
    off = {k: v for k, v in plan_json(ferry, d, "--quantize", "int8", *fixed).items() if k not in machine}
    on_off = plan_json(ferry, d, "--quantize", "int8", "--quantize-head", "false", *fixed)
    assert {k: v for k, v in on_off.items() if k not in machine} == off
    assert head_bytes(off) == expected_head_bytes(cfg, size, False)
    on = plan_json(ferry, d, "--quantize", "int4", "--quantize-head")
    assert head_bytes(on) == expected_head_bytes(cfg, size, True) < head_bytes(off)
    if cfg["tie_word_embeddings"]:  # the table leaves the head group for a group of its own
        assert [g["bytes"] for g in off["groups"] if g["name"] == "embed"] == [0]
        assert [g["bytes"] for g in on["groups"] if g["name"] == "embed"] == [
            align(cfg["vocab_size"] * cfg["hidden_size"] * size, 4096)]
    prompts = _prompts(cfg["vocab_size"], 3)[:2]
    assert_identical(gen(ferry, d, prompts, work, "--quantize", "int8", "--quantize-head", "false"),
                     gen(ferry, d, prompts, work, "--quantize", "int8"), "--quantize-head false")


# ---- 5. refused ----------------------------------------------------------------------------------

@pytest.mark.parametrize("quantize", [(), ("--quantize", "none")], ids=["not-given", "none"])
@pytest.mark.parametrize("cmd", ["generate", "plan", "inspect"])
def test_head_needs_quantize(ferry, models, cmd, quantize):
    d, _ = _model(models, "llama-tied-f32")
    args = [cmd, "--model", d, *quantize, "--quantize-head"]
    if cmd == "generate":
        args += ["--prompt-ids", "1,2"]
    line = assert_ferry_error(ferry.run(*args), "--quantize-head needs --quantize int8 or int4", rcs=(2,))
    assert ("not given" if not quantize else "is none") in line, line
