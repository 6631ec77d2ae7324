"""The offload dir (the disk tier): layout and manifest, reuse across
restarts, rebuilds when the inputs change or a blob is damaged, and the I/O
faults of engine/base/fault.h (FERRY_FAULT): short reads, EIO, ENOSPC.

Every run that succeeds must give the tokens and logits of the all-resident
run of the same checkpoint.
"""

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import st_util
from conftest import assert_ferry_error, copy_model, prompt_ids, rel_err

N_NEW = 8
SAME = 1e-6
DISK = ("--max-memory", "device=0,host=0")
MANIFEST = "ferry-offload.json"
LOCK = "ferry-offload.lock"

# ---- CRC-32C (Castagnoli, reflected 0x82F63B78), as the manifest records it

_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data):
    crc = 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_crc32c_helper():
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value


# ---- helpers


def _prompts(vocab):
    return [prompt_ids(vocab, 7, 1), prompt_ids(vocab, 11, 2)]


def gen(ferry, d, od, *flags, tmp, env=None):
    """Runs generate with everything on disk (unless flags say otherwise);
    returns (output_ids, logits)."""
    vocab = st_util.read_config(d)["vocab_size"]
    dump = Path(tmp) / "logits.bin"
    args = list(DISK) + ["--offload-dir", od] + list(flags) if od is not None else list(flags)
    if env is None:
        return ferry.generate(d, _prompts(vocab), N_NEW, *args, dump_logits=dump)
    spec = ";".join(",".join(str(t) for t in p) for p in _prompts(vocab))
    p = ferry.run("generate", "--model", d, "--prompt-ids", spec, "--max-new-tokens", N_NEW, "--json",
                  "--dump-logits", dump, *args, env=dict(os.environ, **env))
    return p


def assert_same(got, want, what=""):
    (out, logits), (wout, wlogits) = got, want
    assert out == wout, "%s: tokens %r, all-resident %r" % (what, out, wout)
    assert logits.shape == wlogits.shape
    err = rel_err(logits, wlogits)
    assert err <= SAME, "%s: rel logit error %.3g vs all-resident" % (what, err)


def snapshot(od):
    """{name: (inode, mtime_ns, size)} of every file in the offload dir."""
    out = {}
    for p in Path(od).iterdir():
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out


def manifest(od):
    return json.loads((Path(od) / MANIFEST).read_text())


def blob_names(od):
    return sorted(b["file"] for b in manifest(od)["blobs"])


def temp_files(od):
    return sorted(p.name for p in Path(od).iterdir() if ".tmp." in p.name)


def check_manifest(od, keys, allow_tmp=False):
    """The manifest lists exactly `keys` in order; each blob is KEY.bin, its
    size a multiple of 4096 equal to the file's, its CRC-32C right (checked
    here for blobs up to 1 MiB: the Python CRC is slow); no other files are
    there but the lock file (and temporary files of killed runs when
    allow_tmp)."""
    m = manifest(od)
    assert "format" in m and isinstance(m["fingerprint"], str) and m["fingerprint"]
    assert [b["key"] for b in m["blobs"]] == keys
    for b in m["blobs"]:
        assert b["file"] == b["key"] + ".bin"
        p = Path(od) / b["file"]
        assert p.stat().st_size == b["size"] and b["size"] % 4096 == 0 and b["size"] > 0
        if b["size"] <= 1 << 20:
            assert int(b["crc32c"], 16) == crc32c(p.read_bytes()), "%s: CRC-32C does not match" % b["file"]
    names = [p.name for p in Path(od).iterdir() if not (allow_tmp and ".tmp." in p.name)]
    assert sorted(names) == sorted([MANIFEST, LOCK] + [k + ".bin" for k in keys])
    return m


def layer_keys(n_layers, group):
    return ["layers-%03d-%03d" % (a, min(a + group, n_layers) - 1) for a in range(0, n_layers, group)]


@pytest.fixture(scope="module")
def base_model(models):
    """5 layers, untied (so the embedding has a blob of its own)."""
    return models.get("llama", "tiny", layers=5, tied=False, seed=301)


@pytest.fixture(scope="module")
def resident(ferry, base_model, tmp_path_factory):
    return gen(ferry, base_model, None, tmp=tmp_path_factory.mktemp("res"))


@pytest.fixture
def model(base_model, work):
    """A private copy of the model (tests change its files)."""
    return copy_model(base_model, work / "model")


# ---- layout and reuse


@pytest.mark.parametrize("group", [1, 3])
def test_manifest_layout(ferry, model, work, resident, group):
    od = work / "od"
    assert_same(gen(ferry, model, od, "--group-size", group, tmp=work), resident)
    m = check_manifest(od, ["embed"] + layer_keys(5, group) + ["head"])
    # blob sizes are the plan's group sizes
    plan = json.loads(ferry.check("plan", "--model", model, "--json", "--group-size", group, *DISK).stdout)
    assert [b["size"] for b in m["blobs"]] == [g["bytes"] for g in plan["groups"]]


def test_tied_has_no_embed_blob(ferry, models, work):
    d = models.get("llama", "tiny", layers=3, tied=True, seed=302)
    want = gen(ferry, d, None, tmp=work)
    od = work / "od"
    assert_same(gen(ferry, d, od, tmp=work), want)
    check_manifest(od, layer_keys(3, 1) + ["head"])


def test_reuse(ferry, model, work, resident):
    od = work / "od"
    assert_same(gen(ferry, model, od, tmp=work), resident)
    before = snapshot(od)
    man = (od / MANIFEST).read_bytes()
    # same inputs: nothing rewritten (prefetch and batch are not inputs of the blobs)
    for flags in [(), ("--prefetch", 1), ("--prefetch", 4, "--max-step-tokens", 3)]:
        assert_same(gen(ferry, model, od, *flags, tmp=work), resident, "reuse %r" % (flags,))
        assert snapshot(od) == before, "a restart with the same inputs rewrote files"
    assert (od / MANIFEST).read_bytes() == man


def test_fewer_groups_on_disk(ferry, model, work, resident):
    """A bigger budget needs fewer blobs: those still needed are reused, the
    others deleted."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    before = snapshot(od)
    plan = json.loads(ferry.check("plan", "--model", model, "--json").stdout)
    two_layers = plan["groups"][1]["bytes"] + plan["groups"][2]["bytes"]
    got = gen(ferry, model, od, "--max-memory-scope", "weights", "--max-memory", "device=%d,host=0" % two_layers, tmp=work)
    assert_same(got, resident)
    keys = ["embed"] + layer_keys(5, 1)[2:] + ["head"]
    check_manifest(od, keys)
    after = snapshot(od)
    for k in keys:
        assert after[k + ".bin"] == before[k + ".bin"], "%s.bin rewritten" % k


# ---- rebuilds


def test_rebuild_on_checkpoint_change(ferry, models, model, work, resident):
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    old = manifest(od)
    before = snapshot(od)
    other = models.get("llama", "tiny", layers=5, tied=False, seed=303)
    want = gen(ferry, other, None, tmp=work)
    assert want[0] != resident[0], "the two seeds give the same tokens: the test would prove nothing"
    shutil.copyfile(str(other / "model.safetensors"), str(model / "model.safetensors"))
    assert_same(gen(ferry, model, od, tmp=work), want, "after the checkpoint changed")
    new = check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])
    assert new["fingerprint"] != old["fingerprint"]
    after = snapshot(od)
    for b in new["blobs"]:
        assert after[b["file"]][:2] != before[b["file"]][:2], "%s was not rebuilt" % b["file"]
    olds = {b["key"]: b["crc32c"] for b in old["blobs"]}
    assert all(b["crc32c"] != olds[b["key"]] for b in new["blobs"])
    # and the rebuilt dir is reused in turn
    assert_same(gen(ferry, model, od, tmp=work), want)
    assert snapshot(od) == after


def test_rebuild_when_data_changes_under_the_same_mtime(ferry, models, model, work, resident):
    """`cp -p` or rsync keep the mtime (and size) of new data: the blobs must
    still be rebuilt (the fingerprint also covers inode and ctime)."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    other = models.get("llama", "tiny", layers=5, tied=False, seed=304)
    want = gen(ferry, other, None, tmp=work)
    assert want[0] != resident[0], "the two seeds give the same tokens: the test would prove nothing"
    target = model / "model.safetensors"
    st = target.stat()
    shutil.copyfile(str(other / "model.safetensors"), str(target))
    os.utime(str(target), ns=(st.st_atime_ns, st.st_mtime_ns))
    assert target.stat().st_size == st.st_size
    assert_same(gen(ferry, model, od, tmp=work), want, "after the data changed under the same mtime")


def test_stale_temp_files_removed(ferry, model, work, resident):
    """A killed build leaves KEY.bin.tmp.PID (or the manifest's) behind; the
    next run deletes them - whatever the pid, as nothing writes the dir
    without its lock - and nothing else."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    dead = od / "layers-000-000.bin.tmp.2147480000"   # no such pid
    reused = od / ("layers-000-000.bin.tmp.%d" % os.getpid())  # a pid in use, not a writer
    mtmp = od / (MANIFEST + ".tmp.12")
    other = od / "notes.bin.tmp.x"
    for f in (dead, reused, mtmp, other):
        f.write_bytes(b"partial")
    assert_same(gen(ferry, model, od, tmp=work), resident)
    assert not dead.exists() and not reused.exists() and not mtmp.exists()
    assert other.exists()


def test_rebuild_on_config_change(ferry, model, work, resident):
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    old = manifest(od)
    cfg = st_util.read_config(model)
    cfg["rope_theta"] = float(cfg.get("rope_theta", 10000.0)) * 3.0
    (model / "config.json").write_text(json.dumps(cfg, indent=1))
    want = gen(ferry, model, None, tmp=work)
    assert want[0] != resident[0] or rel_err(want[1], resident[1]) > 1e-4
    assert_same(gen(ferry, model, od, tmp=work), want, "after config.json changed")
    assert manifest(od)["fingerprint"] != old["fingerprint"]
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


def test_rebuild_on_shard_change(ferry, models, work):
    a = copy_model(models.get("qwen3", "tiny", layers=3, shard_size="16KiB", seed=304), work / "a")
    b = models.get("qwen3", "tiny", layers=3, shard_size="16KiB", seed=305)
    files = st_util.model_files(a)
    assert len(files) > 2 and files == st_util.model_files(b)
    od = work / "od"
    assert_same(gen(ferry, a, od, tmp=work), gen(ferry, a, None, tmp=work))
    before = snapshot(od)
    # rewrite one shard in the middle with other data of the same layout
    f = files[len(files) // 2]
    shutil.copyfile(str(b / f), str(a / f))
    want = gen(ferry, a, None, tmp=work)
    assert_same(gen(ferry, a, od, tmp=work), want, "after %s changed" % f)
    after = snapshot(od)
    assert any(after[k] != before[k] for k in before if k != MANIFEST)
    check_manifest(od, ["embed"] + layer_keys(3, 1) + ["head"])


def test_rebuild_on_group_size_change(ferry, model, work, resident):
    od = work / "od"
    gen(ferry, model, od, "--group-size", 1, tmp=work)
    before = snapshot(od)
    assert_same(gen(ferry, model, od, "--group-size", 3, tmp=work), resident, "group size 3")
    check_manifest(od, ["embed"] + layer_keys(5, 3) + ["head"])  # the group-1 blobs are gone
    after = snapshot(od)
    # the embedding and head blobs did not change: reused
    for f in ("embed.bin", "head.bin"):
        assert after[f] == before[f], "%s rewritten" % f
    assert_same(gen(ferry, model, od, "--group-size", 1, tmp=work), resident, "back to group size 1")
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


def _flip(path, where):
    with open(path, "r+b") as f:
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("damage", ["flip-middle", "flip-last", "truncate", "extend", "delete", "zero"])
def test_corrupt_blob_rebuilt(ferry, model, work, resident, damage):
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    before = snapshot(od)
    victim = od / "layers-002-002.bin"
    size = victim.stat().st_size
    if damage == "flip-middle":
        _flip(victim, size // 2 + 123)
    elif damage == "flip-last":
        _flip(victim, size - 1)
    elif damage == "truncate":
        os.truncate(str(victim), size - 4096)
    elif damage == "extend":
        with open(str(victim), "ab") as f:
            f.write(b"\0" * 4096)
    elif damage == "delete":
        victim.unlink()
    elif damage == "zero":
        victim.write_bytes(b"\0" * size)
    assert_same(gen(ferry, model, od, tmp=work), resident, "after %s" % damage)
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])
    after = snapshot(od)
    for f, st in before.items():
        if f not in (victim.name, MANIFEST):
            assert after[f] == st, "%s was rewritten, only %s was damaged" % (f, victim.name)


@pytest.mark.parametrize("damage", ["garbage", "empty", "missing", "other-fingerprint"])
def test_bad_manifest(ferry, model, work, resident, damage):
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    mp = od / MANIFEST
    if damage == "garbage":
        mp.write_bytes(b"{\"format\": 1, \"blobs\": [ not json")
    elif damage == "empty":
        mp.write_bytes(b"")
    elif damage == "missing":
        mp.unlink()
    else:
        m = json.loads(mp.read_text())
        m["fingerprint"] = "0123456789abcdef"
        mp.write_text(json.dumps(m))
    assert_same(gen(ferry, model, od, tmp=work), resident, "manifest %s" % damage)
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


def test_manifest_cannot_delete_other_files(ferry, model, work, resident):
    """Stale entries are deleted only when they name KEY.bin for a valid key."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    (work / "precious.txt").write_text("keep me")
    (od / "notes.txt").write_text("keep me too")
    m = manifest(od)
    m["blobs"].append({"key": "../precious", "file": "../precious.txt", "size": 4096, "crc32c": "00000000"})
    m["blobs"].append({"key": "notes", "file": "notes.txt", "size": 4096, "crc32c": "00000000"})
    (od / MANIFEST).write_text(json.dumps(m))
    assert_same(gen(ferry, model, od, "--group-size", 2, tmp=work), resident)
    assert (work / "precious.txt").read_text() == "keep me"
    assert (od / "notes.txt").read_text() == "keep me too"


def test_offload_dir_on_tmpfs(ferry, model, work, resident):
    """No O_DIRECT on tmpfs: reads fall back to buffered ones."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(str(shm), os.W_OK)):
        pytest.skip("no writable /dev/shm")
    od = Path(os.path.join(str(shm), "ferry-test-od-%d" % os.getpid()))
    shutil.rmtree(str(od), ignore_errors=True)
    try:
        assert_same(gen(ferry, model, od, tmp=work), resident)
        assert_same(gen(ferry, model, od, "--group-size", 3, tmp=work), resident)
        p = gen(ferry, model, od, "--group-size", 3, tmp=work, env={"FERRY_FAULT": "read_short=1"})
        assert_same(_result(p, work / "logits.bin"), resident, "tmpfs, read_short=1")
    finally:
        shutil.rmtree(str(od), ignore_errors=True)


# ---- faults


def _result(p, dump):
    assert p.returncode == 0, "rc=%d stderr=%r" % (p.returncode, p.stderr[-2000:])
    obj = json.loads(p.stdout.decode())
    return obj["output_ids"], np.fromfile(str(dump), dtype="<f4").reshape(2, -1)


@pytest.fixture(scope="module")
def big_model(models):
    """Groups of 3 layers of 2.8 MiB: each group is read in several requests."""
    return models.get("qwen2", "small", layers=4, seed=306)


@pytest.fixture(scope="module")
def big_resident(ferry, big_model, tmp_path_factory):
    return gen(ferry, big_model, None, tmp=tmp_path_factory.mktemp("bigres"))


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("flags", [("--prefetch", 1), ("--prefetch", 3, "--group-size", 3),
                                   ("--max-step-tokens", 3, "--group-size", 2)], ids=["pf1", "pf3-g3", "chunk-g2"])
def test_read_short(ferry, model, work, resident, n, flags):
    od = work / "od"
    gen(ferry, model, od, *flags, tmp=work)  # build first: only the reads see the fault
    p = gen(ferry, model, od, *flags, tmp=work, env={"FERRY_FAULT": "read_short=%d" % n})
    assert_same(_result(p, work / "logits.bin"), resident, "read_short=%d %r" % (n, flags))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_read_short_multi_request(ferry, big_model, work, big_resident, n):
    od = work / "od"
    p = gen(ferry, big_model, od, "--group-size", 3, "--prefetch", 2, tmp=work,
            env={"FERRY_FAULT": "read_short=%d" % n})
    assert_same(_result(p, work / "logits.bin"), big_resident, "read_short=%d" % n)


def _check_eio(p, od):
    line = assert_ferry_error(p, "Input/output error", rcs=(1,))
    blobs = [str(Path(od) / b) for b in blob_names(od)]
    assert any(b in line for b in blobs), "the error should name the blob file: %r" % line
    return line


@pytest.mark.parametrize("n", [1, 2, 5, 40])
def test_read_eio(ferry, model, work, resident, n):
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    before = snapshot(od)
    p = gen(ferry, model, od, tmp=work, env={"FERRY_FAULT": "read_eio=%d" % n})
    _check_eio(p, od)
    # a read error is not corruption: nothing rewritten, and the next run is fine
    assert snapshot(od) == before
    assert_same(gen(ferry, model, od, tmp=work), resident)


@pytest.mark.parametrize("n", [2, 3])
def test_read_eio_multi_request(ferry, big_model, work, big_resident, n):
    od = work / "od"
    gen(ferry, big_model, od, "--group-size", 3, tmp=work)
    p = gen(ferry, big_model, od, "--group-size", 3, tmp=work, env={"FERRY_FAULT": "read_eio=%d" % n})
    _check_eio(p, od)
    assert_same(gen(ferry, big_model, od, "--group-size", 3, tmp=work), big_resident)


def _check_enospc(p, od):
    line = assert_ferry_error(p, "No space left on device", rcs=(1,))
    assert str(od) in line and ".bin" in line, "the error should name the blob file: %r" % line
    assert temp_files(od) == [], "temporary files left behind: %r" % temp_files(od)
    return line


@pytest.mark.parametrize("n", [1, 3])
def test_write_enospc_fresh(ferry, model, work, resident, n):
    od = work / "od"
    p = gen(ferry, model, od, tmp=work, env={"FERRY_FAULT": "write_enospc=%d" % n})
    _check_enospc(p, od)
    assert not (od / MANIFEST).exists(), "a failed build must not leave a manifest"
    assert_same(gen(ferry, model, od, tmp=work), resident, "clean run after ENOSPC")
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


@pytest.mark.parametrize("n", [1, 2])  # group size 3 writes two layer blobs (one write each)
def test_write_enospc_keeps_old_manifest(ferry, model, work, resident, n):
    od = work / "od"
    gen(ferry, model, od, "--group-size", 1, tmp=work)
    man = (od / MANIFEST).read_bytes()
    before = snapshot(od)
    p = gen(ferry, model, od, "--group-size", 3, tmp=work, env={"FERRY_FAULT": "write_enospc=%d" % n})
    _check_enospc(p, od)
    assert (od / MANIFEST).read_bytes() == man, "the old manifest was replaced by a failed build"
    # the old manifest's blobs are all still there and trusted
    assert_same(gen(ferry, model, od, "--group-size", 1, tmp=work), resident, "old layout after ENOSPC")
    after = snapshot(od)
    for f in blob_names(od):
        assert after[f] == before[f], "%s rewritten" % f
    # and the new layout builds cleanly
    assert_same(gen(ferry, model, od, "--group-size", 3, tmp=work), resident, "new layout after ENOSPC")
    check_manifest(od, ["embed"] + layer_keys(5, 3) + ["head"])


def test_write_enospc_after_checkpoint_change(ferry, models, model, work):
    """A failed rebuild over blobs the old manifest vouches for: the next run
    must not trust the half-replaced set."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    other = models.get("llama", "tiny", layers=5, tied=False, seed=303)
    shutil.copyfile(str(other / "model.safetensors"), str(model / "model.safetensors"))
    want = gen(ferry, model, None, tmp=work)
    p = gen(ferry, model, od, tmp=work, env={"FERRY_FAULT": "write_enospc=3"})
    _check_enospc(p, od)
    assert_same(gen(ferry, model, od, tmp=work), want, "after a failed rebuild")
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


def test_fault_spec_ignored_when_unset(ferry, model, work, resident):
    od = work / "od"
    p = gen(ferry, model, od, tmp=work, env={"FERRY_FAULT": ""})
    assert_same(_result(p, work / "logits.bin"), resident)


# ---- several processes, interrupted builds


def _spawn(ferry, d, od, tmp, i, *flags):
    import subprocess
    vocab = st_util.read_config(d)["vocab_size"]
    spec = ";".join(",".join(str(t) for t in p) for p in _prompts(vocab))
    dump = Path(tmp) / ("logits-%d.bin" % i)
    argv = [ferry.path, "generate", "--model", d, "--prompt-ids", spec, "--max-new-tokens", N_NEW, "--json",
            "--dump-logits", dump, *DISK, "--offload-dir", od, *flags]
    return subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE), dump


def test_concurrent_first_runs(ferry, big_model, work, big_resident):
    """Replicas started together on one fresh offload dir all build it and
    all give the right outputs."""
    od = work / "od"
    procs = [_spawn(ferry, big_model, od, work, i, "--group-size", 2) for i in range(4)]
    for p, dump in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert_same((json.loads(out.decode())["output_ids"], np.fromfile(str(dump), dtype="<f4").reshape(2, -1)),
                    big_resident, "concurrent run")
    assert temp_files(od) == []
    check_manifest(od, ["layers-000-001", "layers-002-003", "head"])


def _serve(ferry, d, od):
    """`ferry serve` of d with every group on disk in od, on a free loopback
    port; returns (process, base URL) once the model is ready."""
    import subprocess
    import threading
    argv = [ferry.path, "serve", "--model", d, "--http-port", 0, "--grpc-port", 0, "--host", "127.0.0.1", *DISK, "--offload-dir", od]
    p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    timer = threading.Timer(60, p.kill)  # a hang fails the test, never blocks it
    timer.start()
    url, log = None, []
    for raw in iter(p.stderr.readline, b""):
        line = raw.decode(errors="replace")
        log.append(line)
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        url = url or (m and m.group(1))
        if line.rstrip().endswith(" ready"):
            break
    timer.cancel()
    assert url and p.poll() is None, "ferry serve did not become ready: %r" % log
    return p, url


def _http_generate(url, name, prompts):
    import urllib.request
    body = json.dumps({"input_ids": prompts, "parameters": {"max_new_tokens": N_NEW}}).encode()
    req = urllib.request.Request("%s/v2/models/%s/generate" % (url, name), data=body, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read().decode())["output_ids"]


def test_dir_in_use_by_other_inputs(ferry, models, model, work, resident):
    """One offload dir, two checkpoints: while a server streams one from it,
    a run of the other fails at startup naming the dir (and changes nothing),
    and the server's answers stay right. The same inputs may share the dir;
    another layout of them may not. Once the server is gone the other
    checkpoint takes the dir over."""
    import signal
    od = work / "od"
    other = models.get("llama", "tiny", layers=5, tied=False, seed=303)
    want_other = gen(ferry, other, None, tmp=work)
    assert want_other[0] != resident[0], "the two seeds give the same tokens: the test would prove nothing"
    srv, url = _serve(ferry, model, od)
    try:
        before = snapshot(od)
        p = gen(ferry, other, od, tmp=work, env={})
        line = assert_ferry_error(p, "in use", rcs=(1,))
        assert str(od) in line, line
        p = gen(ferry, model, od, "--group-size", 2, tmp=work, env={})
        line = assert_ferry_error(p, "in use", rcs=(1,))
        assert str(od) in line, line
        assert snapshot(od) == before, "a refused run changed the offload dir"
        assert_same(gen(ferry, model, od, tmp=work), resident, "a second run of the same inputs")
        assert snapshot(od) == before, "a run that joined the dir changed it"
        vocab = st_util.read_config(model)["vocab_size"]
        assert _http_generate(url, model.name, _prompts(vocab)) == resident[0]
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.communicate(timeout=30)
    assert srv.returncode == 0
    assert_same(gen(ferry, other, od, tmp=work), want_other, "the other checkpoint, alone")
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


def test_concurrent_runs_of_two_checkpoints(ferry, models, model, work, resident):
    """Two checkpoints started together on one dir, a few times over: every
    run either gives its own checkpoint's outputs or fails cleanly because
    the dir is in use - never the other's blobs with exit status 0."""
    other = models.get("llama", "tiny", layers=5, tied=False, seed=303)
    want = {0: resident, 1: gen(ferry, other, None, tmp=work)}
    od = work / "od"
    for _ in range(3):
        procs = [_spawn(ferry, d, od, work, i) for i, d in enumerate((model, other))]
        for i, (p, dump) in enumerate(procs):
            out, err = p.communicate(timeout=120)
            if p.returncode == 0:
                got = (json.loads(out.decode())["output_ids"], np.fromfile(str(dump), dtype="<f4").reshape(2, -1))
                assert_same(got, want[i], "checkpoint %d, run concurrently" % i)
            else:
                p.stdout, p.stderr = out, err
                assert str(od) in assert_ferry_error(p, "in use", rcs=(1,))


def test_orphans_of_a_failed_build_removed(ferry, model, work, resident):
    """A build for a new layout that failed half way leaves blobs no manifest
    lists; the next run deletes them - and nothing that is not ferry's."""
    od = work / "od"
    gen(ferry, model, od, tmp=work)
    p = gen(ferry, model, od, "--group-size", 3, tmp=work, env={"FERRY_FAULT": "write_enospc=2"})
    _check_enospc(p, od)
    assert (od / "layers-000-002.bin").exists(), "the failed build should have written its first blob"
    mine = {"notes.txt": b"keep", "weights.bin": b"x" * 100, "Backup.bin": b"x" * 4096, "layers.bin.old": b"x"}
    for name, data in mine.items():
        (od / name).write_bytes(data)
    assert_same(gen(ferry, model, od, tmp=work), resident)
    assert not (od / "layers-000-002.bin").exists(), "the orphan blob is still there"
    for name, data in mine.items():
        assert (od / name).read_bytes() == data, "%s was touched" % name
    for name in mine:
        (od / name).unlink()
    check_manifest(od, ["embed"] + layer_keys(5, 1) + ["head"])


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.1])
def test_killed_build(ferry, big_model, work, big_resident, delay):
    """A build killed at any point leaves nothing a later run trusts."""
    import signal
    import time
    od = work / "od"
    p, _ = _spawn(ferry, big_model, od, work, 0, "--group-size", 1)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=120)
    got = gen(ferry, big_model, od, "--group-size", 1, tmp=work)
    assert_same(got, big_resident, "after a build killed at %gs" % delay)
    # (a killed process leaves its temporary file: harmless, never trusted)
    check_manifest(od, layer_keys(4, 1) + ["head"], allow_tmp=True)
    # and the next run trusts what is there: nothing rewritten
    before = snapshot(od)
    assert_same(gen(ferry, big_model, od, "--group-size", 1, tmp=work), big_resident)
    assert snapshot(od) == before
