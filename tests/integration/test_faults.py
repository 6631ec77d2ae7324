"""The fault matrix (docs/faults.md): every fault FERRY_FAULT can inject
(engine/base/fault.h) in every component it reaches, driven through the real
binary - `ferry serve` over real sockets, `ferry generate`, `ferry export`.

One test per row of the matrix; each checks the three promises:
  - the failure is clear: the affected request gets an HTTP error (or a gRPC
    status, or a failed export job) whose message names the file and the
    cause, or startup stops with one line and exit status 1;
  - the server keeps serving: the next requests succeed, with the outputs
    of a run without faults;
  - nothing already written is corrupted: a failed export leaves no partial
    export and an earlier one byte for byte; a failed offload write leaves
    the dir so that the next run rebuilds or reuses it correctly; a failed
    read fails that step, and the offload dir is not touched.

N-th event semantics: KIND=N makes the Nth event of that kind fail (read_short
every Nth); counts are per process, so each test starts its own process.
Where the Nth event of a kind depends on the model and placement, a test
sweeps N from 1 until a run sees no fault, so that every event of that kind
is covered without the test knowing their number.
"""

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import refdata
from conftest import RUN_TIMEOUT, assert_ferry_error, prompt_ids
from test_admin import clean_env, export, start, stop, wait_job, write_token
from test_http import M_SEQUENCES, Server, generate, infer, infer_body, jreq, metrics, msum
from text_util import DEMO_TOKENIZER, text_model

DISK = ("--max-memory", "device=0,host=0")
MIXED = ("--max-memory-scope", "weights", "--max-memory", "device=150KiB,host=150KiB")  # tiny: a group on each tier
N_NEW = 12
MAX_SWEEP = 200  # far more events than any sweep here meets: a sweep that reaches it is a failure
MEMORY_WORDS = ("cannot allocate", "out of memory", "cannot be allocated")


# --------------------------------------------------------------------------
# models and helpers
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(models):
    """2 layers, untied: an embedding, two layer groups and a head, each its
    own blob when on disk."""
    return models.get("llama", "tiny", tied=False, seed=1801)


@pytest.fixture(scope="module")
def vocab(tiny):
    return int(json.loads((Path(tiny) / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="module")
def prompts(vocab):
    return [prompt_ids(vocab, 5, 1802), prompt_ids(vocab, 5, 1803)]


@pytest.fixture(scope="module")
def want(ferry, tiny, prompts):
    """The greedy outputs of the prompts, all resident, no faults."""
    return ferry.generate(tiny, prompts, N_NEW)[0]


@pytest.fixture(scope="module")
def moe(models):
    """A mixture of experts (8 experts a layer): expert slots, expert read
    buffers and expert activations are allocated too."""
    return models.get("mixtral", "tiny", seed=1807)


def env_with(fault=None):
    """The environment of a run: FERRY_FAULT as given (or none), no other
    test knob leaking in."""
    env = clean_env()
    if fault:
        env["FERRY_FAULT"] = fault
    return env


def run(ferry_bin, *args, fault=None):
    return subprocess.run([ferry_bin] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env_with(fault), timeout=RUN_TIMEOUT)


def gen_args(model, prompts, *flags):
    spec = ";".join(",".join(str(t) for t in p) for p in prompts)
    return ["generate", "--model", model, "--prompt-ids", spec, "--max-new-tokens", N_NEW, "--json"] + list(flags)


def gen_ok(p):
    assert p.returncode == 0, "rc=%d\n%s" % (p.returncode, p.stderr.decode(errors="replace")[-2000:])
    return json.loads(p.stdout.decode())["output_ids"]


def stderr_lines(p):
    return [ln for ln in p.stderr.decode(errors="replace").splitlines() if ln.strip()]


def tree(root):
    """{relative path: sha256} of every file under root (names starting with
    a dot included)."""
    root = Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def offload_files(od):
    """{name: (inode, size, sha256)} of the offload dir's files: equal before
    and after means nothing was rewritten."""
    out = {}
    for p in Path(od).iterdir():
        st = p.stat()
        out[p.name] = (st.st_ino, st.st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def names_blob(msg, od, cause):
    """msg names a blob of the offload dir od, then the cause (a regex)."""
    return re.search(re.escape(str(od)) + r"/[a-z0-9-]+\.bin: " + cause, msg)


def temporaries(d):
    return sorted(p.name for p in Path(d).iterdir() if ".tmp." in p.name or p.name.startswith(".ferry-export-"))


def serve_fails(ferry_bin, model, *flags, fault):
    """`ferry serve` that must stop at startup with exit status 1; returns
    its error line. The listening lines come first (the model loads behind
    them), then exactly that one line."""
    p = subprocess.run([ferry_bin, "serve", "--model", str(model), "--http-port", "0", "--grpc-port", "0",
                        "--host", "127.0.0.1"] + [str(f) for f in flags], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env_with(fault), timeout=RUN_TIMEOUT)
    lines = [ln for ln in stderr_lines(p) if " listening on " not in ln]
    ctx = "rc=%d\n%s" % (p.returncode, p.stderr.decode(errors="replace")[-3000:])
    assert p.returncode == 1, ctx
    assert len(lines) == 1 and lines[0].startswith("ferry: "), ctx
    return lines[0]


def sweep(ferry_bin, kind, flags, fired, passed):
    """Runs the command `flags` with KIND=N for N = 1, 2, ... until a run
    meets no fault: fired(N, process) checks a run and says whether the
    fault fired in it; passed(process) checks the first run where it did
    not. Returns that N."""
    for n in range(1, MAX_SWEEP):
        p = run(ferry_bin, *flags, fault="%s=%d" % (kind, n))
        if not fired(n, p):
            passed(p)
            return n
    pytest.fail("%s: still failing at N=%d" % (kind, MAX_SWEEP))


def check_answers(srv, prompts, want):
    """Both front-end forms (KServe infer, Triton generate) give `want`."""
    assert infer(srv, prompts, N_NEW)[0] == want
    assert generate(srv, prompts[0], max_new_tokens=N_NEW) == want[0]


# --------------------------------------------------------------------------
# the offload dir: reads while serving
# --------------------------------------------------------------------------

def test_read_short_serving(ferry_bin, tiny, prompts, want, tmp_path):
    """read_short=1: every read of a blob comes back short; the remainders
    are resubmitted and the answers are those of an all-resident run."""
    srv = Server(ferry_bin, tiny, *DISK, "--offload-dir", tmp_path / "od", name="short",
                 env=env_with("read_short=1"))
    try:
        srv.wait_ready()
        check_answers(srv, prompts, want)
        assert msum(metrics(srv), M_SEQUENCES, outcome="failed") == 0
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


def test_read_eio_serving(ferry_bin, tiny, prompts, want, tmp_path):
    """read_eio: the step that read the blob fails; its request gets 500
    with a JSON error naming the blob and the cause; the next requests are
    whole and right; the blobs are not rebuilt (a read error is not
    corruption). The failing request has one prompt: a request's prompts
    are submitted one by one, and a busy engine may start the first alone,
    so the failed step would hold one or both of two."""
    od = tmp_path / "od"
    gen_ok(run(ferry_bin, *gen_args(tiny, prompts, *DISK, "--offload-dir", od)))  # built, without faults
    before = offload_files(od)
    srv = Server(ferry_bin, tiny, *DISK, "--offload-dir", od, name="eio", env=env_with("read_eio=3"))
    try:
        srv.wait_ready()
        st, obj = jreq(srv, "POST", "/v2/models/eio/infer", infer_body(prompts[:1], max_new_tokens=N_NEW))
        assert st == 500, (st, obj)
        assert names_blob(obj["error"], od, r"read at \d+: Input/output error"), obj
        check_answers(srv, prompts, want)
        m = metrics(srv)
        assert msum(m, M_SEQUENCES, outcome="failed") == 1
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()
    assert offload_files(od) == before


def test_read_eio_every_read_moe(ferry_bin, moe, tmp_path):
    """A mixture of experts on disk, `ferry generate`: the Nth read fails,
    for every N until a run meets none - reads of the layer pipeline and
    on-demand expert fetches alike: one line naming the blob and the cause,
    exit 1, the offload dir untouched; then the answers of a run without
    faults."""
    od = tmp_path / "od"
    flags = ["generate", "--model", moe, "--prompt-ids", "1,2,3;4,5,6,7", "--max-new-tokens", 3, "--json", *DISK,
             "--offload-dir", od]
    want = gen_ok(run(ferry_bin, *flags))
    before = offload_files(od)
    named = set()

    def failed(n, p):
        if p.returncode == 0:
            return False
        line = assert_ferry_error(p, "Input/output error", rcs=(1,))
        m = names_blob(line, od, r"read at \d+: Input/output error")
        assert m, line
        named.add(re.search(r"/([a-z]+)-?[0-9-]*\.bin", m.group(0)).group(1))
        return True

    def passed(p):
        assert gen_ok(p) == want

    sweep(ferry_bin, "read_eio", flags, failed, passed)
    assert {"layers", "experts"} <= named, named
    assert offload_files(od) == before


@pytest.fixture(scope="module")
def text_tiny(ferry, tmp_path_factory):
    """tiny with the demo tokenizer: what the OpenAI front end needs."""
    return text_model(ferry, tmp_path_factory.mktemp("faults-text") / "demo", DEMO_TOKENIZER, seed=1804)


@pytest.mark.parametrize("front", ["openai", "grpc"])
def test_read_eio_front_ends(ferry_bin, ferry, text_tiny, tmp_path, front):
    """read_eio through the other front ends: OpenAI /v1/completions answers
    500 with its error object, gRPC (tritonclient) a status, each naming the
    blob; the next request on the same front end is served."""
    ids = [5, 6, 7, 8]
    want = ferry.generate(text_tiny, ids, N_NEW)[0]
    srv = Server(ferry_bin, text_tiny, *DISK, "--offload-dir", tmp_path / "od", name="demo",
                 env=env_with("read_eio=3"))
    try:
        srv.wait_ready()
        if front == "openai":
            body = {"model": "demo", "prompt": ids, "max_tokens": N_NEW, "temperature": 0}
            st, obj = jreq(srv, "POST", "/v1/completions", body)
            assert st == 500, (st, obj)
            assert names_blob(obj["error"]["message"], tmp_path / "od", r"read at \d+: Input/output error"), obj
            st, obj = jreq(srv, "POST", "/v1/completions", body)
            assert st == 200, (st, obj)
            assert obj["usage"]["completion_tokens"] == len(want), obj
        else:
            grpcclient = refdata.client("tritonclient.grpc")
            from tritonclient.utils import InferenceServerException
            port = next(int(m.group(1)) for m in (re.search(r"listening on grpc://[0-9.]+:(\d+)", ln)
                                                  for ln in srv.log) if m)
            c = grpcclient.InferenceServerClient(url="127.0.0.1:%d" % port)
            try:
                inp = grpcclient.InferInput("input_ids", [1, len(ids)], "INT64")
                inp.set_data_from_numpy(np.asarray([ids], dtype=np.int64))
                with pytest.raises(InferenceServerException) as ei:
                    c.infer("demo", [inp], parameters={"max_new_tokens": N_NEW})
                assert ei.value.status() == "StatusCode.INTERNAL", ei.value
                assert names_blob(ei.value.message(), tmp_path / "od", r"read at \d+: Input/output error"), ei.value
                res = c.infer("demo", [inp], parameters={"max_new_tokens": N_NEW})
                assert res.as_numpy("output_ids").tolist() == [want]
            finally:
                c.close()
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


# --------------------------------------------------------------------------
# the offload dir: writes while building it (startup) and rebuilding a blob
# --------------------------------------------------------------------------

@pytest.mark.parametrize("fault,cause", [("write_enospc=2", "write: No space left on device"),
                                         ("write_eio=3", "write: Input/output error"),
                                         ("fsync_eio=3", "fsync: Input/output error")])
def test_offload_build_fails(ferry_bin, tiny, prompts, want, tmp_path, fault, cause):
    """A write or fsync of a blob fails while `ferry serve` builds a fresh
    offload dir: startup stops with one line naming the blob and the cause
    (exit 1); no temporary file and no manifest are left, so nothing of the
    failed build is trusted; the next start builds it and serves the
    all-resident answers."""
    od = tmp_path / "od"
    line = serve_fails(ferry_bin, tiny, *DISK, "--offload-dir", od, fault=fault)
    assert names_blob(line, od, re.escape(cause)), line
    assert temporaries(od) == [] and not (od / "ferry-offload.json").exists(), sorted(os.listdir(od))
    srv = Server(ferry_bin, tiny, *DISK, "--offload-dir", od, name="rebuilt", env=env_with())
    try:
        srv.wait_ready()
        check_answers(srv, prompts, want)
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


@pytest.mark.parametrize("fault,cause", [("fsync_eio=5", "fsync: Input/output error"),
                                         ("write_enospc=3", "write: No space left on device")])
def test_offload_manifest_write_fails(ferry_bin, models, tmp_path, fault, cause):
    """A dir built for group size 1; a start with group size 3 writes its two
    new blobs, then the manifest's write or fsync fails: one line naming the
    manifest, exit 1. The old manifest stays, so a start with group size 1
    reuses every blob it lists without writing anything, and one with group
    size 3 then builds cleanly."""
    model = models.get("llama", "tiny", layers=5, tied=False, seed=1805)
    ps = [[1, 2, 3]]
    want = gen_ok(run(ferry_bin, *gen_args(model, ps)))
    od = tmp_path / "od"
    assert gen_ok(run(ferry_bin, *gen_args(model, ps, *DISK, "--offload-dir", od, "--group-size", 1))) == want
    manifest = (od / "ferry-offload.json").read_bytes()
    old = {k: v for k, v in offload_files(od).items() if k.endswith(".bin")}
    line = serve_fails(ferry_bin, model, *DISK, "--offload-dir", od, "--group-size", 3, fault=fault)
    assert str(od / "ferry-offload.json") + ": " + cause in line, line
    assert temporaries(od) == [] and (od / "ferry-offload.json").read_bytes() == manifest
    p = run(ferry_bin, *gen_args(model, ps, *DISK, "--offload-dir", od, "--group-size", 1))
    assert gen_ok(p) == want
    now = offload_files(od)
    assert all(now[k] == v for k, v in old.items()), "a blob of the old manifest was rewritten"
    assert gen_ok(run(ferry_bin, *gen_args(model, ps, *DISK, "--offload-dir", od, "--group-size", 3))) == want
    keys = [b["key"] for b in json.loads((od / "ferry-offload.json").read_text())["blobs"]]
    assert keys == ["embed", "layers-000-002", "layers-003-004", "head"], keys


@pytest.mark.parametrize("fault,cause", [("write_enospc=1", "write: No space left on device"),
                                         ("fsync_eio=1", "fsync: Input/output error")])
def test_offload_repair_fails(ferry_bin, tiny, prompts, want, tmp_path, fault, cause):
    """A blob damaged on disk while serving (a byte flipped): the step that
    reads it fails its checksum (500 naming the blob), and the rebuild from
    the checkpoint that follows fails on the disk (logged, naming the blob
    and the cause; no temporary left, the manifest untouched). The blob is
    still damaged, so the next request fails the same way - and its failed
    step retries the rebuild, which succeeds: from then on the answers are
    right and the blob is byte for byte what was built. (Groups the fetcher
    read ahead before the damage are sound: a request served from them is
    right, and the damage shows at the next.) The rebuild is retried after
    each failed step, not each failed request: a request of two prompts
    submits them one by one, and a busy engine may start the second a step
    later, so its two failed steps would use up both rebuild tries. The
    damaged requests carry one prompt, one sequence: one failed step each."""
    od = tmp_path / "od"
    gen_ok(run(ferry_bin, *gen_args(tiny, prompts, *DISK, "--offload-dir", od)))
    before = offload_files(od)
    victim = od / "layers-000-000.bin"
    srv = Server(ferry_bin, tiny, *DISK, "--offload-dir", od, name="repair", env=env_with(fault))
    try:
        srv.wait_ready()
        with open(victim, "r+b") as f:  # the file the server reads through (offload.h L4)
            f.seek(100)
            b = f.read(1)
            f.seek(100)
            f.write(bytes([b[0] ^ 0xFF]))
        failed = 0
        for _ in range(4):
            st, obj = jreq(srv, "POST", "/v2/models/repair/infer", infer_body(prompts[:1], max_new_tokens=N_NEW))
            if st == 200 and not failed:  # read ahead before the damage
                out = obj["outputs"][0]
                assert np.reshape(out["data"], out["shape"]).tolist() == want[:1], obj
                continue
            assert st == 500 and str(victim) + ": checksum mismatch" in obj["error"], (st, obj)
            failed += 1
            if failed == 2:
                break
        assert failed == 2, srv.logtail()
        check_answers(srv, prompts, want)
        # the log after stop: its reader may lag the responses, and stop joins it
        assert srv.stop() == 0, srv.logtail()
        assert any(("could not rebuild group" in ln and str(victim) + ": " + cause in ln) for ln in srv.log), \
            srv.logtail()
        assert any("rebuilt " + str(victim) in ln for ln in srv.log), srv.logtail()
    finally:
        srv.kill()
    after = offload_files(od)
    assert temporaries(od) == []
    assert after["ferry-offload.json"] == before["ferry-offload.json"]
    assert after[victim.name][1:] == before[victim.name][1:]  # a new file, the same bytes


# --------------------------------------------------------------------------
# exports
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    return write_token(tmp_path_factory.mktemp("faults-token") / "token")


def cli_export(ferry_bin, model, out, *flags, fault=None):
    return run(ferry_bin, "export", "--model", model, "--out", out, *flags, fault=fault)


@pytest.mark.parametrize("fault,cause", [("write_eio=1", "write: Input/output error"),
                                         ("write_enospc=4", "write: No space left on device"),
                                         ("fsync_eio=1", "fsync: Input/output error")])
def test_admin_export_fails(ferry_bin, tiny, prompts, want, token_file, tmp_path, fault, cause):
    """An export through the admin API, replacing an earlier one of the same
    name, meets a failing write or fsync: the job ends "failed" with an error
    naming the file and the cause; the earlier export is there byte for
    byte and nothing else is under the root; requests before and after it
    get the right answers; the next export succeeds."""
    root = tmp_path / "exports"
    root.mkdir()
    p = cli_export(ferry_bin, tiny, root / "ex", "--quantize", "int8")  # other bytes than the server's
    assert p.returncode == 0, p.stderr
    earlier = tree(root)
    od = tmp_path / "od"  # built first: the server's first write and fsync are the export's
    gen_ok(run(ferry_bin, *gen_args(tiny, prompts, *MIXED, "--offload-dir", od)))
    srv, adm = start(ferry_bin, tiny, *MIXED, "--offload-dir", od, "--export-dir", root,
                     env=env_with(fault), token_file=token_file)
    try:
        check_answers(srv, prompts, want)
        job = wait_job(adm, export(adm, "ex", overwrite=True))
        assert job["state"] == "failed", job
        assert re.search(r"\S+: " + re.escape(cause), job["error"]), job
        assert tree(root) == earlier and sorted(os.listdir(root)) == ["ex"]
        check_answers(srv, prompts, want)
        job = wait_job(adm, export(adm, "ex", overwrite=True))
        assert job["state"] == "done", job
        assert sorted(os.listdir(root)) == ["ex"] and tree(root) != earlier
        stop(srv)
    finally:
        srv.kill()


@pytest.mark.parametrize("fault", ["read_eio=1", "read_short=1"])
def test_admin_export_reads_blob(ferry_bin, tiny, prompts, want, token_file, tmp_path, fault):
    """An export through the admin API of a server whose groups are all on
    disk reads each blob: a read failing with EIO fails the job, naming the
    blob and the cause, with nothing left under the root; reads coming back
    short are asked again, and the export is byte for byte that of `ferry
    export` without faults. Requests are served right after either."""
    root, od = tmp_path / "exports", tmp_path / "od"
    root.mkdir()
    gen_ok(run(ferry_bin, *gen_args(tiny, prompts, *DISK, "--offload-dir", od)))
    p = cli_export(ferry_bin, tiny, tmp_path / "reference")
    assert p.returncode == 0, p.stderr
    srv, adm = start(ferry_bin, tiny, *DISK, "--offload-dir", od, "--export-dir", root, env=env_with(fault),
                     token_file=token_file)
    try:
        job = wait_job(adm, export(adm, "ex"))  # first: the server's first reads are the export's
        if fault.startswith("read_eio"):
            assert job["state"] == "failed", job
            assert names_blob(job["error"], od, r"read at \d+: Input/output error"), job
            assert os.listdir(root) == []
        else:
            assert job["state"] == "done", job
            assert tree(root / "ex") == tree(tmp_path / "reference")
        check_answers(srv, prompts, want)
        stop(srv)
    finally:
        srv.kill()


@pytest.mark.parametrize("kind,cause", [("write_eio", r"write: Input/output error"),
                                        ("fsync_eio", r"fsync(?: of its directory)?: Input/output error")])
def test_cli_export_every_event_fails(ferry_bin, tiny, tmp_path, kind, cause):
    """`ferry export --overwrite` over an earlier export, with the Nth write
    (or fsync) failing, for every N until a run meets none: each failed run
    is one line naming the export, the file and the cause, exit 1, with the
    earlier export there byte for byte and no temporary left. An fsync of
    the export root once the new export has its name is not a failure of
    the export (it is in place): a warning, exit 0."""
    root = tmp_path / "exports"
    root.mkdir()
    assert cli_export(ferry_bin, tiny, root / "ex", "--quantize", "int8").returncode == 0
    earlier = tree(root)
    for n in range(1, MAX_SWEEP):
        p = cli_export(ferry_bin, tiny, root / "ex", "--overwrite", fault="%s=%d" % (kind, n))
        if p.returncode == 0:
            break
        line = assert_ferry_error(p, "Input/output error", rcs=(1,))
        assert re.match(r"ferry: export 'ex' failed: \S+: " + cause, line), line
        assert tree(root) == earlier, "%s=%d changed the earlier export" % (kind, n)
        assert sorted(os.listdir(root)) == ["ex"], "%s=%d left %r" % (kind, n, os.listdir(root))
    else:
        pytest.fail("%s: still failing at N=%d" % (kind, MAX_SWEEP))
    assert n > 1 and sorted(os.listdir(root)) == ["ex"] and tree(root) != earlier
    index = json.loads((root / "ex" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00001.safetensors"}
    if kind == "fsync_eio":
        # the first N that passes is the root's fsync after the swap; the one
        # after it, the root's fsync once the previous export is removed
        p = cli_export(ferry_bin, tiny, root / "ex", "--overwrite", "--quantize", "int8",
                       fault="fsync_eio=%d" % (n + 1))
        assert p.returncode == 0, p.stderr
        assert [ln for ln in stderr_lines(p) if not ln.startswith("export: ")] == [
            "ferry: export 'ex': syncing the export root: Input/output error (the export is in place)"]
        assert tree(root) == earlier  # the int8 export again, whole


# --------------------------------------------------------------------------
# allocators
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind,device,arch", [("dev_alloc", "cpu", "llama"), ("dev_alloc", "cpu-split", "llama"),
                                              ("host_alloc", "cpu", "llama"), ("host_alloc", "cpu-split", "llama"),
                                              ("dev_alloc", "cpu-split", "moe"), ("host_alloc", "cpu-split", "moe")])
def test_startup_alloc_fails(request, ferry_bin, prompts, tmp_path, kind, device, arch):
    """Every device (or host) allocation of a start, in turn, fails - groups
    of the device and host tiers, staging slots, disk bounce buffers, expert
    slots and read buffers, the KV pool, activations, embedding rows, the
    RoPE table: each is one line naming the memory that could not be had,
    exit 1, never a signal; past the last, the answers are right."""
    model = request.getfixturevalue("tiny" if arch == "llama" else "moe")
    budget = MIXED if arch == "llama" else ("--max-memory-scope", "weights", "--max-memory", "device=300KiB,host=300KiB")
    od = tmp_path / "od"
    flags = gen_args(model, prompts, "--device", device, *budget, "--offload-dir", od)
    want = gen_ok(run(ferry_bin, *flags))
    seen = set()

    def failed(n, p):
        if p.returncode == 0:
            return False
        line = assert_ferry_error(p, MEMORY_WORDS, rcs=(1,))
        seen.add(re.sub(r"[0-9.]+ [KMG]iB|\d+", "#", line))
        return True

    def passed(p):
        assert gen_ok(p) == want
        assert stderr_lines(p) == []

    n = sweep(ferry_bin, kind, flags, failed, passed)
    assert len(seen) >= 2, (n, seen)  # several sites, not one allocation seen many times


@pytest.mark.parametrize("fault,device,what", [("dev_alloc=1", "cpu", "device memory for group"),
                                               ("host_alloc=2", "cpu-split", "disk bounce buffers"),
                                               ("dev_alloc=5", "cpu-split", "KV cache of")])
def test_serve_alloc_fails(ferry_bin, tiny, tmp_path, fault, device, what):
    """The same at `ferry serve`'s startup: one line after the listening
    lines, exit 1."""
    line = serve_fails(ferry_bin, tiny, "--device", device, *MIXED, "--offload-dir", tmp_path / "od", fault=fault)
    assert what in line, line


def test_host_pin_fails(ferry_bin, tiny, prompts, want, tmp_path):
    """cpu-split (which pins as cuda does): pinning each host buffer in turn
    fails - a host-tier group, each disk bounce buffer, the embedding rows:
    one warning naming the size, the buffer used pageable, the answers
    right; past the last, no warning."""
    flags = gen_args(tiny, prompts, "--device", "cpu-split", *MIXED, "--offload-dir", tmp_path / "od")

    def failed(n, p):
        assert gen_ok(p) == want
        lines = stderr_lines(p)
        if not lines:
            return False
        assert len(lines) == 1 and re.match(r"ferry: warning: could not pin [0-9.]+ [KMG]iB of host memory; "
                                            r"using pageable memory", lines[0]), lines
        return True

    n = sweep(ferry_bin, "host_pin", flags, failed, lambda p: None)
    assert n > 3, n


@pytest.mark.parametrize("n,preempted", [(1, 0), (2, 1)])
def test_kv_block_serving(ferry_bin, tiny, vocab, n, preempted):
    """kv_block: a reservation of KV blocks finds the pool empty. The first
    (the sequence starting) waits for the next step; the second (the
    sequence growing into its second block) preempts it, and it resumes by
    recomputing its prefix. Either way the request is answered with the
    tokens of a run without faults, and every block is free after."""
    p = prompt_ids(vocab, 5, 1806)
    want = gen_ok(run(ferry_bin, "generate", "--model", tiny, "--prompt-ids", ",".join(map(str, p)),
                      "--max-new-tokens", 30, "--json"))
    srv = Server(ferry_bin, tiny, name="kv", env=env_with("kv_block=%d" % n))
    try:
        srv.wait_ready()
        assert infer(srv, [p], 30)[0] == [want]
        m = metrics(srv)
        assert msum(m, "ferry_preemptions_total") == preempted
        assert (msum(m, "ferry_recomputed_tokens_total") > 0) == bool(preempted)
        assert msum(m, "ferry_kv_blocks", state="used") == 0
        assert infer(srv, [p], 30)[0] == [want]
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()


# --------------------------------------------------------------------------
# CUDA (make test-gpu: FERRY_TEST_DEVICE=cuda; skipped elsewhere)
# --------------------------------------------------------------------------

@pytest.mark.skipif(os.environ.get("FERRY_TEST_DEVICE") != "cuda", reason="needs a GPU (make test-gpu)")
def test_cuda_fault_dev_alloc(ferry_bin, tiny, prompts, tmp_path):
    """--device cuda: every device allocation of a start fails in turn (one
    line, exit 1), and so does the one a step makes, the batch tables grown
    for its first batch: that step's request gets 500 naming them, the next
    request is served. Pinning failures fall back to pageable memory with
    one warning."""
    base = gen_args(tiny, prompts, "--device", "cuda", *MIXED, "--offload-dir", tmp_path / "od")
    want = gen_ok(run(ferry_bin, *base))
    step = []

    def failed(n, p):
        if p.returncode == 0:
            return False
        line = assert_ferry_error(p, MEMORY_WORDS, rcs=(1,))
        if "batch tables" in line:
            step.append(n)
        return True

    def passed(p):
        assert gen_ok(p) == want

    sweep(ferry_bin, "dev_alloc", base, failed, passed)
    assert step, "no step allocated device memory"

    def unpinned(n, p):
        assert gen_ok(p) == want
        return bool(stderr_lines(p))

    sweep(ferry_bin, "host_pin", base, unpinned, lambda p: None)
    srv = Server(ferry_bin, tiny, "--device", "cuda", *MIXED, "--offload-dir", tmp_path / "od", name="gpu",
                 env=env_with("dev_alloc=%d" % step[0]))
    try:
        srv.wait_ready()
        st, obj = jreq(srv, "POST", "/v2/models/gpu/infer", infer_body(prompts, max_new_tokens=N_NEW))
        assert st == 500 and "batch tables" in obj["error"], (st, obj)
        assert infer(srv, prompts, N_NEW)[0] == want
        assert srv.stop() == 0, srv.logtail()
    finally:
        srv.kill()
