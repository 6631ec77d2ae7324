"""`ferry export` (engine/export.h): the loaded weights written back as a
Hugging Face checkpoint, read from wherever they live.

- round trips: an export of the converted weights (bf16, int8, int4) loads
  without converting again and gives the exporting engine's logits bit for
  bit; an original-layout export of an unconverted model holds the
  checkpoint's tensors byte for byte, and of a quantized one the PyTorch
  reference on it gives ferry's logits;
- the files pass the reference parser (PyPI safetensors, numpy) and the
  index is consistent;
- every placement (host, disk, mixed, cpu-split) exports the same bytes,
  mixtures of experts with experts on every tier included;
- failures leave nothing: ENOSPC (fault hook), kill -9 (slow-write knob
  FERRY_EXPORT_DELAY_MS), refused names and symlinks, an existing export.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import llama_ref
import st_util
from conftest import assert_ferry_error

DISK = ("--max-memory", "device=0,host=0")
PROMPTS = [[1, 5, 9, 3, 7, 2, 11], [4, 8, 15, 16, 23, 42, 6, 1, 2, 3, 9]]


def export(ferry, model, out, *flags, env=None):
    return ferry.run("export", "--model", model, "--out", out, *flags, env=env)


def export_ok(ferry, model, out, *flags):
    p = export(ferry, model, out, *flags)
    assert p.returncode == 0, p.stderr.decode()
    return Path(out)


def logits_of(ferry, model, work, *flags):
    dump = Path(work) / "logits.bin"
    if dump.exists():
        dump.unlink()
    out, logits = ferry.generate(model, PROMPTS, 4, *flags, dump_logits=dump)
    return out, logits


def tensors(d):
    """{name: (dtype, shape, bytes)} over every safetensors file of d."""
    got = {}
    for f in st_util.model_files(str(d)):
        for name, dt, shape, raw in st_util.read(os.path.join(str(d), f)).entries():
            assert name not in got, name
            got[name] = (dt, shape, raw)
    return got


def check_files(d):
    """The reference parser reads every shard; the index names every tensor
    once, in the file that holds it; total_size is the tensors' bytes."""
    d = Path(d)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in d.glob("model-*.safetensors"))
    n = len(shards)
    assert shards == ["model-%05d-of-%05d.safetensors" % (k + 1, n) for k in range(n)]
    seen, total = {}, 0
    try:
        from safetensors.numpy import load_file
        from safetensors.torch import load_file as load_file_pt  # numpy has no bfloat16
    except ImportError:
        load_file = None  # `make deps` installs it in build/venv
    for s in shards:
        header = st_util.read(str(d / s))
        for name, dt, shape, raw in header.entries():
            seen[name] = s
            total += len(raw)
        if load_file is not None:
            bf16 = any(dt == "BF16" for _, dt, _, _ in header.entries())
            arrays = load_file_pt(str(d / s)) if bf16 else load_file(str(d / s))
            assert sorted(arrays) == sorted(n for n, _, _, _ in header.entries())
            for name, dt, shape, raw in header.entries():
                a = arrays[name]
                assert list(a.shape) == shape
                if bf16:
                    a = a.contiguous().view(-1).view(torch.uint8).numpy()
                assert a.tobytes() == raw, name
    assert idx["weight_map"] == seen
    assert idx["metadata"]["total_size"] == total
    dots = sorted(p.name for p in d.glob(".*"))
    assert dots == [".ferry-export.json"], "an export holds its marker and nothing hidden besides: %r" % dots
    marker = json.loads((d / ".ferry-export.json").read_text())
    assert marker["ferry_export"] == 1 and marker["layout"] in ("converted", "original")


def leftovers(root):
    return sorted(p.name for p in Path(root).iterdir() if p.name.startswith(".ferry-export-"))


# ---- round trips ----------------------------------------------------------------------

@pytest.mark.parametrize("conv", [("--weights-dtype", "bf16"), ("--quantize", "int8"), ("--quantize", "int4")],
                         ids=["bf16", "int8", "int4"])
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_converted_round_trip(ferry, models, work, preset, conv):
    d = models.get("llama", preset, seed=1301)
    ex = export_ok(ferry, d, work / "ex", *conv)
    check_files(ex)
    assert_same = logits_of(ferry, d, work, *conv), logits_of(ferry, ex, work)
    (want_ids, want), (got_ids, got) = assert_same
    assert got_ids == want_ids
    assert np.array_equal(got, want), "max |diff| %g" % float(np.max(np.abs(got - want)))
    info = json.loads(ferry.check("inspect", "--model", ex, "--json").stdout)
    text = json.dumps(info)
    assert "quantize=as-checkpoint" in text and "weights-dtype=as-checkpoint" in text
    names = tensors(ex)
    if conv[0] == "--quantize":
        cfg = st_util.read_config(str(ex))
        qc = cfg["quantization_config"]
        assert qc["format"] == "pack-quantized" and qc["quant_method"] == "compressed-tensors"
        w = qc["config_groups"]["group_0"]["weights"]
        assert w["num_bits"] == (8 if conv[1] == "int8" else 4)
        assert "model.layers.0.self_attn.q_proj.weight_packed" in names
        assert names["model.layers.0.self_attn.q_proj.weight_packed"][0] == "I32"
        assert names["model.layers.0.self_attn.q_proj.weight_shape"][0] == "I64"
        assert "model.layers.0.self_attn.q_proj.weight" not in names
    else:
        assert {dt for dt, _, _ in names.values()} == {"BF16"}
        assert st_util.read_config(str(ex))["torch_dtype"] == "bfloat16"
    # the export needs no conversion: its engine bytes are what it holds
    assert "conversion" in text


def test_int8_packing_is_compressed_tensors(ferry, models, work):
    """pack-quantized 8-bit: q + 128 as a byte, four to a little-endian int32."""
    d = models.get("llama", "tiny", seed=1302)
    ex = export_ok(ferry, d, work / "ex", "--quantize", "int8")
    t = tensors(ex)
    dt, shape, raw = t["model.layers.0.mlp.down_proj.weight_packed"]
    rows, cols = np.frombuffer(t["model.layers.0.mlp.down_proj.weight_shape"][2], "<i8")
    packed = np.frombuffer(raw, "<i4").reshape(shape)
    q = ((packed[:, :, None] >> (8 * np.arange(4))) & 0xFF).reshape(rows, -1)[:, :cols].astype(np.int64) - 128
    assert q.min() >= -128 and q.max() <= 127 and np.abs(q).max() >= 127  # compressed-tensors' range


@pytest.mark.parametrize("tied", [False, True])
def test_original_unconverted_is_byte_identical(ferry, models, work, tied):
    d = models.get("llama", "tiny", dtype="bf16", seed=1303, tied=tied)
    ex = export_ok(ferry, d, work / "ex", "--layout", "original")
    check_files(ex)
    assert tensors(ex) == tensors(d)
    got, want = st_util.read_config(str(ex)), st_util.read_config(str(d))
    want.pop("torch_dtype", None), got.pop("torch_dtype")
    assert got == want


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_original_of_quantized_matches_reference(ferry, models, ref, work, mode):
    d = models.get("llama", "small", seed=1304)
    ex = export_ok(ferry, d, work / "ex", "--layout", "original", "--quantize", mode)
    check_files(ex)
    assert "quantization_config" not in st_util.read_config(str(ex))
    assert set(tensors(ex)) == set(tensors(d))
    ids, logits = logits_of(ferry, d, work, "--quantize", mode)
    m = llama_ref.load_model(str(ex))
    for i, p in enumerate(PROMPTS):
        want = llama_ref.last_logits(m, p)
        err = float(np.max(np.abs(logits[i] - want)) / np.max(np.abs(want)))
        assert err < 1e-4, "prompt %d: rel error %g" % (i, err)


def test_every_placement_exports_the_same_bytes(ferry, models, work):
    d = models.get("llama", "small", seed=1305)
    conv = ("--quantize", "int8")
    groups = json.loads(ferry.check("plan", "--model", d, "--json", *conv).stdout)["groups"]
    rest = [g["bytes"] for g in groups if g["bytes"]]
    runs = {
        "resident": (),
        "disk": DISK + ("--offload-dir", work / "od-disk"),
        # every tier at once: device, host and disk groups
        "mixed": ("--max-memory-scope", "weights", "--max-memory", "device=%d,host=%d" % (rest[0], rest[1]), "--offload-dir", work / "od-mixed"),
        "split": ("--device", "cpu-split", "--max-memory-scope", "weights", "--max-memory", "device=%d,host=%d" % (rest[0] + rest[1], rest[2]),
                  "--offload-dir", work / "od-split"),
    }
    files = {}
    for name, flags in runs.items():
        ex = export_ok(ferry, d, work / ("ex-" + name), *conv, *flags, "--max-shard-size", "1MiB")
        files[name] = {p.name: p.read_bytes() for p in ex.iterdir()}
    assert len([f for f in files["resident"] if f.endswith(".safetensors")]) > 1  # several shards
    for name in runs:
        assert files[name] == files["resident"], name
    check_files(work / "ex-mixed")


@pytest.mark.parametrize("arch", ["mixtral", "qwen3moe"])
def test_moe_experts_export_from_every_tier(ferry, models, work, arch):
    """A mixture of experts with its experts on the device, host and disk
    (one blob per layer's run of disk experts, read by region) exports the
    checkpoint's tensors byte for byte, the same as all-resident."""
    d = models.get(arch, "small", dtype="bf16", seed=1310)
    groups = json.loads(ferry.check("plan", "--model", d, "--json").stdout)["groups"]
    dense = sum(g["bytes"] for g in groups if "expert" not in g and g["name"] != "embed")
    expert = max(g["bytes"] for g in groups if "expert" in g)
    runs = {
        "resident": (),
        "mixed": ("--max-memory-scope", "weights", "--max-memory", "device=%d,host=%d" % (dense + 3 * expert, 5 * expert), "--offload-dir",
                  work / "od-mixed"),
        "split-disk": ("--device", "cpu-split", "--max-memory-scope", "weights", "--max-memory", "device=%d,host=0" % dense, "--offload-dir",
                       work / "od-split"),
    }
    for name, flags in runs.items():
        ex = export_ok(ferry, d, work / ("ex-" + name), "--layout", "original", *flags)
        check_files(ex)
        assert tensors(ex) == tensors(d), name
    plan = json.loads(ferry.check("plan", "--model", d, "--json", *runs["mixed"]).stdout)
    tiers = {g["tier"] for g in plan["groups"] if "expert" in g}
    assert tiers == {"device", "host", "disk"}, tiers


def test_moe_int8_round_trip(ferry, models, work):
    """Converted export of a mixture of experts (int8 experts, the router
    unquantized as compressed-tensors leaves gates) gives the exporting
    engine's logits bit for bit."""
    d = models.get("qwen3moe", "small", seed=1311)
    ex = export_ok(ferry, d, work / "ex", "--quantize", "int8")
    check_files(ex)
    names = tensors(ex)
    assert "model.layers.1.mlp.experts.3.up_proj.weight_packed" in names
    assert "model.layers.1.mlp.gate.weight" in names and "model.layers.1.mlp.gate.weight_packed" not in names
    (want_ids, want), (got_ids, got) = logits_of(ferry, d, work, "--quantize", "int8"), logits_of(ferry, ex, work)
    assert got_ids == want_ids
    assert np.array_equal(got, want), "max |diff| %g" % float(np.max(np.abs(got - want)))


def test_memory_is_bounded(ferry, models, work):
    """Peak RSS during an export from disk: one group plus the write buffer."""
    d = models.get("llama", "small", seed=1306)
    p = ferry.check("export", "--model", d, "--out", work / "ex", "--json", *DISK, "--offload-dir", work / "od")
    r = json.loads(p.stdout)
    group = max(g["bytes"] for g in json.loads(ferry.check("plan", "--model", d, "--json", *DISK,
                                                           "--offload-dir", work / "od").stdout)["groups"])
    grew = r["rss_peak"] - r["rss_before"]
    assert grew <= group + (4 << 20) + (4 << 20), "RSS grew %d bytes during the export (group %d)" % (grew, group)


# ---- failures leave nothing -----------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 22, 24])
def test_enospc_fails_cleanly(ferry, models, work, n):
    d = models.get("llama", "tiny", seed=1307)
    root = work / "root"
    root.mkdir()
    p = export(ferry, d, root / "ex", env=dict(os.environ, FERRY_FAULT="write_enospc=%d" % n))
    assert_ferry_error(p, ["no space left"])
    assert list(root.iterdir()) == []


def slow_export(ferry_bin, model, out, ms_per_mib, *flags):
    env = dict(os.environ, FERRY_EXPORT_DELAY_MS=str(ms_per_mib))
    return subprocess.Popen([ferry_bin, "export", "--model", str(model), "--out", str(out)] + list(flags),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.parametrize("point", ["start", "middle"])
def test_kill9_leaves_the_previous_export(ferry, ferry_bin, models, work, point):
    d = models.get("llama", "tiny", seed=1308)
    root = work / "root"
    root.mkdir()
    export_ok(ferry, d, root / "ex")
    before = {q.name: q.read_bytes() for q in (root / "ex").iterdir()}
    proc = slow_export(ferry_bin, d, root / "ex", 12000, "--overwrite", "--quantize", "int8")
    try:
        deadline = time.time() + 60
        if point == "start":  # its temporary directory exists
            while not leftovers(root) and time.time() < deadline:
                time.sleep(0.01)
        else:  # half the bytes written: the progress lines say so
            for line in proc.stdout:
                pct = int(line.split()[1].rstrip(b"%")) if line.startswith(b"export: ") else 0
                if 50 <= pct < 90 or time.time() > deadline:
                    break
        assert proc.poll() is None, "the export ended before the kill"
        assert leftovers(root)
    finally:
        proc.kill()
        proc.wait()
    assert {q.name: q.read_bytes() for q in (root / "ex").iterdir()} == before
    assert leftovers(root), "the killed export's temporary should still be there"
    export_ok(ferry, d, root / "other")  # the next export removes it
    assert leftovers(root) == []


def test_cancel_by_signal(ferry_bin, models, work):
    d = models.get("llama", "tiny", seed=1309)
    root = work / "root"
    root.mkdir()
    proc = slow_export(ferry_bin, d, root / "ex", 4000)
    deadline = time.time() + 60
    while not leftovers(root) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"cancelled" in err, err
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("out", ["..", ".", "bad name", "x" * 129, "a:b"])
def test_bad_names_refused(ferry, models, work, out):
    d = models.get("llama", "tiny", seed=1310)
    root = work / "root"
    root.mkdir()
    p = export(ferry, d, str(root) + "/" + out)
    assert_ferry_error(p, ["not allowed"])
    assert list(root.iterdir()) == []


def test_symlinks_refused(ferry, models, work):
    d = models.get("llama", "tiny", seed=1311)
    root, elsewhere = work / "root", work / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "ex").symlink_to(elsewhere)
    for flags in [(), ("--overwrite",)]:
        p = export(ferry, d, root / "ex", *flags)
        assert_ferry_error(p, ["not a directory"])
    assert list(elsewhere.iterdir()) == [] and (root / "ex").is_symlink()
    (work / "link").symlink_to(root)  # a root that is a symlink
    assert_ferry_error(export(ferry, d, work / "link" / "ex2"), ["symlink"])
    assert sorted(q.name for q in root.iterdir()) == ["ex"]


def test_existing_export(ferry, models, work):
    d = models.get("llama", "tiny", seed=1312)
    root = work / "root"
    root.mkdir()
    export_ok(ferry, d, root / "ex")
    first = tensors(root / "ex")
    assert_ferry_error(export(ferry, d, root / "ex", "--quantize", "int8"), ["already exists"])
    assert tensors(root / "ex") == first
    export_ok(ferry, d, root / "ex", "--quantize", "int8", "--overwrite")
    assert "model.layers.0.mlp.up_proj.weight_packed" in tensors(root / "ex")
    assert sorted(q.name for q in root.iterdir()) == ["ex"]
    check_files(root / "ex")


def test_missing_root_and_bad_layout(ferry, models, work):
    d = models.get("llama", "tiny", seed=1313)
    assert_ferry_error(export(ferry, d, work / "nope" / "ex"), ["no such file"])
    assert_ferry_error(export(ferry, d, work / "ex", "--layout", "hf"), ["--layout"], rcs=(2,))


def test_overwrite_replaces_only_exports(ferry, models, work):
    """--overwrite replaces a ferry export, never another directory under
    the root (the model dir, say): that is refused and left as it was."""
    d = models.get("llama", "tiny", seed=1314)
    root = work / "root"
    root.mkdir()
    mine = root / "mine"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    assert_ferry_error(export(ferry, d, mine, "--overwrite"), ["not an export of ferry"])
    assert sorted(p.name for p in mine.iterdir()) == ["config.json"]
    assert sorted(p.name for p in root.iterdir()) == ["mine"]


def test_stale_temporaries_by_lock(ferry, models, work):
    """A temporary nobody holds a lock on is stale, whatever PID its name
    has: removed; one that a live holder locks stays; a previous export left
    aside (.old) by a killed swap goes back under its name."""
    import fcntl
    d = models.get("llama", "tiny", seed=1315)
    root = work / "root"
    root.mkdir()
    export_ok(ferry, d, root / "prev")
    (root / "prev").rename(root / ".ferry-export-prev.old.0123456789abcdef")
    held = root / ".ferry-export-busy.tmp.1"
    held.mkdir()
    stale = root / (".ferry-export-x.tmp.%d" % os.getpid())  # a live PID: no longer a reason to keep it
    stale.mkdir()
    (stale / "model-00001-of-00001.safetensors").write_bytes(b"x" * 64)
    fd = os.open(str(held), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        export_ok(ferry, d, root / "new")
        assert sorted(p.name for p in root.iterdir()) == [held.name, "new", "prev"]
        check_files(root / "prev")
    finally:
        os.close(fd)
