"""`ferry serve`'s admin API (issue 13), driven over real sockets.

Each server is the real binary (test_http's Server) with `--admin-port -1`
(any free port; the "admin listening on http://HOST:PORT" line says which)
and a token from a 0600 file or FERRY_ADMIN_TOKEN.

Covered: 401 with `WWW-Authenticate: Bearer` and a JSON error for a missing
header, another scheme, a wrong token of the same length, of another length
and an empty one (also on unknown paths: authentication comes before
routing); each failure counted in /metrics and logged with the peer and
the reason, never the token; the token file's rules at startup (mode 0644,
0640, a symlink, empty: one line naming the file, exit 2; 0400 accepted);
a non-loopback --admin-host without a token refused (exit 2); no token on
loopback: no admin listener; FERRY_ADMIN_TOKEN; GET /admin/v1/status (model,
conversion, placement per group over all three tiers, memory, pipeline
figures growing with steps, jobs); the export body's errors (each names its
field); 404/405; the export job's life cycle (202, Location, poll to done,
the directory under --export-dir with its index, the job in status); 409
for a second export while one runs and DELETE -> cancelled with nothing left
under the root (FERRY_EXPORT_DELAY_MS slows the writes so the job is still
running); names that break the rules (../x, /abs, a/b, empty, 129
characters, a symlink under the root pointing outside) -> 400, nothing
written outside; an existing name without overwrite -> 400, with it -> the
new export; an export while 8 concurrent /v2 infer requests run: their
outputs equal the same requests without an export; a failed export (ENOSPC
through the fault hook) reports its error and serving goes on; SIGTERM
during an export cancels it (logged: "export N is running: cancelling it",
then "export N cancelled") and exits 0, leaving no final or temporary
directory; an export that finished unpolled logs "export N done" when it
finishes, and SIGTERM then neither cancels it nor says so.
"""

import concurrent.futures
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

from conftest import prompt_ids, wait_until
from test_http import Server, infer, metrics, msum, request

import st_util

TOKEN = "adm1n-T0ken-for-tests-0123456789"
ADMIN_RE = re.compile(r"admin listening on http://([0-9.]+):(\d+)")
JOB_TIMEOUT = 120  # seconds for an export job of a test model to end


class Admin:
    """The admin listener of a Server: what test_http.request needs (.port)."""

    def __init__(self, srv):
        self.srv = srv
        self.port = None
        for ln in srv.log:
            m = ADMIN_RE.search(ln)
            if m:
                self.port = int(m.group(2))
        assert self.port, "no 'admin listening on' line:\n%s" % srv.logtail()


def start(ferry_bin, model, *flags, env=None, token_file=None):
    """A ready server with its admin API; (Server, Admin)."""
    argv = ["--admin-port", -1]
    if token_file:
        argv += ["--admin-token-file", token_file]
    srv = Server(ferry_bin, model, *(argv + list(flags)), env=env)
    srv.wait_ready()
    return srv, Admin(srv)


def stop(srv):
    rc = srv.stop()
    assert rc == 0, "ferry serve exited with %r after SIGTERM:\n%s" % (rc, srv.logtail())


def clean_env(**extra):
    drop = ("FERRY_ADMIN_TOKEN", "FERRY_EXPORT_DELAY_MS", "FERRY_FAULT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra)
    return env


def areq(adm, method, path, body=None, token=TOKEN, headers=None):
    """(status, headers, parsed JSON body) with the bearer token (token=None: no header)."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer " + token
    st, hdrs, data = request(adm, method, path, body, h)
    try:
        obj = json.loads(data.decode("utf-8")) if data else None
    except ValueError:
        pytest.fail("%s %s -> %d with a non-JSON body: %r" % (method, path, st, data[:300]))
    return st, hdrs, obj


def write_token(path, token=TOKEN, mode=0o600):
    path = Path(path)
    path.write_text(token + "\n")
    os.chmod(path, mode)
    return path


def wait_job(adm, job, states=("done", "failed", "cancelled"), timeout=JOB_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        st, _, obj = areq(adm, "GET", "/admin/v1/jobs/%s" % job)
        assert st == 200, (st, obj)
        assert set(obj) >= {"job", "state", "progress", "bytes_written", "bytes_total", "error"}, obj
        assert 0.0 <= obj["progress"] <= 1.0, obj
        if obj["state"] in states:
            return obj
        assert time.monotonic() < deadline, "job %s still %r after %ss" % (job, obj, timeout)
        time.sleep(0.05)


def export(adm, name, **fields):
    body = dict(name=name, **fields)
    st, hdrs, obj = areq(adm, "POST", "/admin/v1/export", body)
    assert st == 202, (st, obj)
    assert obj["location"] == "/admin/v1/jobs/%s" % obj["job"], obj
    assert hdrs.get("location") == obj["location"], hdrs
    return obj["job"]


def only_final_dirs(root):
    """Names under the export root (temporaries included: a leftover shows)."""
    names = sorted(p.name for p in Path(root).iterdir())
    return names


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=81)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    return write_token(tmp_path_factory.mktemp("admin-token") / "token")


@pytest.fixture(scope="module")
def export_root(tmp_path_factory):
    return tmp_path_factory.mktemp("admin-exports")


@pytest.fixture(scope="module")
def served(ferry_bin, tiny, token_file, export_root, tmp_path_factory):
    """tiny with groups on all three tiers (layer 0 on the device, the head in
    host memory, layer 1 and the embedding on disk), exports under
    export_root."""
    od = tmp_path_factory.mktemp("admin-offload")
    srv, adm = start(ferry_bin, tiny, "--batch", 8, "--max-memory-scope", "weights", "--max-memory", "device=150KiB,host=100KiB", "--offload-dir", od,
                     "--export-dir", export_root, env=clean_env(), token_file=token_file)
    try:
        yield srv, adm
        stop(srv)
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def slow_served(ferry_bin, tiny, token_file, tmp_path_factory):
    """The same model with FERRY_EXPORT_DELAY_MS: an export takes seconds, so
    a second one, a cancel or a shutdown meets it running."""
    root = tmp_path_factory.mktemp("admin-slow-exports")
    srv, adm = start(ferry_bin, tiny, "--batch", 8, "--export-dir", root,
                     env=clean_env(FERRY_EXPORT_DELAY_MS="4000"), token_file=token_file)
    try:
        yield srv, adm, root
        stop(srv)
    finally:
        srv.kill()


# --------------------------------------------------------------------------
# authentication
# --------------------------------------------------------------------------

def auth_failures(srv):
    return msum(metrics(srv), "ferry_admin_auth_failures_total")


@pytest.mark.parametrize("path", ["/admin/v1/status", "/admin/v1/jobs/1", "/nowhere"])
def test_401_without_a_token(served, path):
    srv, adm = served
    st, hdrs, obj = areq(adm, "GET", path, token=None)
    assert st == 401, (st, obj)
    assert hdrs.get("www-authenticate", "").startswith("Bearer"), hdrs
    assert "json" in hdrs.get("content-type", "") and obj["error"], (hdrs, obj)


@pytest.mark.parametrize("header", [
    "Bearer " + TOKEN[:-1] + ("x" if TOKEN[-1] != "x" else "y"),  # same length, last byte differs
    "Bearer " + TOKEN[:-1],                                         # a prefix
    "Bearer " + TOKEN + "0",                                        # longer
    "Bearer x",                                                     # much shorter
    "Bearer ",                                                      # empty
    "Basic " + TOKEN,                                               # another scheme
    TOKEN,                                                          # no scheme
])
def test_401_with_a_wrong_token(served, header):
    srv, adm = served
    before = auth_failures(srv)
    for method, path, body in (("GET", "/admin/v1/status", None), ("POST", "/admin/v1/export", {"name": "nope"}),
                               ("DELETE", "/admin/v1/jobs/1", None)):
        st, hdrs, obj = areq(adm, method, path, body, token=None, headers={"Authorization": header})
        assert st == 401, (header, method, st, obj)
        assert hdrs.get("www-authenticate", "").startswith("Bearer"), hdrs
        assert obj["error"], obj
    assert auth_failures(srv) == before + 3
    # no export was started by the refused POST
    st, _, obj = areq(adm, "GET", "/admin/v1/status")
    assert st == 200 and all(j["name"] != "nope" for j in obj["jobs"]["recent"]), obj


def test_nul_in_authorization_never_lets_in(served):
    """A NUL anywhere in the Authorization header is refused - 400 naming
    the header where the value goes on after it (libmicrohttpd 0.9.75 ends
    the value at the NUL, so the whole token followed by NUL and anything
    was compared as the token: issue 29), else 401 (a cut prefix of the
    token is not the token)."""
    srv, adm = served
    for value, status in ((b"Bearer " + TOKEN[:5].encode() + b"\x00" + TOKEN[5:].encode(), b"400"),
                          (b"Bear\x00er " + TOKEN.encode(), b"400"), (b"Bearer \x00" + TOKEN.encode(), b"400"),
                          (b"Bearer " + TOKEN.encode() + b"\x00anything", b"400"),
                          (b"Bearer " + TOKEN[:5].encode() + b"\x00", b"401")):
        with socket.create_connection(("127.0.0.1", adm.port), timeout=10) as s:
            s.sendall(b"GET /admin/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + value +
                      b"\r\n\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 " + status), (value, reply[:200])
        if status == b"400":
            assert b"Authorization holds a NUL" in reply, reply


def test_bearer_scheme_is_case_insensitive(served):
    srv, adm = served
    st, _, obj = areq(adm, "GET", "/admin/v1/status", token=None, headers={"Authorization": "bearer  " + TOKEN})
    assert st == 200, obj


@pytest.fixture
def fresh(ferry_bin, tiny, token_file):
    """A server of its own: 401 log lines are rate-limited per process, and
    the module's server has refused many requests already."""
    srv, adm = start(ferry_bin, tiny, env=clean_env(), token_file=token_file)
    try:
        yield srv, adm
        stop(srv)
    finally:
        srv.kill()


def test_auth_failures_logged_without_the_token(fresh):
    srv, adm = fresh
    secret = "s3cr3t-guess-" + "q" * 20
    n = len(srv.log)
    st, _, _ = areq(adm, "GET", "/admin/v1/status", token=secret)
    assert st == 401
    # the line reaches srv.log through the server's stderr and the reader thread
    lines = wait_until(lambda: [ln for ln in srv.log[n:] if "admin" in ln and "401" in ln],
                       lambda: "no log line for the refused request:\n%s" % srv.logtail(), timeout=10)
    assert "127.0.0.1" in lines[-1] and "wrong token" in lines[-1], lines
    assert not any(secret in ln or TOKEN in ln for ln in srv.log), "a token reached the log"


def test_auth_counters_only_count_failures(served):
    srv, adm = served
    before = auth_failures(srv)
    for _ in range(3):
        assert areq(adm, "GET", "/admin/v1/status")[0] == 200
    assert auth_failures(srv) == before


# --------------------------------------------------------------------------
# startup: where the token comes from
# --------------------------------------------------------------------------

def serve_fails(ferry, tiny, *flags, env=None):
    p = ferry.run("serve", "--model", tiny, "--http-port", 0, "--grpc-port", -1, "--host", "127.0.0.1", *flags,
                  env=env if env is not None else clean_env(), timeout=60)
    err = p.stderr.decode(errors="replace").strip()
    assert p.returncode == 2, "want exit 2, got %d: %s" % (p.returncode, err)
    assert len(err.splitlines()) == 1, "want one line: %r" % err
    return err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_token_file_with_loose_mode_is_refused(ferry, tiny, tmp_path, mode):
    tf = write_token(tmp_path / "loose-token", mode=mode)
    err = serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", tf)
    assert str(tf) in err and ("%04o" % mode) in err, err


def test_token_file_symlink_empty_or_missing_is_refused(ferry, tiny, tmp_path):
    real = write_token(tmp_path / "real-token")
    link = tmp_path / "link-token"
    link.symlink_to(real)
    assert str(link) in serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", link)
    empty = write_token(tmp_path / "empty-token", token="  ")
    assert "empty" in serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", empty)
    missing = tmp_path / "missing-token"
    assert str(missing) in serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", missing)
    assert "--admin-token-file" in serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", tmp_path)


def test_token_file_0400_and_first_line_trimmed(ferry_bin, tiny, tmp_path):
    tf = tmp_path / "ro-token"
    tf.write_text("  %s \t\nsecond line is ignored\n" % TOKEN)
    os.chmod(tf, 0o400)
    srv, adm = start(ferry_bin, tiny, env=clean_env(), token_file=tf)
    try:
        assert areq(adm, "GET", "/admin/v1/status")[0] == 200
        assert areq(adm, "GET", "/admin/v1/status", token="second")[0] == 401
    finally:
        stop(srv)


def test_non_loopback_without_a_token_is_refused(ferry, tiny):
    err = serve_fails(ferry, tiny, "--admin-host", "0.0.0.0")
    assert "0.0.0.0" in err and "token" in err, err
    # the default port too: the admin API is on unless --admin-port 0
    err = serve_fails(ferry, tiny, "--admin-port", -1, "--admin-host", "::")
    assert "token" in err, err


def test_non_loopback_with_a_token_starts_and_warns(ferry_bin, tiny, token_file):
    srv, adm = start(ferry_bin, tiny, "--admin-host", "0.0.0.0", env=clean_env(), token_file=token_file)
    try:
        assert any("plain HTTP" in ln for ln in srv.log), srv.logtail()
        assert areq(adm, "GET", "/admin/v1/status")[0] == 200
        assert areq(adm, "GET", "/admin/v1/status", token=None)[0] == 401
    finally:
        stop(srv)


def test_token_must_not_be_a_flag(ferry, tiny):
    """A flag shows in ps and shell history: the token is refused there,
    with the two places it may come from, and is not echoed back."""
    for args in (["--admin-token", TOKEN], ["--admin-token=" + TOKEN]):
        p = ferry.run("serve", "--model", tiny, *args, timeout=30)
        assert p.returncode == 2, p.stderr
        assert b"--admin-token is a secret and not taken as a flag" in p.stderr, p.stderr
        assert b"FERRY_ADMIN_TOKEN" in p.stderr and TOKEN.encode() not in p.stderr, p.stderr


def test_token_from_the_environment(ferry_bin, tiny):
    srv, adm = start(ferry_bin, tiny, env=clean_env(FERRY_ADMIN_TOKEN="env-token-42"))
    try:
        assert areq(adm, "GET", "/admin/v1/status", token="env-token-42")[0] == 200
        assert areq(adm, "GET", "/admin/v1/status", token=TOKEN)[0] == 401
        assert not any("env-token-42" in ln for ln in srv.log)
    finally:
        stop(srv)


def test_no_token_on_loopback_means_no_admin_listener(ferry_bin, tiny):
    srv = Server(ferry_bin, tiny, "--admin-port", -1, env=clean_env())
    try:
        srv.wait_ready()
        assert not any(ADMIN_RE.search(ln) for ln in srv.log), srv.logtail()
        assert any("admin API off" in ln for ln in srv.log), srv.logtail()
    finally:
        stop(srv)


def test_admin_port_0_disables_it_even_with_a_token(ferry_bin, tiny, token_file):
    srv = Server(ferry_bin, tiny, "--admin-port", 0, "--admin-token-file", token_file, env=clean_env())
    try:
        srv.wait_ready()
        assert not any(ADMIN_RE.search(ln) for ln in srv.log), srv.logtail()
    finally:
        stop(srv)


def test_export_dir_must_be_a_directory(ferry, tiny, token_file, tmp_path):
    err = serve_fails(ferry, tiny, "--admin-port", -1, "--admin-token-file", token_file,
                      "--export-dir", tmp_path / "missing")
    assert "--export-dir" in err, err


# --------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------

def test_status(served, vocab):
    srv, adm = served
    st, hdrs, s = areq(adm, "GET", "/admin/v1/status")
    assert st == 200, s
    assert s["model"] == srv.name and s["loaded"] is True
    assert s["arch"] == "LlamaForCausalLM" and s["backend"] == "cpu"
    assert "weights-dtype=" in s["conversion"] and "quantize=" in s["conversion"], s["conversion"]
    groups = s["placement"]["groups"]
    cfg = st_util.read_config(srv.model)
    assert [g["kind"] for g in groups] == ["embed"] + ["layers"] * cfg["num_hidden_layers"] + ["head"]
    tiers = {g["tier"] for g in groups}
    assert tiers == {"device", "host", "disk"}, groups
    mem = s["memory"]
    for t in ("device", "host", "disk"):
        assert mem["weights"][t] == sum(g["bytes"] for g in groups if g["tier"] == t), (t, mem, groups)
    assert mem["kv"] > 0 and mem["staging"]["slots"] >= 1 and mem["staging"]["device"] > 0, mem
    steps = s["pipeline"]["steps"]
    infer(srv, [prompt_ids(vocab, 5, 1)], 4)
    st, _, s2 = areq(adm, "GET", "/admin/v1/status")
    assert s2["pipeline"]["steps"] > steps and s2["pipeline"]["fetched_bytes"]["disk"] > 0, s2["pipeline"]
    assert s2["scheduler"]["generated_tokens"] >= 4, s2["scheduler"]
    assert set(s2["jobs"]) == {"running", "recent"}


def test_status_conversion_names_the_quantization(ferry_bin, tiny, token_file):
    srv, adm = start(ferry_bin, tiny, "--quantize", "int8", env=clean_env(), token_file=token_file)
    try:
        st, _, s = areq(adm, "GET", "/admin/v1/status")
        assert st == 200 and "int8" in s["conversion"], s
        assert s["export_dir"] is None
        st, _, obj = areq(adm, "POST", "/admin/v1/export", {"name": "x"})
        assert st == 400 and "--export-dir" in obj["error"], obj
    finally:
        stop(srv)


def test_routes_and_methods(served):
    srv, adm = served
    for method, path, code, allow in (("POST", "/admin/v1/status", 405, "GET"),
                                      ("GET", "/admin/v1/export", 405, "POST"),
                                      ("PUT", "/admin/v1/jobs/1", 405, "DELETE"),
                                      ("GET", "/admin/v1/nope", 404, None),
                                      ("GET", "/admin/v1/jobs/", 404, None),
                                      ("GET", "/admin/v1/jobs/999999", 404, None),
                                      ("DELETE", "/admin/v1/jobs/nope", 404, None),
                                      ("GET", "/admin/v1/jobs/1%00", 404, None)):
        st, hdrs, obj = areq(adm, method, path)
        assert st == code, (method, path, st, obj)
        assert obj["error"], obj
        if allow:
            assert allow in hdrs.get("allow", ""), hdrs


# --------------------------------------------------------------------------
# export requests that never start a job
# --------------------------------------------------------------------------

@pytest.mark.parametrize("body,field", [
    ("{", "JSON"),
    ("[]", "object"),
    ("", "JSON"),
    ({}, "name"),
    ({"name": 5}, "name"),
    ({"name": None}, "name"),
    ({"name": "ok", "layout": "gguf"}, "layout"),
    ({"name": "ok", "layout": 1}, "layout"),
    ({"name": "ok", "max_shard_bytes": -1}, "max_shard_bytes"),
    ({"name": "ok", "max_shard_bytes": 0}, "max_shard_bytes"),
    ({"name": "ok", "max_shard_bytes": 1.5}, "max_shard_bytes"),
    ({"name": "ok", "max_shard_bytes": "1GiB"}, "max_shard_bytes"),
    ({"name": "ok", "overwrite": "yes"}, "overwrite"),
    ({"name": "ok", "root": "/tmp"}, "root"),
])
def test_export_body_errors(served, export_root, body, field):
    srv, adm = served
    st, _, obj = areq(adm, "POST", "/admin/v1/export", body)
    assert st == 400, (body, st, obj)
    assert field.lower() in obj["error"].lower(), (body, obj)
    assert "ok" not in only_final_dirs(export_root)


def test_export_body_too_large(served):
    srv, adm = served
    st, _, obj = areq(adm, "POST", "/admin/v1/export", {"name": "big", "pad": "x" * (100 << 10)})
    assert st == 413, obj


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "", "a" * 129, ".", "..", "a b", "x\u00e9", "a\\b", ".hidden", ".ferry-export-x.tmp.1"])
def test_bad_names_are_400(served, export_root, name):
    srv, adm = served
    before = only_final_dirs(export_root)
    st, _, obj = areq(adm, "POST", "/admin/v1/export", {"name": name})
    assert st == 400, (name, st, obj)
    assert "name" in obj["error"], obj
    assert only_final_dirs(export_root) == before
    assert not (export_root.parent / "x").exists() and not Path("/abs").exists()


def test_symlink_under_the_root_is_refused(served, export_root, tmp_path):
    srv, adm = served
    outside = tmp_path / "outside"
    outside.mkdir()
    (export_root / "escape").symlink_to(outside)
    try:
        for overwrite in (False, True):
            st, _, obj = areq(adm, "POST", "/admin/v1/export", {"name": "escape", "overwrite": overwrite})
            assert st == 400, (overwrite, st, obj)
        assert list(outside.iterdir()) == []
        assert (export_root / "escape").is_symlink()
    finally:
        (export_root / "escape").unlink()


def test_128_character_name_is_allowed(served, export_root):
    srv, adm = served
    name = "n" * 128
    obj = wait_job(adm, export(adm, name))
    assert obj["state"] == "done", obj
    assert (export_root / name / "model.safetensors.index.json").is_file()


# --------------------------------------------------------------------------
# export jobs
# --------------------------------------------------------------------------

def test_export_lifecycle(served, export_root):
    srv, adm = served
    job = export(adm, "life")
    obj = wait_job(adm, job)
    assert obj["state"] == "done" and obj["error"] is None, obj
    assert obj["progress"] == 1.0 and obj["bytes_written"] == obj["bytes_total"] > 0, obj
    out = export_root / "life"
    assert out.is_dir()
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) <= {p.name for p in out.glob("*.safetensors")}
    assert (out / "config.json").is_file()
    assert only_final_dirs(export_root).count("life") == 1
    assert not [n for n in only_final_dirs(export_root) if "tmp" in n], only_final_dirs(export_root)
    # the job is listed in status
    st, _, s = areq(adm, "GET", "/admin/v1/status")
    assert any(j["job"] == job and j["state"] == "done" and j["name"] == "life" for j in s["jobs"]["recent"]), s["jobs"]
    # DELETE on a finished job: its final state, unchanged
    st, _, obj = areq(adm, "DELETE", "/admin/v1/jobs/%s" % job)
    assert st == 200 and obj["state"] == "done", obj
    assert out.is_dir()


def test_export_existing_name_needs_overwrite(served, export_root):
    srv, adm = served
    assert wait_job(adm, export(adm, "again", layout="original"))["state"] == "done"
    mtime = (export_root / "again" / "config.json").stat().st_mtime_ns
    st, _, obj = areq(adm, "POST", "/admin/v1/export", {"name": "again"})
    assert st == 400 and "exists" in obj["error"], obj
    job = export(adm, "again", overwrite=True, max_shard_bytes=64 << 10)
    assert wait_job(adm, job)["state"] == "done"
    out = export_root / "again"
    assert len(list(out.glob("model-*.safetensors"))) > 1  # the new one, sharded by max_shard_bytes
    assert (out / "config.json").stat().st_mtime_ns != mtime


def test_second_export_is_409_and_cancel(slow_served):
    srv, adm, root = slow_served
    job = export(adm, "first")
    st, hdrs, obj = areq(adm, "GET", "/admin/v1/jobs/%s" % job)
    assert obj["state"] in ("queued", "running"), obj
    st, hdrs, obj = areq(adm, "POST", "/admin/v1/export", {"name": "second"})
    assert st == 409, (st, obj)
    assert hdrs.get("location") == "/admin/v1/jobs/%s" % job, hdrs
    st, _, s = areq(adm, "GET", "/admin/v1/status")
    assert s["jobs"]["running"] and s["jobs"]["running"]["job"] == job, s["jobs"]
    st, _, obj = areq(adm, "DELETE", "/admin/v1/jobs/%s" % job)
    assert st in (200, 202), (st, obj)
    obj = wait_job(adm, job)
    assert obj["state"] == "cancelled", obj
    assert only_final_dirs(root) == [], only_final_dirs(root)  # no partial output, no temporary
    # the next export may start once the first ended
    job2 = export(adm, "second")
    assert areq(adm, "DELETE", "/admin/v1/jobs/%s" % job2)[0] in (200, 202)
    assert wait_job(adm, job2)["state"] == "cancelled"
    st, _, s = areq(adm, "GET", "/admin/v1/status")
    assert s["jobs"]["running"] is None
    assert [j["job"] for j in s["jobs"]["recent"]][:2] == [job2, job], s["jobs"]


@pytest.mark.slow
def test_export_while_8_requests_run(ferry_bin, tiny, vocab, token_file, tmp_path):
    """Outputs of 8 concurrent requests are the same with an export running
    (slowed, so that it spans them) as without; groups on all three tiers,
    so the export reads the disk tier while steps stream from it."""
    root = tmp_path / "exports"
    root.mkdir()
    od = tmp_path / "offload"
    od.mkdir()
    srv, adm = start(ferry_bin, tiny, "--batch", 8, "--max-memory-scope", "weights", "--max-memory", "device=150KiB,host=100KiB", "--offload-dir", od,
                     "--export-dir", root, env=clean_env(FERRY_EXPORT_DELAY_MS="8000"), token_file=token_file)
    try:
        prompts = [prompt_ids(vocab, 3 + i, 100 + i) for i in range(8)]

        def run_all():
            with concurrent.futures.ThreadPoolExecutor(8) as ex:
                return list(ex.map(lambda p: infer(srv, [p], 24)[0][0], prompts))

        want = run_all()
        job = export(adm, "busy")
        got = run_all()
        st, _, obj = areq(adm, "GET", "/admin/v1/jobs/%s" % job)
        overlapped = obj["state"] in ("queued", "running")
        obj = wait_job(adm, job)
        assert obj["state"] == "done", obj
        assert got == want
        assert overlapped, "the export ended before the requests did: raise FERRY_EXPORT_DELAY_MS"
        assert (root / "busy" / "model.safetensors.index.json").is_file()
    finally:
        stop(srv)


def test_failed_export_is_reported_and_serving_goes_on(ferry_bin, tiny, vocab, token_file, tmp_path):
    """ENOSPC on the third write (the fault hook): the job ends failed with
    the error, leaves nothing under the root; inference and the next
    export still work."""
    root = tmp_path / "exports"
    root.mkdir()
    srv, adm = start(ferry_bin, tiny, "--export-dir", root, env=clean_env(FERRY_FAULT="write_enospc=3"),
                     token_file=token_file)
    try:
        want = infer(srv, [prompt_ids(vocab, 4, 7)], 8)[0]
        obj = wait_job(adm, export(adm, "full"))
        assert obj["state"] == "failed" and "no space left" in obj["error"].lower(), obj
        assert only_final_dirs(root) == [], only_final_dirs(root)
        assert infer(srv, [prompt_ids(vocab, 4, 7)], 8)[0] == want
        assert wait_job(adm, export(adm, "full"))["state"] == "done"  # the fault fires once
        st, _, s = areq(adm, "GET", "/admin/v1/status")
        assert [j["state"] for j in s["jobs"]["recent"]] == ["done", "failed"], s["jobs"]
    finally:
        stop(srv)


def test_shutdown_cancels_a_running_export(ferry_bin, tiny, token_file, tmp_path):
    root = tmp_path / "exports"
    root.mkdir()
    srv, adm = start(ferry_bin, tiny, "--export-dir", root, env=clean_env(FERRY_EXPORT_DELAY_MS="4000"),
                     token_file=token_file)
    try:
        job = export(adm, "interrupted")
        assert areq(adm, "GET", "/admin/v1/jobs/%s" % job)[2]["state"] in ("queued", "running")
    finally:
        stop(srv)
    assert any("export %s is running: cancelling it" % job in ln for ln in srv.log), srv.logtail()
    assert any(ln.endswith("export %s cancelled" % job) for ln in srv.log), srv.logtail()
    assert not any("export %s done" % job in ln for ln in srv.log), srv.logtail()
    assert only_final_dirs(root) == [], only_final_dirs(root)


def test_finished_export_is_logged_and_not_cancelled_at_shutdown(ferry_bin, tiny, token_file, tmp_path):
    """An export that finished and was never polled says 'export N done' when
    it finishes (no poll needed to learn it), and SIGTERM then neither
    cancels it nor says it did: the export stays in place."""
    root = tmp_path / "exports"
    root.mkdir()
    srv, adm = start(ferry_bin, tiny, "--export-dir", root, env=clean_env(), token_file=token_file)
    try:
        job = export(adm, "finished")
        done = "ferry: admin: export %s done" % job
        deadline = time.monotonic() + JOB_TIMEOUT
        while not any(ln.startswith(done) for ln in srv.log):  # the log, not the job endpoint
            assert time.monotonic() < deadline, "no %r line:\n%s" % (done, srv.logtail())
            time.sleep(0.05)
    finally:
        stop(srv)
    said = [ln for ln in srv.log if "export %s" % job in ln]
    assert not any("cancel" in ln for ln in said), said
    assert only_final_dirs(root) == ["finished"], only_final_dirs(root)
    assert (root / "finished" / "model.safetensors.index.json").exists()


def test_stale_temporaries_removed_at_start(ferry_bin, tiny, token_file, tmp_path):
    """A temporary of an export whose process died (kill -9: nobody holds its
    lock any more) is removed when a server with that --export-dir starts;
    one a live exporter holds, a finished export and anything else under
    the root are left alone."""
    import fcntl
    root = tmp_path / "exports"
    root.mkdir()
    (root / ".ferry-export-old.tmp.1").mkdir()  # PID 1, as in a container: the PID proves nothing
    (root / ".ferry-export-old.tmp.1" / "model-00001-of-00001.safetensors").write_bytes(b"x" * 100)
    live = root / ".ferry-export-live.tmp.0123456789abcdef"
    live.mkdir()
    (root / "done").mkdir()
    (root / "notes.txt").write_text("mine")
    fd = os.open(str(live), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    srv, adm = start(ferry_bin, tiny, "--export-dir", root, env=clean_env(), token_file=token_file)
    try:
        assert sorted(p.name for p in root.iterdir()) == sorted([live.name, "done", "notes.txt"])
    finally:
        stop(srv)
        os.close(fd)


def test_swapped_temporary_is_not_published(ferry_bin, tiny, vocab, token_file, tmp_path):
    """Issue 29.7: the job's temporary directory renamed away mid-job and a
    symlink put under its name: the job ends failed saying the temporary
    was replaced, nothing (not the link) appears as ROOT/NAME, the link's
    target is untouched, and the server keeps serving and exporting."""
    root = tmp_path / "exports"
    root.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("not ferry's")
    srv, adm = start(ferry_bin, tiny, "--export-dir", root, env=clean_env(FERRY_EXPORT_DELAY_MS="4000"),
                     token_file=token_file)
    try:
        want = infer(srv, [prompt_ids(vocab, 4, 7)], 8)[0]
        job = export(adm, "swapped")
        temps = [p for p in root.iterdir() if p.name.startswith(".ferry-export-swapped.tmp.")]
        assert len(temps) == 1, only_final_dirs(root)
        moved = tmp_path / "moved-away"
        os.rename(temps[0], moved)
        os.symlink(target, temps[0])
        st, _, obj = areq(adm, "GET", "/admin/v1/jobs/%s" % job)
        assert obj["state"] in ("queued", "running"), "the job ended before the swap: raise FERRY_EXPORT_DELAY_MS"
        obj = wait_job(adm, job)
        assert obj["state"] == "failed", obj
        assert "temporary directory" in obj["error"] and "replaced" in obj["error"], obj
        assert not os.path.lexists(root / "swapped"), os.listdir(root)
        assert only_final_dirs(root) == [], only_final_dirs(root)  # the link under the job's name is gone
        assert sorted(os.listdir(target)) == ["keep.txt"]
        assert os.listdir(moved) == []  # what the job wrote, removed through its descriptor
        assert infer(srv, [prompt_ids(vocab, 4, 7)], 8)[0] == want
        st, _, s = areq(adm, "GET", "/admin/v1/status")
        assert st == 200 and s["jobs"]["recent"][0]["state"] == "failed", s["jobs"]
    finally:
        stop(srv)


# --------------------------------------------------------------------------
# connections: slow loris (issue 29.6)
# --------------------------------------------------------------------------

class Tricklers:
    """n connections to the admin port sending a request head one byte
    every `every` seconds, forever (a background thread); closed() says
    which ones the server has closed."""

    def __init__(self, adm, n, every=1.0):
        import socket
        import threading
        self.socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", adm.port), timeout=10)
            s.sendall(b"GET /admin/v1/status HTTP/1.1\r\nHost: x\r\n")
            s.setblocking(False)  # the polls below must not wait
            self.socks.append(s)
        self.gone = set()
        self.stop_ev = threading.Event()
        self.every = every
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _poll(self):
        import socket
        for i, s in enumerate(self.socks):
            if i in self.gone:
                continue
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    self.gone.add(i)
                    continue
            except BlockingIOError:
                pass
            except OSError:
                self.gone.add(i)
                continue
            try:
                s.send(b"X")  # a header name that never ends
            except OSError:
                self.gone.add(i)

    def _run(self):
        while not self.stop_ev.wait(self.every):
            self._poll()

    def wait_closed(self, count, timeout):
        """Waits (a hang guard, not a measurement) until `count` are closed."""
        deadline = time.monotonic() + timeout
        while len(self.gone) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        return set(self.gone)

    def close(self):
        self.stop_ev.set()
        self.thread.join()
        for s in self.socks:
            s.close()


@pytest.mark.slow
def test_trickled_heads_do_not_lock_the_operator_out(ferry_bin, tiny, token_file):
    """16 connections trickling a head a byte a second (which keeps MHD's own
    idle timeout from firing): an authorised GET status still succeeds, and
    every trickling connection is closed once --request-timeout (2 s) has
    passed; the listener serves on."""
    srv, adm = start(ferry_bin, tiny, "--request-timeout", 2, env=clean_env(), token_file=token_file)
    tr = Tricklers(adm, 16)
    try:
        st, _, obj = areq(adm, "GET", "/admin/v1/status")
        assert st == 200 and obj["model"], (st, obj)
        gone = tr.wait_closed(16, timeout=25)  # far below MHD's 30 s idle timeout, which the trickle resets anyway
        assert len(gone) == 16, "%d of 16 trickling connections still open" % (16 - len(gone))
        assert areq(adm, "GET", "/admin/v1/status")[0] == 200
    finally:
        tr.close()
        stop(srv)


def test_waiting_limit_closes_the_oldest_waiting_connection(ferry_bin, tiny, token_file):
    """--admin-max-connections 4 with 4 connections trickling heads and a
    deadline far off (--request-timeout 300): the operator's connection is
    let in by closing the oldest of them, and its GET succeeds."""
    srv, adm = start(ferry_bin, tiny, "--request-timeout", 300, "--admin-max-connections", 4,
                     env=clean_env(), token_file=token_file)
    tr = Tricklers(adm, 4)
    try:
        for _ in range(3):
            st, _, obj = areq(adm, "GET", "/admin/v1/status")
            assert st == 200 and obj["model"], (st, obj)
        gone = tr.wait_closed(1, timeout=10)
        assert 0 in gone, gone  # the first to connect waited longest
        assert len(gone) <= 3, gone  # one per connection that opened at the limit
    finally:
        tr.close()
        stop(srv)


def test_401_log_lines_escaped_and_limited(fresh):
    """What a client sends reaches the log escaped (no raw control bytes: a
    path with ESC and CR cannot forge or recolour log lines), and a flood of
    refused requests writes at most a burst of lines (10 per 10 s); the
    counter has every one."""
    srv, adm = fresh
    n, before = len(srv.log), auth_failures(srv)
    with socket.create_connection(("127.0.0.1", adm.port), timeout=10) as s:
        s.sendall(b"G\x1b[2J\x7fET /admin/v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    for _ in range(40):
        st, _, _ = areq(adm, "GET", "/admin/v1/status", token="wrong")
        assert st == 401
    assert auth_failures(srv) == before + 41
    time.sleep(0.3)
    lines = [ln for ln in srv.log[n:] if "admin: 401" in ln]
    assert 1 <= len(lines) <= 10, lines
    assert "\\x1b" in lines[0] and "\x1b" not in lines[0] and "\r" not in lines[0], lines[0]
    assert not any(ln.startswith("ferry: forged") for ln in srv.log), srv.logtail()
