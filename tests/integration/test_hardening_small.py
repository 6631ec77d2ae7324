"""Issue 29, item 8: the smaller defects of the second red-team pass, each
with the answer a client (or an operator) now gets."""

import json
import os
import shutil

import pytest

from test_http import assert_alive, request, serve
from text_util import DEMO_TOKENIZER, text_model


def _post(srv, path, obj):
    st, _, body = request(srv, "POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json"})
    return st, json.loads(body)


# --------------------------------------------------------------------------
# a Replace normalizer with long content
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv_long_replace(ferry_bin, ferry, tmp_path_factory):
    root = tmp_path_factory.mktemp("longrep")
    tok = root / "tok"
    tok.mkdir()
    tj = json.loads((DEMO_TOKENIZER / "tokenizer.json").read_text(encoding="utf-8"))
    # a space becomes 300 letters: longer than the size bound's scratch (256 code points)
    tj["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": " "}, "content": "x" * 300}, {"type": "NFC"}]}
    (tok / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    shutil.copy(DEMO_TOKENIZER / "tokenizer_config.json", tok)
    m = text_model(ferry, root / "m", tok, seed=97)
    yield from serve(ferry_bin, m, name="longrep")


def test_long_replace_content_is_not_server_busy(srv_long_replace):
    """The encode's size bound used to saturate to SIZE_MAX for any text
    with a space, and the budget sum wrapped: every text request was 503
    'server busy' on an idle server. Now the bound is the content's length
    and short texts are served."""
    got = [_post(srv_long_replace, "/v2/models/longrep/generate",
                 {"text_input": "hi there", "parameters": {"max_new_tokens": 1}}),
           _post(srv_long_replace, "/tokenize", {"content": "hi there"}),
           _post(srv_long_replace, "/v1/completions", {"prompt": "hi there", "max_tokens": 1})]
    assert [st for st, _ in got] == [200, 200, 200], got
    assert_alive(srv_long_replace)


# --------------------------------------------------------------------------
# a NUL in the admin token
# --------------------------------------------------------------------------

ADMIN_TOKEN = "adm1n-T0ken-for-tests-0123456789"


def _token_file(path, data):
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("FERRY_ADMIN_TOKEN", "FERRY_FAULT")}


def test_nul_in_the_admin_token_file_is_refused(ferry, models, tmp_path):
    """'TOKEN\\0rest' used to load as TOKEN, silently; now serve refuses the
    file, naming it and the NUL."""
    tf = _token_file(tmp_path / "token", ADMIN_TOKEN.encode() + b"\0more\n")
    p = ferry.run("serve", "--model", models.get("llama", "tiny", seed=81), "--http-port", 0, "--grpc-port", -1,
                  "--host", "127.0.0.1", "--admin-port", -1, "--admin-token-file", tf, env=_clean_env(), timeout=60)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 2 and str(tf) in err and "NUL" in err, (p.returncode, err)


# --------------------------------------------------------------------------
# ferry config --print runs serve's checks
# --------------------------------------------------------------------------

@pytest.mark.parametrize("flags, needle", [
    (["--batch", "100", "--max-step-tokens", "10"], "--batch 100 exceeds --max-step-tokens 10"),
    (["--request-memory", "1KiB"], "--request-memory must be at least --max-body"),
    (["--max-connections", "10", "--max-connections-per-ip", "20"], "--max-connections-per-ip 20 exceeds"),
    (["--max-output-tokens", "1"], "--max-output-tokens must be at least"),
    (["--name", "a/b"], "--name must be 1..200 characters"),
    (["--max-memory", "host=lots"], "bad size 'lots'"),
])
def test_config_print_refuses_what_serve_refuses(ferry, flags, needle):
    """`ferry config --print` used to print these (exit 0) though serve
    refuses them; now it exits 2 with serve's own message."""
    p = ferry.run("config", "--print", *flags, env=_clean_env())
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 2 and needle in err, (p.returncode, err, p.stdout[:200])
    ok = ferry.run("config", "--print", env=_clean_env())
    assert ok.returncode == 0 and json.loads(ok.stdout), ok.stderr
