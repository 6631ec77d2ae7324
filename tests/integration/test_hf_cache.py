"""Models as users have them from the Hugging Face cache.

The test builds the cache layout huggingface_hub writes, from mkmodel
checkpoints (single file and sharded): <cache>/models--org--name/ with
blobs/<sha256>, snapshots/<commit>/<file> symlinks to ../../blobs/<sha256>,
and refs/main holding the commit. Then:
  * a snapshot directory loads and generates what the plain directory does;
  * --model org/name, org/name@<commit>, org/name@main and another ref,
    found through $HF_HUB_CACHE, $HF_HOME/hub and ~/.cache/huggingface/hub,
    by generate, inspect and serve (whose default model name is the repo's
    name);
  * a symlink leading out of the repository's folder (another repository's
    blobs, /etc) is refused naming the file and where it leads, for
    config.json, a shard and a file export copies;
  * a missing repository, revision, ref or snapshot, and a blob missing
    under its link, are errors that say which and where ferry looked.
Every run gets an environment with HOME, HF_HOME, HF_HUB_CACHE and
XDG_CACHE_HOME set (or removed) by the test, never the user's own cache.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import st_util
from conftest import assert_ferry_error, prompt_ids

N_NEW = 6
COMMIT_A = "a" * 8 + "0123456789abcdef0123456789abcdef"  # 40 hex digits
COMMIT_B = "b" * 8 + "fedcba9876543210fedcba9876543210"


def cache_repo(cache, repo_id, snapshots, refs):
    """Writes repo_id into cache (a hub folder) as huggingface_hub does.
    snapshots: {commit: model dir}; refs: {ref name: commit}. Returns the
    repository folder."""
    org, name = repo_id.split("/")
    repo = Path(cache) / ("models--%s--%s" % (org, name))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, src in snapshots.items():
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        for f in sorted(Path(src).iterdir()):
            data = f.read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            blob = repo / "blobs" / sha
            if not blob.exists():
                blob.write_bytes(data)
            os.symlink(os.path.join("..", "..", "blobs", sha), str(snap / f.name))
    for ref, commit in refs.items():
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return repo


def hf_env(home, hub_cache=None, hf_home=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE")}
    env["HOME"] = str(home)
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return env


def generate(ferry, model, prompt, env, work, tag):
    dump = work / ("%s.bin" % tag)
    p = ferry.run("generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
                  "--max-new-tokens", N_NEW, "--json", "--dump-logits", dump, env=env)
    assert p.returncode == 0, "generate --model %s failed: %s" % (model, p.stderr.decode())
    return json.loads(p.stdout)["output_ids"], np.fromfile(str(dump), dtype="<f4")


@pytest.fixture(scope="module")
def plain(models):
    return {"single": models.get("llama", "tiny", seed=31),
            "sharded": models.get("qwen2", "tiny", seed=32, shard_size="16KiB"),
            "other": models.get("llama", "tiny", seed=33)}


@pytest.fixture(scope="module")
def world(plain, tmp_path_factory):
    """A home with an empty ~/.cache, a hub cache holding org/tiny (main ->
    A = single, v2 -> B = other) and org/sharded (main -> A = sharded)."""
    root = tmp_path_factory.mktemp("hf")
    home = root / "home"
    home.mkdir()
    hub = root / "hub"
    tiny = cache_repo(hub, "org/tiny", {COMMIT_A: plain["single"], COMMIT_B: plain["other"]},
                      {"main": COMMIT_A, "v2": COMMIT_B})
    sharded = cache_repo(hub, "org/sharded", {COMMIT_A: plain["sharded"]}, {"main": COMMIT_A})
    assert len(st_util.model_files(sharded / "snapshots" / COMMIT_A)) > 1
    return {"root": root, "home": home, "hub": hub, "tiny": tiny, "sharded": sharded}


@pytest.fixture(scope="module")
def expected(ferry, plain, tmp_path_factory):
    """What the plain directories generate."""
    work = tmp_path_factory.mktemp("want")
    prompt = prompt_ids(256, 20, 31)
    return prompt, {k: generate(ferry, d, prompt, None, work, k) for k, d in plain.items()}


def same(got, want):
    assert got[0] == want[0]
    assert np.array_equal(got[1], want[1])


# --------------------------------------------------------------------------
# loading from the cache
# --------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["single", "sharded"])
def test_snapshot_dir_loads_like_the_plain_dir(ferry, world, expected, work, which):
    prompt, want = expected
    repo = world["tiny" if which == "single" else "sharded"]
    snap = repo / "snapshots" / COMMIT_A
    assert all(os.path.islink(str(f)) for f in snap.iterdir())
    same(generate(ferry, snap, prompt, hf_env(world["home"]), work, which), want[which])


@pytest.mark.parametrize("spec,which", [
    ("org/tiny", "single"),
    ("org/tiny@main", "single"),
    ("org/tiny@" + COMMIT_A, "single"),
    ("org/tiny@v2", "other"),
    ("org/tiny@" + COMMIT_B, "other"),
    ("org/sharded", "sharded"),
])
def test_repo_id_through_hf_hub_cache(ferry, world, expected, work, spec, which):
    prompt, want = expected
    same(generate(ferry, spec, prompt, hf_env(world["home"], hub_cache=world["hub"]), work, "x"), want[which])


def test_repo_id_through_hf_home(ferry, world, expected, work):
    prompt, want = expected
    hf_home = work / "hf_home"
    hf_home.mkdir()
    os.symlink(str(world["hub"]), str(hf_home / "hub"))
    env = hf_env(world["home"], hf_home=hf_home)
    same(generate(ferry, "org/tiny", prompt, env, work, "a"), want["single"])
    same(generate(ferry, "org/sharded@main", prompt, env, work, "b"), want["sharded"])


def test_repo_id_through_home_cache(ferry, world, expected, work):
    prompt, want = expected
    home = work / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    os.symlink(str(world["hub"]), str(home / ".cache" / "huggingface" / "hub"))
    same(generate(ferry, "org/tiny@v2", prompt, hf_env(home), work, "a"), want["other"])


def test_hf_hub_cache_comes_first(ferry, world, plain, expected, work):
    """Two caches hold org/tiny: $HF_HUB_CACHE's is used, as huggingface_hub does."""
    prompt, want = expected
    first = work / "first"
    cache_repo(first, "org/tiny", {COMMIT_B: plain["other"]}, {"main": COMMIT_B})
    hf_home = work / "hf_home"
    hf_home.mkdir()
    os.symlink(str(world["hub"]), str(hf_home / "hub"))
    same(generate(ferry, "org/tiny", prompt, hf_env(world["home"], hub_cache=first, hf_home=hf_home), work, "a"),
         want["other"])


def test_inspect_and_plan_take_a_repo_id(ferry, world):
    env = hf_env(world["home"], hub_cache=world["hub"])
    p = ferry.run("inspect", "--model", "org/sharded", "--json", env=env)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["architecture"] == "Qwen2ForCausalLM" and info["files"] > 1
    p = ferry.run("plan", "--model", "org/tiny@v2", env=env)
    assert p.returncode == 0, p.stderr


def test_serve_names_the_model_after_the_repo(ferry_bin, world):
    from test_http import Server, request
    env = hf_env(world["home"], hub_cache=world["hub"])
    srv = Server(ferry_bin, "org/tiny", env=env)
    try:
        srv.wait_ready()
        assert request(srv, "GET", "/v2/models/tiny")[0] == 200, srv.logtail()
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_a_directory_wins_over_a_repo_id(ferry, world, plain, expected, work, monkeypatch):
    """A relative path that exists is the directory, whatever the cache holds."""
    prompt, want = expected
    (work / "org").mkdir()
    shutil.copytree(str(plain["other"]), str(work / "org" / "tiny"))
    monkeypatch.chdir(str(work))
    same(generate(ferry, "org/tiny", prompt, hf_env(world["home"], hub_cache=world["hub"]), work, "a"),
         want["other"])


# --------------------------------------------------------------------------
# links out of the repository
# --------------------------------------------------------------------------

def repo_copy(world, work, name):
    """A private copy of org/tiny's or org/sharded's repository folder (links
    kept, relative), under a fresh hub; returns (hub, repo, snapshot A)."""
    hub = work / "hub"
    hub.mkdir(exist_ok=True)
    repo = hub / world[name].name
    shutil.copytree(str(world[name]), str(repo), symlinks=True)
    return hub, repo, repo / "snapshots" / COMMIT_A


def relink(link, target):
    os.unlink(str(link))
    os.symlink(str(target), str(link))


def test_link_into_another_repository_refused(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "tiny")
    # a valid config.json, but another repository's blob
    other = cache_repo(hub, "evil/other", {COMMIT_A: snap.resolve()}, {"main": COMMIT_A})
    target = (other / "snapshots" / COMMIT_A / "config.json").resolve()
    relink(snap / "config.json", target)
    env = hf_env(world["home"], hub_cache=hub)
    for spec in ("org/tiny", str(snap)):
        p = ferry.run("generate", "--model", spec, "--prompt-ids", "1,2", "--max-new-tokens", 1, env=env)
        line = assert_ferry_error(p, ["config.json"])
        assert str(target) in line and "outside" in line, line
    p = ferry.run("inspect", "--model", "org/tiny", env=env)
    assert str(target) in assert_ferry_error(p, ["config.json"])


def test_link_to_etc_refused(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "tiny")
    relink(snap / "model.safetensors", "/etc/passwd")
    p = ferry.run("generate", "--model", "org/tiny", "--prompt-ids", "1,2", "--max-new-tokens", 1,
                  env=hf_env(world["home"], hub_cache=hub))
    line = assert_ferry_error(p, ["model.safetensors"])
    assert "/etc/passwd" in line and "outside" in line, line


def test_shard_link_out_of_the_repository_refused(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "sharded")
    shard = st_util.model_files(snap)[1]
    outside = work / "outside"
    outside.mkdir()
    shutil.copyfile(str((snap / shard).resolve()), str(outside / shard))
    relink(snap / shard, outside / shard)
    p = ferry.run("generate", "--model", "org/sharded", "--prompt-ids", "1,2", "--max-new-tokens", 1,
                  env=hf_env(world["home"], hub_cache=hub))
    line = assert_ferry_error(p, [shard])
    assert str(outside / shard) in line, line


def test_link_elsewhere_inside_the_repository_is_fine(ferry, world, expected, work):
    """A link into the same repository's folder, though not through blobs/."""
    prompt, want = expected
    hub, repo, snap = repo_copy(world, work, "tiny")
    keep = repo / "kept-config.json"
    shutil.copyfile(str((snap / "config.json").resolve()), str(keep))
    relink(snap / "config.json", "../../kept-config.json")
    same(generate(ferry, "org/tiny", prompt, hf_env(world["home"], hub_cache=hub), work, "a"), want["single"])


def test_plain_dir_keeps_the_old_rule(ferry, plain, work):
    """Outside a cache layout a file must resolve directly inside the model
    directory: a link to a copy next to it is refused."""
    d = work / "m"
    shutil.copytree(str(plain["single"]), str(d))
    shutil.copyfile(str(d / "config.json"), str(work / "config.json"))
    relink(d / "config.json", work / "config.json")
    p = ferry.run("generate", "--model", d, "--prompt-ids", "1,2", "--max-new-tokens", 1)
    line = assert_ferry_error(p, ["config.json"])
    assert "outside the model directory" in line and str(work / "config.json") in line, line


def test_export_refuses_a_tokenizer_out_of_the_repository(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "tiny")
    secret = work / "secret.json"
    secret.write_text("{}")
    os.symlink(str(secret), str(snap / "tokenizer.json"))
    root = work / "exports"
    root.mkdir()
    p = ferry.run("export", "--model", "org/tiny", "--out", root / "ex", env=hf_env(world["home"], hub_cache=hub))
    line = assert_ferry_error(p, ["tokenizer.json"])
    assert str(secret) in line, line


def test_export_copies_tokenizer_files_through_links(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "tiny")
    blob = repo / "blobs" / "tok"
    blob.write_text('{"version": "1.0"}')
    os.symlink("../../blobs/tok", str(snap / "tokenizer.json"))
    root = work / "exports"
    root.mkdir()
    p = ferry.run("export", "--model", "org/tiny", "--out", root / "ex", env=hf_env(world["home"], hub_cache=hub))
    assert p.returncode == 0, p.stderr
    assert (root / "ex" / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert not (root / "ex" / "tokenizer.json").is_symlink()


# --------------------------------------------------------------------------
# not found
# --------------------------------------------------------------------------

def run_gen(ferry, spec, env):
    return ferry.run("generate", "--model", spec, "--prompt-ids", "1,2", "--max-new-tokens", 1, env=env)


def test_missing_repository_names_every_place_looked(ferry, world, work):
    hf_home = work / "hf_home"
    env = hf_env(world["home"], hub_cache=world["hub"], hf_home=hf_home)
    line = assert_ferry_error(run_gen(ferry, "org/absent", env), ["org/absent"])
    for where in (world["hub"] / "models--org--absent", hf_home / "hub" / "models--org--absent",
                  world["home"] / ".cache" / "huggingface" / "hub" / "models--org--absent"):
        assert str(where) in line, line
    assert "'main'" in line


def test_missing_revision(ferry, world):
    env = hf_env(world["home"], hub_cache=world["hub"])
    line = assert_ferry_error(run_gen(ferry, "org/tiny@nope", env), ["org/tiny"])
    assert "'nope'" in line and str(world["tiny"] / "refs" / "nope") in line, line
    commit = "c" * 40
    line = assert_ferry_error(run_gen(ferry, "org/tiny@" + commit, env), ["org/tiny"])
    assert str(world["tiny"] / "snapshots" / commit) in line, line


def test_ref_without_its_snapshot(ferry, world, work):
    hub, repo, snap = repo_copy(world, work, "tiny")
    shutil.rmtree(str(repo / "snapshots" / COMMIT_A))
    line = assert_ferry_error(run_gen(ferry, "org/tiny", hf_env(world["home"], hub_cache=hub)), ["org/tiny"])
    assert "'main'" in line and str(repo / "snapshots" / COMMIT_A) in line, line
    (repo / "refs" / "main").write_text("not a commit\n")
    line = assert_ferry_error(run_gen(ferry, "org/tiny", hf_env(world["home"], hub_cache=hub)), ["org/tiny"])
    assert "commit hash" in line and str(repo / "refs" / "main") in line, line


def test_missing_blob(ferry, world, work):
    """An interrupted download: the link is there, its blob is not."""
    hub, repo, snap = repo_copy(world, work, "tiny")
    os.unlink(str((snap / "model.safetensors").resolve()))
    line = assert_ferry_error(run_gen(ferry, "org/tiny", hf_env(world["home"], hub_cache=hub)),
                              ["model.safetensors"])
    assert "does not exist" in line and "blobs" in line, line


def test_not_a_repo_id_is_a_missing_directory(ferry, world, work):
    """Paths that cannot be repo ids fail as before: the directory is missing."""
    env = hf_env(world["home"], hub_cache=world["hub"])
    for spec in (str(work / "nowhere"), "a/b/c", "org/-bad", "org--x/y"):
        line = assert_ferry_error(run_gen(ferry, spec, env), ["config.json", "no such file"])
        assert "Hugging Face" not in line, line


def test_repo_id_of_a_gguf_repository(ferry, work):
    """A cached repository holding one GGUF file (and no config.json) is
    that file, as a directory holding one is; its link must stay inside the
    repository like every snapshot file's."""
    from test_gguf_model import PROMPTS, make_pair
    g, _ = make_pair(work / "src", "qwen2")
    src = work / "gg"
    src.mkdir()
    g.rename(src / "model-Q8_0.gguf")
    hub = work / "hub"
    repo = cache_repo(hub, "org/gg", {COMMIT_A: src}, {"main": COMMIT_A})
    env = hf_env(work, hub_cache=hub)
    a = ferry.check("generate", "--model", "org/gg", "--prompt-ids", ",".join(map(str, PROMPTS[0])),
                    "--max-new-tokens", 3, env=env).stdout
    b = ferry.check("generate", "--model", src / "model-Q8_0.gguf", "--prompt-ids", ",".join(map(str, PROMPTS[0])),
                    "--max-new-tokens", 3).stdout
    assert a == b and a.strip()
    link = repo / "snapshots" / COMMIT_A / "model-Q8_0.gguf"
    link.unlink()
    os.symlink(str(src / "model-Q8_0.gguf"), str(link))  # out of the repository
    p = ferry.run("inspect", "--model", "org/gg", env=env)
    assert p.returncode != 0 and "model-Q8_0.gguf" in p.stderr.decode(), p.stderr
