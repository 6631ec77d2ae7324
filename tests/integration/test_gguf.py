"""The GGUF container reader (engine/weights/gguf.c, issue 31) against the
`gguf` package's GGUFReader, which ferry did not write: every metadata entry
(type and value, arrays in full) and every tensor (name, shape, type, data
offset and size) of real files - llama.cpp's vocabulary GGUFs and
SmolLM2-135M-Instruct's - and of files the `gguf` package's writer makes
with every tensor type ferry's reader knows. Then damaged files, each made
from a good one by changing the bytes of one field, refused in one line
naming what is wrong.

Everything runs through build/tests/gguf_tool (tests/tools/gguf_tool.c),
which prints what the reader read as JSON."""

import json
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import refdata
from conftest import ferry_path

gguf = refdata.client("gguf")


def run_tool(*args):
    exe = Path(ferry_path()).resolve().parent / "tests" / "gguf_tool"
    return subprocess.run([str(exe)] + [str(a) for a in args], capture_output=True, timeout=120)


def tool(path):
    p = run_tool(path)
    out = p.stdout.decode()
    if p.returncode == 1:
        assert out.startswith("ERR "), out
        return out.strip()
    assert p.returncode == 0, (p.returncode, p.stderr.decode())
    return json.loads(out)


def hx(b):
    return bytes(b).hex()


def reference(path):
    """What GGUFReader reads, in gguf_tool's shape."""
    r = gguf.GGUFReader(str(path))
    kv = []
    head = {}
    for name, f in r.fields.items():
        t = int(f.types[0])
        if name.startswith("GGUF."):  # the reader's own entries for the file head
            head[name] = int(np.asarray(f.parts[f.data[0]]).reshape(-1)[0])
            continue
        if t == 9:  # array
            it = int(f.types[1])
            if it == 8:
                items = [hx(f.parts[i]) for i in f.data]
            else:
                items = [np.asarray(f.parts[i]).reshape(-1)[0].item() for i in f.data]
            value = {"type": it, "items": items}
        elif t == 8:
            value = hx(f.parts[f.data[0]])
        else:
            value = np.asarray(f.parts[f.data[0]]).reshape(-1)[0].item()
        kv.append({"key": name.encode().hex(), "type": t, "value": value})
    tensors = [{"name": t.name.encode().hex(), "dims": [int(d) for d in t.shape], "type": int(t.tensor_type),
                "offset": int(t.data_offset), "nbytes": int(t.n_bytes)} for t in r.tensors]
    return head, kv, tensors


def assert_same(path):
    got = tool(path)
    assert isinstance(got, dict), got
    head, kv, tensors = reference(path)
    assert got["version"] == head["GGUF.version"], (got["version"], head)
    assert (len(got["kv"]), len(got["tensors"])) == (head["GGUF.kv_count"], head["GGUF.tensor_count"]), head
    assert len(got["kv"]) == len(kv), (len(got["kv"]), len(kv))
    for g, w in zip(got["kv"], kv):
        assert g["key"] == w["key"] and g["type"] == w["type"], (bytes.fromhex(w["key"]), g["type"], w["type"])
        if isinstance(w["value"], float):
            assert g["value"] == pytest.approx(w["value"], rel=1e-7), bytes.fromhex(w["key"])
        elif isinstance(w["value"], dict) and w["value"]["type"] in (6, 12):
            assert g["value"]["type"] == w["value"]["type"]
            assert np.allclose(g["value"]["items"], w["value"]["items"], rtol=1e-7, atol=0), bytes.fromhex(w["key"])
        else:
            assert g["value"] == w["value"], bytes.fromhex(w["key"])
    assert len(got["tensors"]) == len(tensors)
    for g, w in zip(got["tensors"], tensors):
        assert g["name"] == w["name"] and g["type"] == w["type"] and g["nbytes"] == w["nbytes"], (g, w)
        # GGUFReader's shape is ggml's dims; its offset counts from the file's start
        assert g["dims"] == w["dims"], (bytes.fromhex(g["name"]), g["dims"], w["dims"])
        assert got["data_offset"] + g["offset"] == w["offset"], bytes.fromhex(g["name"])
        assert g["found"], bytes.fromhex(g["name"])
    return got


# ---- real files --------------------------------------------------------------

def vocab_files():
    files = sorted(refdata.need(refdata.LLAMA_CPP).glob("ggml-vocab-*.gguf"))
    assert len(files) >= 10, files
    return files


def test_every_vocab_gguf_is_read():
    """All of llama.cpp's vocabulary files parse, each with its token list
    whole (tokens, scores or merges as long as the metadata says)."""
    for f in vocab_files():
        got = tool(f)
        assert isinstance(got, dict), (f.name, got)
        kv = {bytes.fromhex(e["key"]).decode(): e for e in got["kv"]}
        tokens = kv["tokenizer.ggml.tokens"]["value"]
        assert tokens["type"] == 8 and len(tokens["items"]) > 1000, f.name
        for other in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            if other in kv:
                assert len(kv[other]["value"]["items"]) == len(tokens["items"]), (f.name, other)


# GGUFReader takes about 2 s a megabyte (a numpy view per string): compared
# item for item on three vocabularies, SentencePiece and BPE, GGUF 2 and 3
@pytest.mark.slow
def test_vocab_ggufs_read_as_gguf_reads_them():
    versions = set()
    for name in ("llama-spm", "phi-3", "aquila"):
        versions.add(assert_same(refdata.need(refdata.LLAMA_CPP / ("ggml-vocab-%s.gguf" % name)))["version"])
    assert versions == {2, 3}, versions


@pytest.mark.slow
def test_smollm2_gguf_reads_as_gguf_reads_it():
    f = next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))
    got = assert_same(f)
    names = {bytes.fromhex(t["name"]).decode() for t in got["tensors"]}
    assert "token_embd.weight" in names and "blk.29.ffn_down.weight" in names, sorted(names)[:5]
    types = {t["type_name"] for t in got["tensors"]}
    assert {"Q4_1", "Q8_0", "F32"} <= types, types


# ---- files the gguf package writes: every tensor type ----------------------------

BLOCKS = {  # type: (elements, bytes) per block, as ggml defines them (Q8_1, never stored, is not read)
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22),
    "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292), "I8": (1, 1),
    "I16": (1, 2), "I32": (1, 4), "I64": (1, 8), "F64": (1, 8),
}


def write_gguf(path, tensors, kv=None, alignment=None, arch="llama", split_max_tensors=0):
    """A GGUF written by the gguf package; tensors: [(name, type name, rows,
    cols)] with random raw bytes, or [(name, type name, raw bytes)]; kv
    values: str, bool, int (u32), float (f32), list, or (value, "u64"/"i32")
    to choose the type. split_max_tensors: split as gguf-split does (the
    package's writer names the parts PATH-0000k-of-0000N.gguf); the first
    part's path is returned."""
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if alignment:
        w.add_custom_alignment(alignment)
    for k, v in (kv or {}).items():
        if isinstance(v, tuple):
            {"u64": w.add_uint64, "i32": w.add_int32, "f32": w.add_float32}[v[1]](k, v[0])
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
    rng = np.random.default_rng(7)
    for name, tname, *shape in tensors:
        if len(shape) == 1:
            raw = shape[0]
        else:
            el, nb = BLOCKS[tname]
            raw = rng.integers(0, 256, size=(shape[0], shape[1] // el * nb), dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    parts = sorted(path.parent.glob(path.stem + "-0*-of-*.gguf")) if split_max_tensors else []
    return parts[0] if parts else path


def test_every_tensor_type_written_by_gguf(tmp_path):
    tensors = [("t.%s" % t, t, 3, 512) for t in BLOCKS]
    kv = {"test.str": "héllo", "test.u32": 7, "test.f32": 0.5, "test.bool": True, "test.list": [1, 2, 3],
          "test.strs": ["a", "", "ünï"]}
    f = write_gguf(tmp_path / "all.gguf", tensors, kv)
    got = assert_same(f)
    assert [t["type_name"] for t in got["tensors"]] == list(BLOCKS)
    f = write_gguf(tmp_path / "align.gguf", tensors[:3], alignment=64)
    got = assert_same(f)
    assert got["alignment"] == 64 and got["data_offset"] % 64 == 0


# ---- damaged files ------------------------------------------------------------------

def layout(data):
    """Byte positions of a good file's fields: {field: offset}. Walks it as the format says."""
    pos = {"version": 4, "n_tensors": 8, "n_kv": 16}
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    p = 24
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(p, t):
        if t == 8:
            (n,) = struct.unpack_from("<Q", data, p)
            return p + 8 + n
        if t == 9:
            it, n = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(n):
                p = skip_value(p, it)
            return p
        return p + sizes[t]

    def string_at(p):
        (n,) = struct.unpack_from("<Q", data, p)
        return data[p + 8:p + 8 + n].decode(), p + 8 + n

    for i in range(n_kv):
        key, after = string_at(p)
        pos["key:" + key] = p
        p = after
        (t,) = struct.unpack_from("<I", data, p)
        pos["type:" + key] = p
        p = skip_value(p + 4, t)
    for i in range(n_tensors):
        name, after = string_at(p)
        pos["tensor:" + name] = p
        p = after
        (nd,) = struct.unpack_from("<I", data, p)
        pos["ndims:" + name] = p
        pos["dims:" + name] = p + 4
        p += 4 + 8 * nd
        pos["ttype:" + name] = p
        pos["offset:" + name] = p + 4
        p += 12
    pos["end_of_infos"] = p
    return pos


@pytest.fixture
def good(tmp_path):
    f = write_gguf(tmp_path / "good.gguf", [("a.weight", "Q8_0", 2, 64), ("b.weight", "F32", 2, 8)],
                   {"general.alignment": 32, "x.aaaa": "one", "x.bbbb": "two"})
    data = bytearray(f.read_bytes())
    assert isinstance(tool(f), dict)
    return tmp_path, data, layout(data)


def refused(tmp_path, data, *words):
    f = tmp_path / "bad.gguf"
    f.write_bytes(bytes(data))
    got = tool(f)
    assert isinstance(got, str) and got.startswith("ERR "), got
    for w in words:
        assert w in got, (w, got)
    assert "\n" not in got


def test_damaged_files_are_refused_naming_the_field(good):
    tmp, data, pos = good

    def patched(at, fmt, value):
        d = bytearray(data)
        struct.pack_into(fmt, d, at, value)
        return d

    def renamed(at, old, new):
        d = bytearray(data)
        assert d[at + 8:at + 8 + len(old)] == old and len(old) == len(new)
        d[at + 8:at + 8 + len(new)] = new
        return d

    refused(tmp, b"GGML" + data[4:], "not a GGUF file")
    refused(tmp, patched(4, "<I", 1), "GGUF version 1")
    refused(tmp, patched(4, "<I", 3 << 24), "big-endian")
    refused(tmp, patched(pos["n_kv"], "<Q", 1 << 60), "metadata count", "more than the file can hold")
    refused(tmp, patched(pos["n_tensors"], "<Q", 1 << 60), "tensor count", "more than the file can hold")
    # metadata: a key's length past the end, an unknown value type, a key given twice
    refused(tmp, patched(pos["key:x.bbbb"], "<Q", 1 << 40), "metadata entry", "runs past the end of the file")
    refused(tmp, patched(pos["type:x.bbbb"], "<I", 13), "x.bbbb", "not a GGUF type")
    refused(tmp, renamed(pos["key:x.bbbb"], b"x.bbbb", b"x.aaaa"), "metadata 'x.aaaa' is given twice")
    # general.alignment: not a power of two, and of another type
    at = pos["type:general.alignment"]
    refused(tmp, patched(at + 4, "<I", 24), "general.alignment 24 is not a power of two")
    refused(tmp, patched(at, "<I", 5), "general.alignment is a int32")
    # tensors: dimensions, type, row length, offset, overlap, a name twice
    refused(tmp, patched(pos["ndims:a.weight"], "<I", 5), "a.weight", "5 dimensions")
    refused(tmp, patched(pos["dims:a.weight"], "<Q", 0), "a.weight", "dimension 0 is 0")
    refused(tmp, patched(pos["dims:a.weight"] + 8, "<Q", 1 << 62), "a.weight", "dimension 1")
    refused(tmp, patched(pos["ttype:a.weight"], "<I", 19), "a.weight", "tensor type 19")
    refused(tmp, patched(pos["dims:a.weight"], "<Q", 48), "a.weight", "not whole Q8_0 blocks of 32")
    refused(tmp, patched(pos["offset:b.weight"], "<Q", 8), "b.weight", "not a multiple of the alignment (32)")
    refused(tmp, patched(pos["offset:b.weight"], "<Q", 0), "overlap")
    refused(tmp, patched(pos["offset:b.weight"], "<Q", 1 << 20), "b.weight", "runs past the end of the file")
    refused(tmp, renamed(pos["tensor:b.weight"], b"b.weight", b"a.weight"), "'a.weight' is listed twice")
    # every cut of the head, and of the data, refused: never read past the end
    for cut in list(range(0, pos["end_of_infos"], 5)) + [len(data) - 1]:
        refused(tmp, data[:cut])


# ---- dequantization: bit-equal to the gguf package's ---------------------------------

DEQUANT = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
SCALE_AT = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the fp16 scales in a block


def blocks_of(tname, rows, cols, rng):
    """Raw blocks: quantized from normal values where the package can, else
    random bytes with finite fp16 scales (the K-quants)."""
    qt = gguf.GGMLQuantizationType[tname]
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    if tname == "F32":
        return x.view(np.uint8).reshape(rows, -1)
    if tname == "F16":
        return x.astype(np.float16).view(np.uint8).reshape(rows, -1)
    if tname not in SCALE_AT:
        return gguf.quants.quantize(x, qt)
    el, nb = BLOCKS[tname]
    raw = rng.integers(0, 256, size=(rows, cols // el, nb), dtype=np.uint8)
    for at in SCALE_AT[tname]:
        raw[:, :, at:at + 2] = (rng.standard_normal((rows, cols // el)) * 0.05).astype(np.float16).view(
            np.uint8).reshape(rows, cols // el, 2)
    return raw.reshape(rows, -1)


def dequant_tool(path, name, out):
    p = run_tool(path, "--dequant", name, out)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return np.fromfile(out, dtype=np.float32)


def test_dequantization_is_bit_equal_to_the_gguf_package(tmp_path):
    rng = np.random.default_rng(11)
    raws = {t: blocks_of(t, 4, 512, rng) for t in DEQUANT}
    write_gguf(tmp_path / "q.gguf", [("t." + t, t, raws[t]) for t in DEQUANT])
    for t in DEQUANT:
        want = gguf.quants.dequantize(raws[t], gguf.GGMLQuantizationType[t]).astype(np.float32).reshape(-1)
        got = dequant_tool(tmp_path / "q.gguf", "t." + t, tmp_path / (t + ".f32"))
        assert got.shape == want.shape, (t, got.shape, want.shape)
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (t, int((~same).sum()), got[~same][:4], want[~same][:4])


def test_smollm2_tensors_dequantize_as_the_gguf_package_does(tmp_path):
    f = next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))
    r = gguf.GGUFReader(str(f))
    seen = set()
    for t in r.tensors:
        tname = gguf.GGMLQuantizationType(int(t.tensor_type)).name
        if tname in seen or int(t.n_elements) > 1 << 20:
            continue
        seen.add(tname)
        want = gguf.quants.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType(int(t.tensor_type)))
        want = np.asarray(want, dtype=np.float32).reshape(-1)
        got = dequant_tool(f, t.name, tmp_path / "t.f32")
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (t.name, tname)
    assert {"Q4_1", "F32"} <= seen, seen
