"""ferry's weight quantizer (engine/weights/quant.c, driven through
build/tests/quant_tool) against two independent references, bit for bit:

- `ref_numpy`: the formulas of docs/quantization.md written in numpy from the
  math (f32 arithmetic, explicit rounding to the weight/scale dtypes);
- `ref_torch`: the sequence of PyTorch ops compressed-tensors runs for a
  symmetric min-max weight observer (calculate_qparams, then _quantize, then
  pack_to_int32), on torch tensors of the weight's dtype, so PyTorch itself
  decides every rounding.

Both must equal ferry's data and scales exactly, for F32, F16 and BF16
weights (scales in the weight's dtype), int8 per channel and int4 with
the group `--quantize int4` takes (128, or 64 / 32 / per channel where 128
does not divide the columns: int4_group), over rows of zeros, outliers,
exact .5 ties and column counts that are not multiples of 8 or 128 or
shorter than a group. A NaN or Inf
weight must be refused with one line naming the tensor, row and column.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import st_util
from conftest import ferry_path

try:  # the numpy reference runs without torch; the torch one needs it (make deps installs it)
    import torch
except ImportError:  # pragma: no cover
    torch = None

# int4 groups (int4_group): 128 (128, 256), one group of a short row (1, 7,
# 100), 64 (576, SmolLM2's hidden size), 32 (160), per channel (130, 300, 1000)
COLS = [1, 7, 100, 128, 130, 160, 256, 300, 576, 1000]
DTYPES = ["F32", "F16", "BF16"]
EPS = {"F32": 2.0 ** -23, "F16": 2.0 ** -10, "BF16": 2.0 ** -7}
TORCH_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
# mode: (q_min, q_max, group or None for per channel; int4: int4_group(cols))
MODES = {"int8": (-128, 127, None), "int4": (-8, 7, "int4_group")}


def int4_group(cols):
    """The int4 group of a row of `cols` columns (docs/quantization.md,
    "Columns that 128 does not divide"): 128 where it divides, the whole row
    up to 128 columns, else the largest of 64 and 32 that divides, else the
    whole row (per channel)."""
    if cols % 128 == 0 or cols <= 128:
        return min(cols, 128)
    for g in (64, 32):
        if cols % g == 0:
            return g
    return cols


def group_of(mode, cols):
    """Input columns per scale of `mode` for a row of `cols` columns."""
    group = MODES[mode][2]
    return cols if group is None else int4_group(cols)


def tool_path():
    return str(Path(ferry_path()).resolve().parent / "tests" / "quant_tool")


def run_tool(*args):
    tool = tool_path()
    if not os.access(tool, os.X_OK):
        pytest.fail("%s not built (make unit or make integration builds it)" % tool)
    return subprocess.run([tool] + [str(a) for a in args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=120)


# ---- numpy reference, from the math of docs/quantization.md -----------------

def round_to(a, dtype):
    """float32 array rounded to nearest-even in dtype, returned as float32."""
    a = np.asarray(a, dtype=np.float32)
    if dtype == "F32":
        return a
    if dtype == "F16":
        return a.astype(np.float16).astype(np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def ref_numpy(x, dtype, mode, group=None):
    """x: float32 [rows, cols] holding values of dtype. Returns (q int8
    [rows, cols], scales float32 [rows, n_groups]); `group` overrides the
    mode's (int8 per group, as compressed-tensors' W8A16 preset from 0.19)."""
    q_min, q_max, _ = MODES[mode]
    rows, cols = x.shape
    g = group or group_of(mode, cols)
    n_groups = -(-cols // g)
    # a short last group is the group zero-padded: zeros change no absmax
    xp = np.zeros((rows, n_groups * g), np.float32)
    xp[:, :cols] = x
    amax = np.abs(xp.reshape(rows, n_groups, g)).max(axis=2)
    half_range = np.float32((q_max - q_min) / 2)                 # 127.5 or 7.5
    s = round_to(amax / half_range, dtype)                        # f32 quotient, rounded to the dtype
    s = np.where(s == 0, np.float32(EPS[dtype]), s).astype(np.float32)
    s_col = np.repeat(s, g, axis=1)[:, :cols]
    t = round_to(x / s_col, dtype)                                # quotient in the dtype
    q = np.clip(np.rint(t), q_min, q_max).astype(np.int8)         # rint: half to even
    return q, s


def pack_int4(q):
    """q int8 [rows, cols] in [-8, 7] -> int32 [rows, ceil(cols / 8)]: element
    c is (q + 8) in bits 4*(c % 8) of word c // 8; padding nibbles 0."""
    rows, cols = q.shape
    words = -(-cols // 8)
    u = np.zeros((rows, words * 8), np.uint32)
    u[:, :cols] = (q.astype(np.int32) + 8).astype(np.uint32)
    shifts = (4 * np.arange(8, dtype=np.uint32))
    packed = (u.reshape(rows, words, 8) << shifts).sum(axis=2, dtype=np.uint64).astype(np.uint32)
    return packed.view(np.int32)


# ---- torch reference: compressed-tensors' op sequence -----------------------

def ref_torch(x, dtype, mode):
    q_min, q_max, _ = MODES[mode]
    w = torch.from_numpy(np.ascontiguousarray(x)).to(getattr(torch, TORCH_DTYPE[dtype]))
    rows, cols = w.shape
    g = group_of(mode, cols)
    n_groups = -(-cols // g)
    wp = torch.nn.functional.pad(w, (0, n_groups * g - cols))     # zero padding, as for BLOCK
    obs = wp.unflatten(-1, (n_groups, g))
    min_vals = torch.min(obs.amin(dim=-1), torch.zeros(1, dtype=w.dtype))
    max_vals = torch.max(obs.amax(dim=-1), torch.zeros(1, dtype=w.dtype))
    bit_min, bit_max = torch.tensor(float(q_min)), torch.tensor(float(q_max))
    max_val_pos = torch.max(torch.abs(min_vals), torch.abs(max_vals))
    scales = max_val_pos / (float(bit_max - bit_min) / 2)
    eps = torch.finfo(scales.dtype).eps
    scales = torch.where(scales == 0, torch.tensor(eps, dtype=scales.dtype), scales)
    scaled = obs / scales.unsqueeze(-1)
    if scaled.dtype == torch.float16:
        # Debian's CPU torch 1.13 has no Half clamp/round; widening an f16
        # value is exact, and so are clamping and rounding it in f32
        scaled = scaled.float()
    q = torch.round(torch.clamp(scaled, bit_min, bit_max)).to(torch.int8)
    q = q.flatten(-2)[:, :cols]
    return q.numpy(), scales.float().numpy()


# ---- inputs ---------------------------------------------------------------------

def make_weight(rows_seed, cols, dtype, mode):
    rng = np.random.default_rng(rows_seed * 7919 + cols)
    rows = []
    rows.append(np.zeros(cols))                                    # all zero
    rows.append(rng.standard_normal(cols) * 0.02)                  # typical
    r = rng.standard_normal(cols) * 0.02
    r[rng.integers(cols)] = 300.0                                  # one huge outlier
    rows.append(r)
    r = rng.standard_normal(cols) * 1e-3
    r[cols // 2] = -5e4 if dtype != "F16" else -6e4                # negative outlier
    rows.append(r)
    half = 127.5 if mode == "int8" else 7.5                        # exact .5 ties
    k = int(2 * half) + 1
    rows.append(((np.arange(cols) % k) - (k - 1) / 2) * 0.5 * (2 * half / (k - 1)))
    rows.append(rng.uniform(-1, 1, cols) * 1e-6)                   # tiny
    rows.append(np.where(rng.random(cols) < 0.5, 0.0, rng.standard_normal(cols)))
    rows.append(rng.standard_normal(cols) * 10 ** rng.uniform(-3, 2))
    x = np.stack(rows).astype(np.float32)
    return round_to(x, dtype)


def write_input(path, dtype, mode):
    tensors = {}
    for cols in COLS:
        tensors["layers.%d.proj.weight" % cols] = make_weight(1, cols, dtype, mode)
    tensors["norm.weight"] = np.linspace(-1, 1, 16).astype(np.float32)  # 1-D: copied through
    st_util.write(str(path), tensors, dtype=dtype)
    return tensors


def raw_scales(st, name, dtype):
    buf = st.raw(name)
    return np.frombuffer(buf, dtype="<f4" if dtype == "F32" else "<u2")


def expected_scale_bits(s, dtype):
    s = np.asarray(s, np.float32)
    if dtype == "F32":
        return s.reshape(-1)
    if dtype == "F16":
        return s.astype(np.float16).view(np.uint16).reshape(-1)
    return (s.view(np.uint32) >> 16).astype(np.uint16).reshape(-1)


# ---- the tests ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_bit_exact(work, dtype, mode):
    src, dst = work / "in.safetensors", work / "out.safetensors"
    tensors = write_input(src, dtype, mode)
    p = run_tool(mode, src, dst)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    out = st_util.read(str(dst))
    assert out.array("norm.weight").tolist() == st_util.read(str(src)).array("norm.weight").tolist()
    for name, x in tensors.items():
        if x.ndim != 2:
            continue
        rows, cols = x.shape
        q_np, s_np = ref_numpy(x, dtype, mode)
        if torch is not None:
            # the two references agree with each other first
            q_t, s_t = ref_torch(x, dtype, mode)
            assert np.array_equal(q_np, q_t), "%s: numpy and torch references differ" % name
            assert np.array_equal(expected_scale_bits(s_np, dtype), expected_scale_bits(s_t, dtype))
        n_groups = s_np.shape[1]
        info = out.info(name + "_scale")
        assert info["dtype"] == dtype and info["shape"] == [rows, n_groups], (name, info)
        got_s = raw_scales(out, name + "_scale", dtype)
        want_s = expected_scale_bits(s_np, dtype)
        bad = np.nonzero(got_s != want_s)[0]
        assert bad.size == 0, "%s: %d scales differ, first at %d: ferry %r, want %r" % (
            name, bad.size, bad[0], got_s[bad[0]], want_s[bad[0]])
        if mode == "int8":
            info = out.info(name)
            assert info["dtype"] == "I8" and info["shape"] == [rows, cols], info
            got = out.array(name)
            want = q_np
        else:
            assert name not in out.names
            info = out.info(name + "_packed")
            assert info["dtype"] == "I32" and info["shape"] == [rows, -(-cols // 8)], info
            shape = out.info(name + "_shape")
            assert shape["dtype"] == "I64" and shape["shape"] == [2]
            assert out.array(name + "_shape").tolist() == [rows, cols]
            got = out.array(name + "_packed")
            want = pack_int4(q_np)
        bad = np.argwhere(got != want)
        assert bad.size == 0, "%s: %d values differ, first at %s: ferry %r, want %r (x=%r)" % (
            name, len(bad), tuple(bad[0]), got[tuple(bad[0])], want[tuple(bad[0])],
            x[bad[0][0], bad[0][1] if mode == "int8" else bad[0][1] * 8])


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_inputs_tell_the_quotient_dtype_apart(dtype):
    """Guards the test data: on the weights test_bit_exact uses, quantizing
    with the f32 quotient (not rounded to the weight's dtype) gives other
    integers, so a quantizer that divided in f32 would fail there."""
    differ = 0
    for mode in MODES:
        for cols in COLS:
            x = make_weight(1, cols, dtype, mode)
            q, s = ref_numpy(x, dtype, mode)
            q_min, q_max, _ = MODES[mode]
            g = group_of(mode, cols)
            s_col = np.repeat(s, g, axis=1)[:, :cols]
            q32 = np.clip(np.rint(x / s_col), q_min, q_max).astype(np.int8)
            differ += int((q32 != q).sum())
    assert differ > 0


@pytest.mark.parametrize("dtype,bad", [("F32", np.nan), ("F16", np.inf), ("BF16", -np.inf)])
def test_nonfinite_refused(work, dtype, bad):
    x = np.ones((4, 10), np.float32)
    x[2, 5] = bad
    src, dst = work / "in.safetensors", work / "out.safetensors"
    st_util.write(str(src), {"ok.weight": np.ones((2, 3), np.float32), "bad.weight": x}, dtype=dtype)
    for mode in ("int8", "int4"):
        p = run_tool(mode, src, dst)
        err = p.stderr.decode(errors="replace")
        lines = [l for l in err.splitlines() if l.strip()]
        assert p.returncode == 1, (p.returncode, err)
        assert len(lines) == 1, err
        assert lines[0].startswith("quant_tool: "), err
        assert "bad.weight" in lines[0] and "row 2" in lines[0] and "column 5" in lines[0], err
        assert ("NaN" if np.isnan(bad) else "Inf") in lines[0], err
        assert not dst.exists(), "a failed run must not leave an output file"
