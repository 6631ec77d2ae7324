"""ferry CLI behaviour: inspect, mkmodel, sampling determinism, output formats, and where results go
(--dump-logits into what is not a regular file, write errors on stdout)."""

import json
import os
import re

import numpy as np
import pytest

import st_util
from conftest import assert_ferry_error, prompt_ids, rel_err

N = 16


def _all_files(d):
    return sorted(p.name for p in d.iterdir() if p.is_file())


def _tensor_table(d):
    """{name: (file, dtype, nbytes)} over every safetensors file of the model."""
    out = {}
    for f in st_util.model_files(d):
        st = st_util.read(d / f)
        for n in st.names:
            assert n not in out, "tensor %s in two files" % n
            b, e = st.info(n)["data_offsets"]
            out[n] = (f, st.info(n)["dtype"], e - b)
    return out


# --------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------

@pytest.mark.parametrize("arch,dtype,sharded", [("llama", "f32", False), ("qwen3", "bf16", False),
                                                ("qwen2", "f16", True)])
def test_inspect_json(ferry, models, arch, dtype, sharded):
    d = models.get(arch, "tiny", dtype=dtype, shard_size="16KiB" if sharded else None)
    p = ferry.check("inspect", "--model", d, "--json")
    obj = json.loads(p.stdout.decode())
    table = _tensor_table(d)
    cfg = st_util.read_config(d)
    assert obj["tensors"] == len(table)
    by = {}
    for f, dt, nb in table.values():
        by[dt] = by.get(dt, 0) + nb
    assert {k: v for k, v in obj["bytes_by_dtype"].items() if v} == by
    data_bytes = 0
    for f in st_util.model_files(d):
        st = st_util.read(d / f)
        data_bytes += os.path.getsize(d / f) - 8 - st.header_len
    assert sum(obj["bytes_by_dtype"].values()) == data_bytes
    a = str(obj["architecture"]).lower()
    assert a in (cfg["architectures"][0].lower(), arch), obj["architecture"]
    # config fields are reported too
    for k in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if k in obj:
            assert obj[k] == cfg[k], k


def test_inspect_text(ferry, models):
    d = models.get("llama", "tiny")
    p = ferry.check("inspect", "--model", d)
    out = p.stdout.decode()
    assert str(len(_tensor_table(d))) in re.findall(r"\d+", out)
    assert "llama" in out.lower()


# --------------------------------------------------------------------------
# mkmodel
# --------------------------------------------------------------------------

def test_mkmodel_same_seed_identical(ferry, tmp_path):
    a = ferry.mkmodel(tmp_path / "a", "qwen2", "tiny", seed=42)
    b = ferry.mkmodel(tmp_path / "b", "qwen2", "tiny", seed=42)
    assert _all_files(a) == _all_files(b)
    for f in _all_files(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_mkmodel_different_seed_differs(ferry, tmp_path):
    a = ferry.mkmodel(tmp_path / "a", "llama", "tiny", seed=1)
    b = ferry.mkmodel(tmp_path / "b", "llama", "tiny", seed=2)
    assert st_util.read_config(a) == st_util.read_config(b)
    sa, sb = st_util.read(a / "model.safetensors"), st_util.read(b / "model.safetensors")
    assert sa.names == sb.names
    assert sa.data != sb.data
    # every weight matrix differs, not just one of them
    for n in sa.names:
        if n.endswith("proj.weight") or n.endswith("embed_tokens.weight"):
            assert sa.raw(n) != sb.raw(n), n


def test_mkmodel_sharded_index(ferry, tmp_path):
    d = ferry.mkmodel(tmp_path / "m", "llama", "tiny", shard_size="16KiB", seed=3)
    index = st_util.read_index(d)
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    assert len(shards) > 1
    n = len(shards)
    assert shards == ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]
    assert not (d / "model.safetensors").exists()
    present = set(p.name for p in d.iterdir())
    assert set(shards) <= present
    seen = {}
    for f in shards:
        st = st_util.read(d / f)
        for name in st.names:
            assert name not in seen, "%s in %s and %s" % (name, seen[name], f)
            seen[name] = f
        size = os.path.getsize(d / f)
        # a shard exceeds the limit only when it holds a single oversized tensor
        assert size - 8 - st.header_len <= 16 * 1024 or len(st.names) == 1, (f, size)
    assert seen == dict(wm), "weight_map does not match the shards' contents"
    total = index.get("metadata", {}).get("total_size")
    if total is not None:
        assert total == sum(nb for _, _, nb in _tensor_table(d).values())
    # same weights as the unsharded model with the same seed
    one = ferry.mkmodel(tmp_path / "one", "llama", "tiny", seed=3)
    st1 = st_util.read(one / "model.safetensors")
    assert set(st1.names) == set(wm)
    for name, f in wm.items():
        assert st_util.read(d / f).raw(name) == st1.raw(name), name


@pytest.mark.parametrize("shard_size", ["65536", "64KiB"])
def test_mkmodel_shard_size_units(ferry, tmp_path, shard_size):
    d = ferry.mkmodel(tmp_path / "m", "llama", "tiny", shard_size=shard_size, seed=3)
    if (d / "model.safetensors.index.json").exists():
        for f in st_util.model_files(d):
            st = st_util.read(d / f)
            assert os.path.getsize(d / f) - 8 - st.header_len <= 65536 or len(st.names) == 1


def test_mkmodel_options(ferry, tmp_path):
    d = ferry.mkmodel(tmp_path / "m", "llama", "tiny", layers=3, kv_heads=1, tied=True,
                      dtype="bf16", seed=9)
    cfg = st_util.read_config(d)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_hidden_layers"] == 3
    assert cfg["num_key_value_heads"] == 1
    assert cfg["tie_word_embeddings"] is True
    st = st_util.read(d / "model.safetensors")
    names = set(st.names)
    assert "model.layers.2.mlp.down_proj.weight" in names
    assert not any(n.startswith("model.layers.3.") for n in names)
    assert {st.info(n)["dtype"] for n in names} == {"BF16"}
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert st.info("model.layers.0.self_attn.k_proj.weight")["shape"] == [hd, cfg["hidden_size"]]
    assert st.info("model.layers.0.self_attn.q_proj.weight")["shape"] == [
        cfg["num_attention_heads"] * hd, cfg["hidden_size"]]
    # weights are finite and not degenerate
    for n in names:
        a = st.array(n)
        assert np.all(np.isfinite(a)), n
        if n.endswith("proj.weight"):
            assert float(np.std(a)) > 0, n


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_mkmodel_config_is_hf_layout(models, arch):
    d = models.get(arch, "tiny")
    cfg = st_util.read_config(d)
    want = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert cfg["architectures"] == [want]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "vocab_size", "rms_norm_eps"):
        assert k in cfg, k
    names = set(st_util.read(d / "model.safetensors").names)
    for i in range(cfg["num_hidden_layers"]):
        for t in ("input_layernorm", "post_attention_layernorm"):
            assert "model.layers.%d.%s.weight" % (i, t) in names
        for t in ("q", "k", "v", "o"):
            assert "model.layers.%d.self_attn.%s_proj.weight" % (i, t) in names
        for t in ("gate", "up", "down"):
            assert "model.layers.%d.mlp.%s_proj.weight" % (i, t) in names
    assert "model.embed_tokens.weight" in names and "model.norm.weight" in names


# --------------------------------------------------------------------------
# generate: sampling and output formats
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(models):
    return models.get("llama", "tiny", seed=13)


@pytest.fixture(scope="module")
def prompt(model):
    return prompt_ids(st_util.read_config(model)["vocab_size"], 5, 13)


def _sample(ferry, model, prompt, *flags):
    out, _ = ferry.generate(model, prompt, N, *flags)
    return out


def test_greedy_is_default(ferry, model, prompt):
    a = _sample(ferry, model, prompt)
    b = _sample(ferry, model, prompt, "--temperature", "0")
    c = _sample(ferry, model, prompt, "--temperature", "0", "--seed", "99")
    assert a == b == c


def test_sampling_same_seed_same_output(ferry, model, prompt):
    flags = ("--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed", "1234")
    a = _sample(ferry, model, prompt, *flags)
    b = _sample(ferry, model, prompt, *flags)
    assert a == b
    vocab = st_util.read_config(model)["vocab_size"]
    assert all(0 <= t < vocab for t in a)


def test_top_k_1_is_greedy(ferry, model, prompt):
    greedy = _sample(ferry, model, prompt)
    for seed in ("1", "2", "3"):
        assert _sample(ferry, model, prompt, "--temperature", "1.0", "--top-k", "1",
                       "--seed", seed) == greedy


def test_tiny_top_p_is_greedy(ferry, model, prompt):
    greedy = _sample(ferry, model, prompt)
    assert _sample(ferry, model, prompt, "--temperature", "1.0", "--top-p", "1e-9",
                   "--seed", "5") == greedy


def test_different_seeds_differ(ferry, model, prompt):
    outs = [tuple(_sample(ferry, model, prompt, "--temperature", "1.0", "--seed", str(s)))
            for s in range(1, 6)]
    assert len(set(outs)) > 1, "5 seeds at temperature 1.0 gave identical samples: %r" % (outs[0],)


def test_batch_sampling_deterministic(ferry, model):
    vocab = st_util.read_config(model)["vocab_size"]
    prompts = [prompt_ids(vocab, 4, 1), prompt_ids(vocab, 7, 2)]
    flags = ("--temperature", "0.8", "--seed", "77")
    a, _ = ferry.generate(model, prompts, N, *flags)
    b, _ = ferry.generate(model, prompts, N, *flags)
    assert a == b


def test_text_output_matches_json(ferry, model):
    vocab = st_util.read_config(model)["vocab_size"]
    prompts = [prompt_ids(vocab, 4, 1), prompt_ids(vocab, 7, 2)]
    want, _ = ferry.generate(model, prompts, N)
    spec = ";".join(",".join(map(str, p)) for p in prompts)
    p = ferry.check("generate", "--model", model, "--prompt-ids", spec, "--max-new-tokens", N)
    lines = [l for l in p.stdout.decode().splitlines() if l.strip()]
    assert [[int(t) for t in l.split()] for l in lines] == want
    one, _ = ferry.generate(model, prompts[0], N)
    p = ferry.check("generate", "--model", model, "--prompt-ids", spec.split(";")[0],
                    "--max-new-tokens", N)
    assert [int(t) for t in p.stdout.decode().split()] == one


def test_json_output_is_one_object(ferry, model, prompt):
    p = ferry.check("generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
                    "--max-new-tokens", 4, "--json")
    obj = json.loads(p.stdout.decode())  # raises if there is anything else on stdout
    assert isinstance(obj, dict) and len(obj["output_ids"]) == 4


def test_threads_flag(ferry, model, prompt, tmp_path):
    o1, l1 = ferry.generate(model, prompt, N, "--threads", "1", dump_logits=tmp_path / "a")
    o2, l2 = ferry.generate(model, prompt, N, "--threads", "2", dump_logits=tmp_path / "b")
    assert o1 == o2
    assert rel_err(l2, l1) < 1e-5


def test_dump_logits_size(ferry, model, prompt, tmp_path):
    vocab = st_util.read_config(model)["vocab_size"]
    f = tmp_path / "l.bin"
    ferry.generate(model, prompt, 1, dump_logits=f)
    assert os.path.getsize(f) == 4 * vocab
    f2 = tmp_path / "l2.bin"
    ferry.generate(model, [prompt, prompt[:2], prompt], 1, dump_logits=f2)
    assert os.path.getsize(f2) == 3 * 4 * vocab
    l = np.fromfile(str(f2), dtype="<f4").reshape(3, vocab)
    assert rel_err(l[2], l[0]) < 1e-6  # same prompt in one batch: same logits
    assert rel_err(l[0], np.fromfile(str(f), dtype="<f4")) < 1e-5


def test_identical_prompts_in_batch_same_tokens(ferry, model, prompt):
    out, _ = ferry.generate(model, [prompt, prompt, prompt], N)
    assert out[0] == out[1] == out[2]


# --------------------------------------------------------------------------
# where results go: --dump-logits FILE never replaces what is not a regular
# file; a write error on stdout is an error
# --------------------------------------------------------------------------

def _reference_logits(ferry, model, prompt, tmp_path):
    ferry.generate(model, prompt, 1, dump_logits=tmp_path / "ref.bin")
    return (tmp_path / "ref.bin").read_bytes()


def _dump(ferry, model, prompt, path):
    return ferry.run("generate", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
                     "--max-new-tokens", 1, "--dump-logits", path, timeout=60)


def test_dump_logits_into_a_fifo(ferry, model, prompt, tmp_path):
    """A FIFO is written through (a reader gets the logits) and stays a FIFO."""
    import stat
    want = _reference_logits(ferry, model, prompt, tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(str(fifo))
    # the read end is open before ferry starts (and never blocks): the
    # logits fit in the pipe's buffer, so nothing here can hang
    fd = os.open(str(fifo), os.O_RDONLY | os.O_NONBLOCK)
    try:
        p = _dump(ferry, model, prompt, fifo)
        assert p.returncode == 0, p.stderr
        got = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(fd)
    assert stat.S_ISFIFO(os.lstat(str(fifo)).st_mode), "the FIFO was replaced"
    assert got == want


def test_dump_logits_through_a_symlink(ferry, model, prompt, tmp_path):
    """A symlink is followed: the file it leads to gets the logits, the link
    stays; a link to nothing is refused, naming it."""
    want = _reference_logits(ferry, model, prompt, tmp_path)
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "target.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    os.symlink("sub/target.bin", str(link))
    p = _dump(ferry, model, prompt, link)
    assert p.returncode == 0, p.stderr
    assert os.path.islink(str(link)) and os.readlink(str(link)) == "sub/target.bin"
    assert target.read_bytes() == want
    dangling = tmp_path / "dangling.bin"
    os.symlink("nowhere/x.bin", str(dangling))
    line = assert_ferry_error(_dump(ferry, model, prompt, dangling), "symbolic link", rcs=(1,))
    assert str(dangling) in line
    assert os.path.islink(str(dangling)) and not (tmp_path / "nowhere").exists()


def test_dump_logits_into_a_full_device(ferry, model, prompt, tmp_path):
    """A character device is written in place, never replaced: /dev/full
    fails the write with ENOSPC, and ferry exits 1 naming the path. (The
    device is reached through a link and, where mknod is allowed, as a node
    of our own - never /dev/full itself, which a broken ferry running as
    root would replace.)"""
    import stat
    paths = [tmp_path / "to-dev-full"]
    os.symlink("/dev/full", str(paths[0]))
    try:
        os.mknod(str(tmp_path / "full"), 0o600 | stat.S_IFCHR, os.makedev(1, 7))
        paths.append(tmp_path / "full")
    except OSError:
        pass  # not root, or no mknod here: the link still tests the rule
    for path in paths:
        line = assert_ferry_error(_dump(ferry, model, prompt, path), "No space left on device", rcs=(1,))
        assert str(path) in line, line
        assert stat.S_ISCHR(os.stat(str(path)).st_mode), "%s is no longer a character device" % path
    assert os.path.islink(str(paths[0]))
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.mark.parametrize("args", [("generate",), ("generate", "--json"), ("plan",), ("plan", "--json"),
                                  ("inspect",), ("inspect", "--json"), ("help",)],
                         ids=["generate", "generate-json", "plan", "plan-json", "inspect", "inspect-json", "help"])
def test_stdout_write_error(ferry, model, prompt, args):
    """Results that cannot be written to stdout are an error (exit 1, one
    line naming stdout), not a success with the output lost."""
    import subprocess
    cmd, flags = args[0], list(args[1:])
    if cmd == "help":
        argv = ["generate", "--help"]
    else:
        argv = [cmd, "--model", model] + flags
        if cmd == "generate":
            argv += ["--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", 2]
    with open("/dev/full", "wb") as full:
        p = subprocess.run([ferry.path] + [str(a) for a in argv], stdout=full, stderr=subprocess.PIPE, timeout=60)
    p.stdout = b""
    line = assert_ferry_error(p, "stdout", rcs=(1,))
    assert "No space left on device" in line, line
