"""Weight conversions end to end (issue 12): `--quantize int8|int4`,
`--weights-dtype` and compressed-tensors checkpoints, through the real
`ferry` binary.

The expected numbers never come from ferry. The test's Python quantizes
every linear weight (q/k/v/o_proj, gate/up/down_proj) with the numpy
reference of test_quant_exact.py (`ref_numpy`, written from
docs/quantization.md), dequantizes it (q * scale in f32), writes a
full-precision checkpoint of those weights and runs the float64 reference
(tests/reference/llama_ref.py) on it. Then:

1. numerics: `generate --quantize MODE` on the original checkpoint is within
   the numeric tolerance of that reference (F32 and BF16 llama, qwen3 with
   q/k norms, qwen2 with q/k/v biases, and a llama whose linear layers have
   several int4 groups and a short last one);
2. placement: resident, host, disk, mixed and cpu-split runs of one
   conversion have bit-identical logits; a restart reuses the offload dir
   for the same conversion and rebuilds it for another;
3. round trip: compressed-tensors checkpoints written here from the same
   bits (int8 int-quantized, int8 pack-quantized, int4 pack-quantized) give
   exactly the logits of `--quantize MODE` on the original; `--quantize
   none` dequantizes them; `inspect` reports them;
4. refusals: unsupported or inconsistent quantization configs and tensors,
   requantization and bad flags, each one line naming what is wrong;
5. a NaN/Inf weight refused naming the tensor;
6. input dims that 128 does not divide: int4 takes a group that divides
   them (64, 32 or per channel), says so at startup and in inspect, and
   exports what compressed-tensors loads, reloading bit for bit;
7. int8 per group (compressed-tensors' W8A16 preset from 0.19: group 128)
   read, computed and exported;
8. `--weights-dtype bf16` on an F32 model, alone and with int8.

Runs are compared bit for bit across placements, restarts and checkpoint
forms: the CPU kernels are batch invariant (a token row's result does not
depend on the rows sharing its step; test_step_size_invariant here,
test_ops' test_matmul_batch_invariant below), so two runs of one command
give the same bits however their prefills were split into steps.
"""

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

import llama_ref
import st_util
from conftest import assert_ferry_error, check_greedy, prompt_ids, rel_err
from test_quant_exact import group_of, pack_int4, ref_numpy, round_to

N_NEW = 8
# rel logit error vs the reference on the dequantized weights, for F32 and
# BF16 checkpoints alike: a quantized layer's BF16 scale times its int8/int4
# value is exact in f32, and ferry computes in f32 (measured: below 1e-6)
TOL = 1e-4
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GROUP = 128  # the int4 group along the input dim where it divides the columns (else group_of)
DISK = ("--max-memory", "device=0,host=0")

# name -> models.get() arguments
MODELS = {
    "llama-f32": dict(arch="llama", seed=401),
    "llama-bf16": dict(arch="llama", dtype="bf16", seed=402),
    "qwen3-f32": dict(arch="qwen3", seed=403),  # q_norm / k_norm
    "qwen2-bf16": dict(arch="qwen2", dtype="bf16", seed=404),  # q/k/v biases
    # hidden 256 (two int4 groups), intermediate 688 = 5 * 128 + 48: down_proj
    # has a short last group
    "llama-small-f32": dict(arch="llama", preset="small", layers=2, seed=405),
}

# compressed-tensors schemes: (format, num_bits, ferry's --quantize); each
# layer's group is the one --quantize takes (group_of: int8 per channel,
# int4 128 or a group that divides the columns), one config group per
# distinct group
SCHEMES = {
    "int8-int": ("int-quantized", 8, "int8"),
    "int8-pack": ("pack-quantized", 8, "int8"),
    "int4-pack": ("pack-quantized", 4, "int4"),
}


# ---- checkpoints written by the test -------------------------------------------------

def is_linear(name):
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LINEAR


def read_tensors(d):
    """OrderedDict name -> (dtype, shape, raw bytes) of every tensor of checkpoint d."""
    out = OrderedDict()
    for f in st_util.model_files(str(d)):
        for name, dt, shape, raw in st_util.read(str(Path(d) / f)).entries():
            out[name] = (dt, shape, raw)
    return out


def as_f32(dt, shape, raw):
    return np.array(st_util.decode(raw, dt, shape), dtype=np.float32)


_QUANT = {}


def quantized(d, mode, dtype=None):
    """{linear weight name: (q int8 [rows, cols], scales f32 [rows, groups])}
    of checkpoint d by the reference quantizer, from the weight converted to
    `dtype` (default: its checkpoint dtype; the scales are in that dtype)."""
    key = (str(d), mode, dtype)
    if key not in _QUANT:
        out = {}
        for name, (dt, shape, raw) in read_tensors(d).items():
            if is_linear(name):
                sd = dtype or dt
                out[name] = ref_numpy(round_to(as_f32(dt, shape, raw), sd), sd, mode)
        _QUANT[key] = out
    return _QUANT[key]


def dequant(q, s, mode):
    """q * scale in f32 (quant_dequant_row), [rows, cols]."""
    cols = q.shape[1]
    g = group_of(mode, cols)
    return q.astype(np.float32) * np.repeat(s, g, axis=1)[:, :cols]


def write_model(d, out, tensors, config=None):
    """Checkpoint `out`: d's config.json (or `config`) and one
    model.safetensors of `tensors` [(name, dtype, shape, bytes)]."""
    out = Path(out)
    out.mkdir(parents=True)
    st_util.write_config(str(out), config if config is not None else st_util.read_config(str(d)))
    st_util.write_entries(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    return out


def write_float(d, out, mode=None, dtype=None, round_dequant=None):
    """An F32 checkpoint of d's weights: the linear ones quantized by the
    reference and dequantized when mode is set; every weight (before
    quantizing) rounded to `dtype` when set; the dequantized values rounded
    to `round_dequant` when set (what --quantize none gives in that dtype)."""
    q = quantized(d, mode, dtype) if mode else {}
    tensors = []
    for name, (dt, shape, raw) in read_tensors(d).items():
        x = as_f32(dt, shape, raw)
        if dtype:
            x = round_to(x, dtype)
        if name in q:
            x = dequant(q[name][0], q[name][1], mode)
            if round_dequant:
                x = round_to(x, round_dequant)
        tensors.append((name, "F32", shape, st_util.encode(x, "F32")))
    return write_model(d, out, tensors)


def pack(q, bits):
    """q int8 [rows, cols] -> int32 [rows, ceil(cols * bits / 32)]: element c
    is q + 2^(bits-1) in bits bits*(c % per_word) of word c // per_word."""
    rows, cols = q.shape
    per = 32 // bits
    words = -(-cols // per)
    u = np.zeros((rows, words * per), np.uint64)
    u[:, :cols] = (q.astype(np.int64) + (1 << (bits - 1))).astype(np.uint64)
    shifts = (bits * np.arange(per)).astype(np.uint64)
    packed = (u.reshape(rows, words, per) << shifts).sum(axis=2).astype(np.uint32).view(np.int32)
    if bits == 4:
        assert np.array_equal(packed, pack_int4(q))  # the two packers agree
    return packed


def ct_group(mode, cols):
    """The group compressed-tensors states for a layer: None (per channel)
    for one spanning the row."""
    g = group_of(mode, cols)
    return None if g >= cols else g


def quant_config(scheme, groups=(None,), targets=None, **weights):
    """A quantization_config with one config group per entry of `groups`
    (None: per channel), group k targeting targets[k] (default "Linear")."""
    fmt, bits, _ = SCHEMES[scheme]
    cg = OrderedDict()
    for k, group in enumerate(groups):
        w = OrderedDict(num_bits=bits, type="int", symmetric=True, strategy="group" if group else "channel",
                        group_size=group, dynamic=False, actorder=None)
        w.update(weights)
        cg["group_%d" % k] = OrderedDict(targets=targets[k] if targets else ["Linear"], weights=w,
                                         input_activations=None)
    return OrderedDict(quant_method="compressed-tensors", format=fmt, quantization_status="compressed",
                       config_groups=cg, ignore=["lm_head"])


def scheme_names(d, mode):
    """inspect's checkpoint_quantization of write_compressed(d, ...): its
    config groups' schemes in order."""
    names = []
    for n, (dt, shape, raw) in read_tensors(d).items():
        if is_linear(n):
            g = ct_group(mode, shape[1])
            name = "%s %s" % (mode, "group %d" % g if g else "per channel")
            if name not in names:
                names.append(name)
    return ", ".join(names)


def write_compressed(d, out, scheme, plain=()):
    """A compressed-tensors checkpoint of d's weights, quantized by the
    reference: weight (I8) or weight_packed (I32) + weight_shape (I64 [2]),
    and weight_scale in the weight's dtype, for every linear layer but those
    named in `plain` (left full precision and listed in `ignore`); every
    other tensor as it is. One config group per group size, targeting
    "Linear" when there is one, else its layers by exact name."""
    fmt, bits, mode = SCHEMES[scheme]
    q = quantized(d, mode)
    tensors, groups, targets = [], [], []
    for name, (dt, shape, raw) in read_tensors(d).items():
        if name not in q or name in plain:
            tensors.append((name, dt, shape, raw))
            continue
        qq, s = q[name]
        base = name[:-len("weight")]
        if fmt == "int-quantized":
            tensors.append((base + "weight", "I8", shape, qq.astype(np.int8).tobytes()))
        else:
            p = pack(qq, bits)
            tensors.append((base + "weight_packed", "I32", list(p.shape), p.astype("<i4").tobytes()))
            tensors.append((base + "weight_shape", "I64", [2], np.array(shape, "<i8").tobytes()))
        tensors.append((base + "weight_scale", dt, list(s.shape), st_util.encode(s, dt)))
        g = ct_group(mode, shape[1])
        if g not in groups:
            groups.append(g)
            targets.append([])
        targets[groups.index(g)].append(name[:-len(".weight")])  # exact module names
    cfg = st_util.read_config(str(d))
    cfg["quantization_config"] = quant_config(scheme, groups, targets if len(groups) > 1 else None)
    cfg["quantization_config"]["ignore"] += [n[:-len(".weight")] for n in plain]
    return write_model(d, out, tensors, cfg)


# ---- running ---------------------------------------------------------------------------

def _model(models, name):
    opts = dict(MODELS[name])
    d = models.get(opts.pop("arch"), opts.pop("preset", "tiny"), **opts)
    cfg = st_util.read_config(str(d))
    dtype = {t[0] for n, t in read_tensors(d).items() if is_linear(n)}
    assert len(dtype) == 1
    return d, cfg, dtype.pop()


def _prompts(vocab, seed):
    return [prompt_ids(vocab, 7, seed), prompt_ids(vocab, 11, seed + 1)]


def gen(ferry, d, prompts, tmp, *flags):
    """(output_ids [per prompt], logits [n_prompts, vocab]) of one run."""
    dump = Path(tmp) / "logits.bin"
    if dump.exists():
        dump.unlink()
    if len(prompts) == 1:  # one prompt: flat output_ids
        out, logits = ferry.generate(d, prompts[0], N_NEW, *flags, dump_logits=dump)
        return [out], logits
    return ferry.generate(d, prompts, N_NEW, *flags, dump_logits=dump)


def check_ref(ref, d, prompts, got, tol, what):
    """ferry's (tokens, logits) against llama_ref on checkpoint d."""
    out, logits = got
    m = ref(str(d))
    errs = []
    for i, p in enumerate(prompts):
        assert np.all(np.isfinite(logits[i]))
        err = rel_err(logits[i], llama_ref.last_logits(m, p))
        errs.append(err)
        assert err < tol, "%s: prompt %d: rel logit error %.3g >= %g" % (what, i, err, tol)
        check_greedy(str(d), m, p, out[i], N_NEW, tol)
    return max(errs)


def inspect_json(ferry, d, *flags):
    return json.loads(ferry.check("inspect", "--model", d, "--json", *flags).stdout)


def plan_json(ferry, d, *flags):
    return json.loads(ferry.check("plan", "--model", d, "--json", *flags).stdout)


def assert_identical(got, want, what):
    (out, logits), (wout, wlogits) = got, want
    assert out == wout, "%s: tokens %r, expected %r" % (what, out, wout)
    assert logits.shape == wlogits.shape
    if not np.array_equal(logits, wlogits):
        pytest.fail("%s: logits differ (max |diff| %.3g, rel %.3g)" % (
            what, float(np.max(np.abs(logits - wlogits))), rel_err(logits, wlogits)))


# ---- 1. numerics: --quantize against the reference on the dequantized weights -----------

@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_quantize_matches_reference(ferry, models, ref, work, name, mode):
    d, cfg, dtype = _model(models, name)
    # and a prompt of 19 tokens: prefill takes the kernels' many-token path
    prompts = _prompts(cfg["vocab_size"], MODELS[name]["seed"]) + [prompt_ids(cfg["vocab_size"], 19, 3)]
    got = gen(ferry, d, prompts, work, "--quantize", mode)
    deq = write_float(d, work / "deq", mode)
    check_ref(ref, deq, prompts, got, TOL, "%s --quantize %s" % (name, mode))
    # the quantization is visible: the full-precision model's logits are further away
    m = ref(str(d))
    far = max(rel_err(got[1][i], llama_ref.last_logits(m, p)) for i, p in enumerate(prompts))
    assert far > TOL, "--quantize %s gave the unquantized model's logits (rel %.3g)" % (mode, far)


# ---- 2. every placement gives the resident run's bits ----------------------------------

PLACE_MODELS = {
    "llama-f32-l4": dict(arch="llama", layers=4, seed=410),
    "qwen2-bf16": MODELS["qwen2-bf16"],
}
PLACEMENTS = ["host", "disk", "mixed", "split"]


def tiers_of(plan):
    return [g["tier"] for g in plan["groups"]]


def placement_flags(ferry, d, placement, conv, od):
    """Flags of a placement, and the tiers `ferry plan` gives it (embed first)."""
    groups = plan_json(ferry, d, *conv)["groups"]
    rest = [g["bytes"] for g in groups[1:]]  # layers..., head: execution order
    if placement == "host":
        flags, want = ["--max-memory-scope", "weights", "--max-memory", "device=0"], ["host"] * len(groups)
    elif placement == "disk":
        flags, want = list(DISK), ["disk"] * len(groups)
    elif placement == "mixed":
        # the first layer on the device, the next on host, the rest (embedding included) on disk
        flags = ["--max-memory-scope", "weights", "--max-memory", "device=%d,host=%d" % (rest[0], rest[1])]
        want = ["disk", "device", "host"] + ["disk"] * (len(rest) - 2)
    else:  # the CPU kernels behind separate device memory; small device and host budgets
        flags = ["--device", "cpu-split", "--max-memory-scope", "weights", "--max-memory", "device=%d,host=%d" % (rest[0] + rest[1], rest[2])]
        want = ["disk", "device", "device", "host"] + ["disk"] * (len(rest) - 3)
    if "disk" in want:
        flags += ["--offload-dir", od]
    got = tiers_of(plan_json(ferry, d, *conv, *flags))
    assert got == want, "%s: plan tiers %r, expected %r" % (placement, got, want)
    return flags


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("name", list(PLACE_MODELS))
def test_placements_identical(ferry, models, work, name, mode):
    opts = dict(PLACE_MODELS[name])
    d = models.get(opts.pop("arch"), opts.pop("preset", "tiny"), **opts)
    prompts = _prompts(st_util.read_config(str(d))["vocab_size"], 7)
    conv = ["--quantize", mode]
    plan = plan_json(ferry, d, *conv)
    assert mode in plan["conversion"], plan["conversion"]
    resident = gen(ferry, d, prompts, work, *conv)
    for placement in PLACEMENTS:
        flags = placement_flags(ferry, d, placement, conv, work / ("od-" + placement))
        assert_identical(gen(ferry, d, prompts, work, *conv, *flags), resident,
                         "%s --quantize %s, %s" % (name, mode, placement))


def snapshot(od):
    """{file: (inode, mtime_ns, size)} of the offload dir."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in Path(od).iterdir()}


def manifest(od):
    return json.loads((Path(od) / "ferry-offload.json").read_text())


def test_offload_dir_follows_the_conversion(ferry, models, ref, work):
    """The same conversion reuses the blobs; another one (the fingerprint
    covers it) rebuilds them and gives its own correct outputs."""
    opts = dict(PLACE_MODELS["llama-f32-l4"])
    d = models.get(opts.pop("arch"), "tiny", **opts)
    prompts = _prompts(st_util.read_config(str(d))["vocab_size"], 9)
    od = work / "od"
    runs = {}
    for conv in (["--quantize", "int4"], ["--quantize", "int8"], ["--quantize", "int8", "--weights-dtype", "bf16"]):
        what = " ".join(conv)
        runs[what] = resident = gen(ferry, d, prompts, work, *conv)
        before = snapshot(od) if od.exists() else {}
        old = manifest(od)["fingerprint"] if od.exists() else None
        assert_identical(gen(ferry, d, prompts, work, *conv, *DISK, "--offload-dir", od), resident,
                         "%s on disk (first run)" % what)
        built = snapshot(od)
        assert manifest(od)["fingerprint"] != old, "%s: the offload dir kept the fingerprint of %r" % (what, old)
        blobs = [b["file"] for b in manifest(od)["blobs"]]
        assert len(blobs) == 6  # embed, 4 layers, head
        for b in blobs:
            assert built[b][:2] != before.get(b, (None, None))[:2], "%s: %s was not rebuilt" % (what, b)
        # a restart with the same conversion rewrites nothing
        assert_identical(gen(ferry, d, prompts, work, *conv, *DISK, "--offload-dir", od), resident,
                         "%s on disk (restart)" % what)
        assert snapshot(od) == built, "%s: a restart with the same conversion rewrote the offload dir" % what
    # each conversion's own result (not the previous blobs'), and it is right
    assert runs["--quantize int4"][1].tolist() != runs["--quantize int8"][1].tolist()
    assert runs["--quantize int8"][1].tolist() != runs["--quantize int8 --weights-dtype bf16"][1].tolist()
    check_ref(ref, write_float(d, work / "deq8", "int8"), prompts, runs["--quantize int8"], TOL, "int8")


@pytest.mark.parametrize("mode", [
    "none",
    "int8",
    "int4",
])
def test_step_size_invariant(ferry, models, work, mode):
    """A 20-token prompt prefilled in one step and in steps of 10 gives the
    same bits, as it does for full-precision weights."""
    d, cfg, _ = _model(models, "llama-f32")
    prompt = [prompt_ids(cfg["vocab_size"], 20, 5)]
    one = gen(ferry, d, prompt, work, "--quantize", mode)
    assert_identical(gen(ferry, d, prompt, work, "--quantize", mode, "--max-step-tokens", 10), one,
                     "--quantize %s, prefill in steps of 10 vs one step" % mode)


# ---- 3. compressed-tensors checkpoints: the same bits in the engine ---------------------

SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def engine_bytes(d, mode, dtype=None):
    """Bytes of d's tensors in their engine form (inspect's engine_bytes):
    every tensor in `dtype` (default its own), the linear ones quantized by
    `mode` with scales in that dtype: int8 one byte per value and one scale
    per row, int4 a 32-bit word per 8 values and one scale per group of
    group_of(cols) columns."""
    total = 0
    for name, (dt, shape, raw) in read_tensors(d).items():
        size = SIZE[dtype or dt]
        if mode in (None, "none") or not is_linear(name):
            total += int(np.prod(shape)) * size
            continue
        rows, cols = shape
        if mode == "int8":
            total += rows * cols + rows * size
        else:
            total += rows * 4 * -(-cols // 8) + rows * (cols // group_of(mode, cols)) * size
    return total


ROUND_TRIP_MODELS = ["llama-f32", "llama-bf16", "qwen2-bf16", "llama-small-f32"]


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("name", ROUND_TRIP_MODELS)
def test_compressed_checkpoint(ferry, models, ref, work, name, scheme):
    d, cfg, dtype = _model(models, name)
    mode = SCHEMES[scheme][2]
    ct = write_compressed(d, work / "ct", scheme)
    prompts = _prompts(cfg["vocab_size"], 11)
    want = gen(ferry, d, prompts, work, "--quantize", mode)
    got = gen(ferry, ct, prompts, work)
    assert_identical(got, want, "%s %s checkpoint vs --quantize %s on the original" % (name, scheme, mode))
    # asking for the checkpoint's own scheme is no requantization
    assert_identical(gen(ferry, ct, prompts, work, "--quantize", mode), want,
                     "%s %s checkpoint with --quantize %s" % (name, scheme, mode))
    check_ref(ref, write_float(d, work / "deq", mode), prompts, got, TOL, "%s %s" % (name, scheme))
    # inspect: the scheme, and the engine bytes of --quantize MODE on the original
    info = inspect_json(ferry, ct)
    orig = inspect_json(ferry, d)
    assert info["checkpoint_quantization"] == scheme_names(d, mode), info
    assert orig["checkpoint_quantization"] == "none", orig
    assert info["quantized_tensors"] == 7 * cfg["num_hidden_layers"], info
    assert info["engine_bytes"] == engine_bytes(d, mode) == inspect_json(ferry, d, "--quantize", mode)["engine_bytes"]
    assert orig["engine_bytes"] == engine_bytes(d, None)
    assert info["engine_bytes"] < orig["engine_bytes"]
    assert mode in plan_json(ferry, d, "--quantize", mode)["conversion"]


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("name", ["llama-f32", "qwen2-bf16"])
def test_compressed_dequantized(ferry, models, ref, work, name, scheme):
    """--quantize none on a compressed checkpoint: q * scale, in the scales'
    dtype (BF16: the f32 product rounded to bf16) or in --weights-dtype."""
    d, cfg, dtype = _model(models, name)
    mode = SCHEMES[scheme][2]
    ct = write_compressed(d, work / "ct", scheme)
    prompts = _prompts(cfg["vocab_size"], 13)
    got = gen(ferry, ct, prompts, work, "--quantize", "none")
    info = inspect_json(ferry, ct, "--quantize", "none")
    assert info["quantized_tensors"] == 0 and info["engine_bytes"] == engine_bytes(d, None), info
    deq = write_float(d, work / "deq", mode, round_dequant=dtype)
    check_ref(ref, deq, prompts, got, TOL, "%s %s --quantize none" % (name, scheme))
    if dtype != "F32":
        got = gen(ferry, ct, prompts, work, "--quantize", "none", "--weights-dtype", "f32")
        deq32 = write_float(d, work / "deq32", mode)
        check_ref(ref, deq32, prompts, got, TOL, "%s %s --quantize none --weights-dtype f32" % (name, scheme))
        assert inspect_json(ferry, ct, "--quantize", "none", "--weights-dtype", "f32")["engine_bytes"] == \
            engine_bytes(d, None, "F32")


# ---- 4. refusals --------------------------------------------------------------------------

Q0 = "model.layers.0.self_attn.q_proj."  # the tensors the broken checkpoints break


def _edit_weights(**kw):
    def edit(qc):
        qc["config_groups"]["group_0"]["weights"].update(kw)
    return edit


def _edit_group(key, value):
    def edit(qc):
        qc["config_groups"]["group_0"][key] = value
    return edit


def _edit_top(key, value):
    def edit(qc):
        qc[key] = value
    return edit


W8A8 = OrderedDict(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True, group_size=None)

# (id, scheme, quantization_config edit, what the error line must contain)
CONFIG_REFUSALS = [
    ("gptq", "int4-pack", _edit_top("quant_method", "gptq"), ["quant_method", "gptq"]),
    ("awq", "int4-pack", _edit_top("quant_method", "awq"), ["quant_method", "awq"]),
    ("format", "int4-pack", _edit_top("format", "marlin-24"), ["format", "marlin-24"]),
    ("status", "int4-pack", _edit_top("quantization_status", "frozen"), ["quantization_status", "frozen"]),
    ("asymmetric", "int4-pack", _edit_weights(symmetric=False), ["symmetric"]),
    ("dynamic", "int8-int", _edit_weights(dynamic=True), ["dynamic"]),
    ("w8a8", "int8-int", _edit_group("input_activations", W8A8), ["input_activations"]),
    ("output-activations", "int8-int", _edit_group("output_activations", W8A8), ["output_activations"]),
    ("2-bits", "int4-pack", _edit_weights(num_bits=2), ["2 bits"]),
    ("tensor-strategy", "int8-int", _edit_weights(strategy="tensor"), ["strategy 'tensor'"]),
    ("float", "int8-int", _edit_weights(type="float"), ["type", "float"]),
    ("actorder", "int4-pack", _edit_weights(actorder="group"), ["weights.actorder"]),
    ("block-structure", "int8-int", _edit_weights(block_structure=[128, 128]), ["weights.block_structure"]),
    ("group-size", "int4-pack", _edit_weights(strategy="group", group_size=0), ["group_size"]),
    ("int4-int-quantized", "int4-pack", _edit_top("format", "int-quantized"), ["int-quantized"]),
]


def _scale_shape(t):
    dt, shape, raw = t[Q0 + "weight_scale"]
    t[Q0 + "weight_scale"] = [dt, [shape[0], shape[1] + 1], raw + raw[:shape[0] * SIZE[dt]]]


def _packed_size(t):
    dt, shape, raw = t[Q0 + "weight_packed"]
    t[Q0 + "weight_packed"] = [dt, [shape[0], shape[1] - 1], raw[:shape[0] * (shape[1] - 1) * 4]]


def _shape_disagrees(t):
    t[Q0 + "weight_shape"] = ["I64", [2], np.array([64, 56], "<i8").tobytes()]


def _no_scale(t):
    del t[Q0 + "weight_scale"]


def _scale_dtype(t):
    dt, shape, raw = t[Q0 + "weight_scale"]
    t[Q0 + "weight_scale"] = ["I32", shape, np.zeros(shape, "<i4").tobytes()]


def _packed_dtype(t):
    dt, shape, raw = t[Q0 + "weight_packed"]
    t[Q0 + "weight_packed"] = ["I64", [shape[0], shape[1] // 2], raw]


def _int8_shape(t):
    dt, shape, raw = t[Q0 + "weight"]
    t[Q0 + "weight"] = [dt, [shape[0] // 2, shape[1]], raw[:len(raw) // 2]]


# (id, scheme, tensor edit (changes {name: [dtype, shape, bytes]} in place), what the error line must contain)
TENSOR_REFUSALS = [
    ("scale-shape", "int4-pack", _scale_shape, [Q0 + "weight_scale", "shape"]),
    ("scale-shape-int8", "int8-int", _scale_shape, [Q0 + "weight_scale", "shape"]),
    ("packed-size", "int4-pack", _packed_size, [Q0 + "weight_packed", "shape"]),
    ("packed-size-int8", "int8-pack", _packed_size, [Q0 + "weight_packed", "shape"]),
    ("weight-shape", "int4-pack", _shape_disagrees, [Q0 + "weight_shape"]),
    ("no-scale", "int4-pack", _no_scale, [Q0 + "weight_scale"]),
    ("no-scale-int8", "int8-int", _no_scale, [Q0 + "weight_scale"]),
    ("scale-dtype", "int8-int", _scale_dtype, [Q0 + "weight_scale", "I32"]),
    ("packed-dtype", "int4-pack", _packed_dtype, [Q0 + "weight_packed", "I64"]),
    ("int8-shape", "int8-int", _int8_shape, [Q0 + "weight", "shape"]),
]


def assert_refused(ferry, d, needles, *flags, commands=("generate", "inspect")):
    """Each command fails with one line holding every needle."""
    for cmd in commands:
        args = [cmd, "--model", d] + list(flags)
        if cmd == "generate":
            args += ["--prompt-ids", "1,2,3", "--max-new-tokens", 2]
        line = assert_ferry_error(ferry.run(*args), needles[0])
        for n in needles[1:]:
            assert n.lower() in line.lower(), "%s: %r does not name %r" % (cmd, line, n)


@pytest.mark.parametrize("case", CONFIG_REFUSALS, ids=[c[0] for c in CONFIG_REFUSALS])
def test_config_refused(ferry, models, work, case):
    _, scheme, edit, needles = case
    d, _, _ = _model(models, "llama-f32")
    ct = write_compressed(d, work / "ct", scheme)
    cfg = st_util.read_config(str(ct))
    edit(cfg["quantization_config"])
    st_util.write_config(str(ct), cfg)
    assert_refused(ferry, ct, ["quantization_config"] + needles, commands=("generate", "inspect", "plan"))


@pytest.mark.parametrize("case", TENSOR_REFUSALS, ids=[c[0] for c in TENSOR_REFUSALS])
def test_tensors_refused(ferry, models, work, case):
    _, scheme, edit, needles = case
    d, _, _ = _model(models, "llama-f32")
    ct = write_compressed(d, work / "ct", scheme)
    st = st_util.read(str(ct / "model.safetensors"))
    t = OrderedDict((n, [dt, shape, raw]) for n, dt, shape, raw in st.entries())
    edit(t)
    st_util.write_entries(str(ct / "model.safetensors"), [(n, *v) for n, v in t.items()])
    assert_refused(ferry, ct, needles)


@pytest.mark.parametrize("scheme,mode", [("int8-int", "int4"), ("int8-pack", "int4"), ("int4-pack", "int8")])
def test_requantize_refused(ferry, models, work, scheme, mode):
    d, _, _ = _model(models, "llama-f32")
    ct = write_compressed(d, work / "ct", scheme)
    assert_refused(ferry, ct, ["requantized", mode, "--quantize none"], "--quantize", mode,
                   commands=("generate", "inspect", "plan"))


@pytest.mark.parametrize("flag", ["--quantize", "--weights-dtype"])
@pytest.mark.parametrize("cmd", ["generate", "plan", "inspect", "bench"])
def test_bad_conversion_flags(ferry, models, cmd, flag):
    d, _, _ = _model(models, "llama-f32")
    for value in ("bogus", "INT8" if flag == "--quantize" else "F32", "int2" if flag == "--quantize" else "fp8"):
        args = [cmd, "--model", d, flag, value]
        if cmd == "generate":
            args += ["--prompt-ids", "1,2,3", "--max-new-tokens", 2]
        line = assert_ferry_error(ferry.run(*args), flag)
        assert value in line, line


# ---- 5. NaN and Inf weights -----------------------------------------------------------------

@pytest.mark.parametrize("name,bad,mode,where", [
    ("llama-f32", np.nan, "int8", ()),
    ("llama-f32", np.inf, "int4", DISK),
    ("llama-bf16", -np.inf, "int8", ("--max-memory-scope", "weights", "--max-memory", "device=0")),
    ("llama-bf16", np.nan, "int4", ("--device", "cpu-split")),
])
def test_nonfinite_weight_refused(ferry, models, work, name, bad, mode, where):
    d, _, dtype = _model(models, name)
    target = "model.layers.1.mlp.up_proj.weight"
    t = OrderedDict((n, [dt, shape, raw]) for n, (dt, shape, raw) in read_tensors(d).items())
    dt, shape, raw = t[target]
    x = as_f32(dt, shape, raw)
    x[3, 5] = bad
    t[target][2] = st_util.encode(x, dt)
    m = write_model(d, work / "m", [(n, *v) for n, v in t.items()])
    od = work / "od"
    p = ferry.run("generate", "--model", m, "--prompt-ids", "1,2,3", "--max-new-tokens", 2, "--quantize", mode,
                  *where, *(("--offload-dir", od) if where == DISK else ()))
    line = assert_ferry_error(p, target, rcs=(1,))
    for want in ("row 3", "column 5", "NaN" if np.isnan(bad) else ("+Inf" if bad > 0 else "-Inf")):
        assert want in line, "%r does not say %r" % (line, want)
    if where == DISK:  # refused while the blobs were written: as test_offload's failed builds
        names = sorted(f.name for f in od.iterdir())
        assert "ferry-offload.json" not in names, "a failed build must not leave a manifest: %r" % names
        assert not [n for n in names if ".tmp." in n], "temporary files left behind: %r" % names


# ---- 6. input dims that the int4 group does not divide -----------------------------------------

def test_groups_divide_the_columns(models):
    """llama-small-f32 (in the numerics and round-trip tests) has down_proj
    with 688 = 16 * 43 input columns, which neither 128, 64 nor 32 divides:
    int4 per channel; q/k/v/gate/up with 256: two groups of 128; the tiny
    models have 64 and 128 columns: one group a row."""
    d, cfg, _ = _model(models, "llama-small-f32")
    assert cfg["hidden_size"] % GROUP == 0 and cfg["intermediate_size"] % 32 != 0
    assert "llama-small-f32" in ROUND_TRIP_MODELS
    q = quantized(d, "int4")
    qq, s = q["model.layers.0.mlp.down_proj.weight"]
    assert qq.shape == (cfg["hidden_size"], 688) and s.shape == (cfg["hidden_size"], 1)
    assert q["model.layers.0.mlp.up_proj.weight"][1].shape == (688, 2)
    tiny = st_util.read_config(str(_model(models, "llama-f32")[0]))
    assert tiny["hidden_size"] < GROUP and tiny["intermediate_size"] == GROUP


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory):
    """qwen3 with hidden 160 (int4 groups of 32) and intermediate 196 (which
    no group of 32 or more divides: per channel; not a multiple of 8 either:
    a partial int4 word per row), head_dim 40."""
    d = tmp_path_factory.mktemp("odd") / "m"
    st_util.random_checkpoint(str(d), arch="qwen3", seed=7, hidden=160, intermediate=196, layers=2, heads=4,
                              kv_heads=2, head_dim=40, vocab=96, scale=0.1)
    return d


@pytest.fixture(scope="module")
def smol_model(tmp_path_factory):
    """SmolLM2-135M's proportions in small: hidden 192 = 3 heads of 64 (128
    does not divide it, as it does not divide SmolLM2's 576: int4 groups of
    64 for q/k/v/o/gate/up) and intermediate 512 (down_proj: groups of 128)."""
    d = tmp_path_factory.mktemp("smol") / "m"
    st_util.random_checkpoint(str(d), arch="llama", seed=8, hidden=192, intermediate=512, layers=2, heads=3,
                              kv_heads=1, head_dim=64, vocab=96, scale=0.1)
    return d


def ct_module_scheme(qc, module):
    """The config group of quantization_config qc that claims `module` as
    compressed-tensors does (utils/match.py: an exact name, "re:" + a regex
    matched from the start, or the class "Linear"; `ignore` wins), or None.
    Every module must be claimed by one group at most."""
    import re

    def match(target):
        if target.startswith("re:"):
            return re.match(target[3:], module) is not None
        return target in (module, "Linear")

    if any(match(t) for t in qc["ignore"]):
        return None
    groups = [g for g in qc["config_groups"].values() if any(match(t) for t in g["targets"])]
    assert len(groups) <= 1, "%s: claimed by %d config groups" % (module, len(groups))
    return groups[0] if groups else None


@pytest.mark.parametrize("which", ["smol", "odd"])
def test_int4_export_is_what_compressed_tensors_loads(ferry, ref, work, smol_model, odd_model, which):
    """--quantize int4 where 128 does not divide the columns: every layer's
    group divides its columns (compressed-tensors refuses other checkpoints:
    "tensor column shape must be divisible by the given group_size"), the
    numerics are the reference's with those groups, ferry warns once at
    startup and inspect says so; the export states each layer's scheme in a
    config group (targets matched as compressed-tensors matches them) whose
    group_size gives exactly the scale's columns, and reloads to the same
    tokens and logits."""
    d = smol_model if which == "smol" else odd_model
    cfg = st_util.read_config(str(d))
    prompts = _prompts(96, 23) + [prompt_ids(96, 19, 6)]
    p = ferry.check("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 1, "--quantize", "int4")
    warned = [ln for ln in p.stderr.decode().splitlines() if "128 does not divide" in ln]
    assert len(warned) == 1 and warned[0].startswith("ferry: warning: --quantize int4: "), p.stderr.decode()
    got = gen(ferry, d, prompts, work, "--quantize", "int4")
    check_ref(ref, write_float(d, work / "deq", "int4"), prompts, got, TOL, "%s --quantize int4" % which)

    linear = {n: shape for n, (dt, shape, raw) in read_tensors(d).items() if is_linear(n)}
    regrouped = sum(1 for _, cols in linear.values() if cols > GROUP and cols % GROUP)
    info = inspect_json(ferry, d, "--quantize", "int4")
    assert info["regrouped_tensors"] == regrouped > 0, info
    want_schemes = {}
    for n, (rows, cols) in linear.items():
        g = ct_group("int4", cols)
        key = "int4 group %d" % g if g else "int4 per channel"
        want_schemes[key] = want_schemes.get(key, 0) + 1
    assert {x["scheme"]: x["tensors"] for x in info["quantized_schemes"]} == want_schemes, info
    text = ferry.check("inspect", "--model", d, "--quantize", "int4").stdout.decode()
    assert "%d tensors have input columns that 128 does not divide" % regrouped in text, text

    ex = work / "ex"
    ferry.check("export", "--model", d, "--quantize", "int4", "--out", ex)
    qc = st_util.read_config(str(ex))["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized", qc
    assert qc["quantization_status"] == "compressed" and "lm_head" in qc["ignore"], qc
    for g in qc["config_groups"].values():
        w = g["weights"]
        assert set(g) >= {"targets", "weights"} and g["targets"], g
        assert w["num_bits"] == 4 and w["type"] == "int" and w["symmetric"] is True, w
        assert (w["strategy"], w["group_size"] is None) in (("group", False), ("channel", True)), w
    out = read_tensors(ex)
    for n, (rows, cols) in linear.items():
        module = n[:-len(".weight")]
        g = ct_module_scheme(qc, module)
        assert g is not None, "%s: no config group targets it" % module
        sdt, sshape, _ = out[module + ".weight_scale"]
        group = g["weights"]["group_size"] or cols
        assert cols % group == 0, "%s: group_size %d does not divide %d columns" % (module, group, cols)
        assert sshape == [rows, cols // group], (module, sshape, g["weights"])
        assert out[module + ".weight_packed"][1] == [rows, -(-cols // 8)]
        assert group == group_of("int4", cols), (module, group)
    for lm in ("lm_head", "model.embed_tokens"):
        assert ct_module_scheme(qc, lm) is None
    assert_identical(gen(ferry, ex, prompts, work), got, "%s: the int4 export reloaded" % which)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_odd_dims(ferry, ref, work, odd_model, mode):
    d = odd_model
    prompts = _prompts(96, 17) + [prompt_ids(96, 19, 4)]
    got = gen(ferry, d, prompts, work, "--quantize", mode)
    check_ref(ref, write_float(d, work / "deq", mode), prompts, got, TOL, "odd dims --quantize %s" % mode)
    # and a compressed checkpoint of those bits: exactly the same run
    ct = write_compressed(d, work / "ct", "int8-pack" if mode == "int8" else "int4-pack")
    want = gen(ferry, d, prompts[:2], work, "--quantize", mode)
    assert_identical(gen(ferry, ct, prompts[:2], work), want, "odd dims, compressed %s" % mode)
    assert inspect_json(ferry, ct)["engine_bytes"] == engine_bytes(d, mode)


# ---- 6b. int8 per group: compressed-tensors' W8A16 preset from 0.19 ------------------------------

@pytest.fixture(scope="module")
def w8_model(tmp_path_factory):
    """A llama whose every linear layer has a multiple of 128 input columns
    (hidden 256, intermediate 384): what a W8A16 group-128 checkpoint needs."""
    d = tmp_path_factory.mktemp("w8g") / "m"
    st_util.random_checkpoint(str(d), arch="llama", seed=9, hidden=256, intermediate=384, layers=2, heads=4,
                              kv_heads=2, vocab=96, scale=0.1)
    return d


@pytest.mark.parametrize("fmt", ["int-quantized", "pack-quantized"])
@pytest.mark.parametrize("sdt", ["F32", "BF16"])
def test_int8_group_checkpoint(ferry, ref, work, w8_model, fmt, sdt):
    """A checkpoint in compressed-tensors' W8A16 preset as 0.19+ defines it
    (int8, strategy "group", group_size 128: weight_scale [rows, cols / 128]),
    written here with numpy (int8 I8 or four to an I32 word; scales in F32 or
    BF16): ferry loads it (it used to refuse "strategy 'group'"), its logits
    are the PyTorch reference's on the dequantized weights (q * scale in f32)
    within TOL, inspect names the scheme, and its export says the same
    scheme and reloads to the same bits."""
    d = w8_model
    group = 128
    tensors, deq = [], []
    for name, (dt, shape, raw) in read_tensors(d).items():
        x = as_f32(dt, shape, raw)
        if not is_linear(name):
            tensors.append((name, dt, shape, raw))
            deq.append((name, "F32", shape, st_util.encode(x, "F32")))
            continue
        x = round_to(x, sdt)  # the weight in the scales' dtype, as compressed-tensors quantizes it
        q, s = ref_numpy(x, sdt, "int8", group=group)
        assert s.shape == (shape[0], shape[1] // group)
        base = name[:-len("weight")]
        if fmt == "int-quantized":
            tensors.append((base + "weight", "I8", shape, q.astype(np.int8).tobytes()))
        else:
            p = pack(q, 8)
            tensors.append((base + "weight_packed", "I32", list(p.shape), p.astype("<i4").tobytes()))
            tensors.append((base + "weight_shape", "I64", [2], np.array(shape, "<i8").tobytes()))
        tensors.append((base + "weight_scale", sdt, list(s.shape), st_util.encode(s, sdt)))
        w = q.astype(np.float32) * np.repeat(s.astype(np.float32), group, axis=1)
        deq.append((name, "F32", shape, st_util.encode(w, "F32")))
    cfg = st_util.read_config(str(d))
    cfg["quantization_config"] = OrderedDict(
        quant_method="compressed-tensors", format=fmt, quantization_status="compressed",
        config_groups={"group_0": OrderedDict(
            targets=["Linear"], weights=OrderedDict(num_bits=8, type="int", symmetric=True, strategy="group",
                                                   group_size=group, dynamic=False, actorder=None,
                                                   observer="minmax"),
            input_activations=None, output_activations=None, format=fmt)},
        ignore=["lm_head"])
    ct = write_model(d, work / "ct", tensors, cfg)
    ref_dir = write_model(d, work / "deq", deq)
    prompts = _prompts(96, 29) + [prompt_ids(96, 19, 8)]
    got = gen(ferry, ct, prompts, work)
    err = check_ref(ref, ref_dir, prompts, got, TOL, "W8A16 group 128 (%s, %s scales)" % (fmt, sdt))
    print("W8A16 group 128, %s, %s scales: rel logit error %.3g" % (fmt, sdt, err))
    info = inspect_json(ferry, ct)
    assert info["checkpoint_quantization"] == "int8 group 128", info
    assert info["quantized_schemes"] == [{"scheme": "int8 group 128", "tensors": 14}], info
    # the quantization is visible: the full-precision model is further away
    far = rel_err(got[1][0], llama_ref.last_logits(ref(str(d)), prompts[0]))
    assert far > TOL, far
    ex = work / "ex"
    ferry.check("export", "--model", ct, "--out", ex)
    qc = st_util.read_config(str(ex))["quantization_config"]
    (g,) = qc["config_groups"].values()
    assert g["weights"]["num_bits"] == 8 and g["weights"]["strategy"] == "group" and g["weights"]["group_size"] == 128
    out = read_tensors(ex)
    assert out["model.layers.0.mlp.down_proj.weight_scale"][1] == [256, 3]
    assert_identical(gen(ferry, ex, prompts, work), got, "W8A16 group 128 export reloaded")


# ---- 7. --weights-dtype ---------------------------------------------------------------------------

def write_cast(d, out, dtype):
    """d's tensors stored in dtype (rounded to nearest even)."""
    tensors = [(n, dtype, shape, st_util.encode(as_f32(dt, shape, raw), dtype))
               for n, (dt, shape, raw) in read_tensors(d).items()]
    return write_model(d, out, tensors)


@pytest.mark.parametrize("name,dtype,mode", [
    ("llama-f32", "bf16", "none"),
    ("llama-f32", "bf16", "int8"),
    ("qwen3-f32", "bf16", "int4"),
    ("llama-small-f32", "f16", "int4"),
    ("qwen2-bf16", "f32", "int8"),
])
def test_weights_dtype(ferry, models, ref, work, name, dtype, mode):
    """Every weight is converted to --weights-dtype first, and quantized from
    there (scales in that dtype): the reference on those weights, and
    exactly ferry's run of a checkpoint stored in that dtype."""
    d, cfg, ckpt_dtype = _model(models, name)
    DT = dtype.upper()
    conv = ["--weights-dtype", dtype, "--quantize", mode]
    prompts = _prompts(cfg["vocab_size"], 19)
    got = gen(ferry, d, prompts, work, *conv)
    want = write_float(d, work / "want", None if mode == "none" else mode, dtype=DT)
    check_ref(ref, want, prompts, got, TOL, "%s %s" % (name, " ".join(conv)))
    cast = write_cast(d, work / "cast", DT)
    assert_identical(got, gen(ferry, cast, prompts, work, "--quantize", mode),
                     "%s %s vs the checkpoint stored in %s" % (name, " ".join(conv), dtype))
    info = inspect_json(ferry, d, *conv)
    assert "weights-dtype=%s" % DT.lower() in info["conversion"].lower(), info["conversion"]
    assert info["engine_bytes"] == engine_bytes(d, mode, DT)
    assert info["engine_bytes"] == inspect_json(ferry, cast, "--quantize", mode)["engine_bytes"]
    if SIZE[DT] != SIZE[ckpt_dtype]:
        assert (info["engine_bytes"] < engine_bytes(d, mode)) == (SIZE[DT] < SIZE[ckpt_dtype])
    # the conversion is visible: the checkpoint's own dtype gives other logits
    assert not np.array_equal(got[1], gen(ferry, d, prompts, work, "--quantize", mode)[1])


def test_partly_quantized_checkpoint_exports_its_ignore_list(ferry, models, work):
    """A compressed-tensors checkpoint that leaves a linear layer unquantized
    (its ignore list) loads with that layer full precision, and ferry's
    converted export names it in ignore (other consumers must not look for
    its weight_packed) and reloads to the same logits."""
    d, cfg, _ = _model(models, "llama-f32")
    plain = ("model.layers.0.self_attn.q_proj.weight",)
    ct = write_compressed(d, work / "ct", "int4-pack", plain=plain)
    prompts = _prompts(cfg["vocab_size"], 31)
    want = gen(ferry, ct, prompts, work)
    ferry.check("export", "--model", ct, "--out", work / "ex")
    qc = st_util.read_config(str(work / "ex"))["quantization_config"]
    assert qc["ignore"] == ["lm_head", "model.layers.0.self_attn.q_proj"], qc["ignore"]
    names = set(json.loads((work / "ex" / "model.safetensors.index.json").read_text())["weight_map"])
    assert "model.layers.0.self_attn.q_proj.weight" in names and "model.layers.0.self_attn.k_proj.weight_packed" in names
    assert_identical(gen(ferry, work / "ex", prompts, work), want, "export of a partly quantized checkpoint")
