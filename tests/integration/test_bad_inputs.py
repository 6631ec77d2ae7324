"""Broken checkpoints, configs and command lines: ferry must fail cleanly.

Each case: exit status 1 or 2 (never a signal), exactly one non-empty stderr
line starting with "ferry: " that names the thing that is wrong (file name,
tensor name or config field / flag, checked as a lowercase substring).

Broken copies are derived with st_util from a valid tiny f32 llama checkpoint
built by `ferry mkmodel`.
"""

import json
import os
import shutil
import struct

import pytest

import st_util
from conftest import assert_ferry_error, copy_model

ST = "model.safetensors"
VICTIM = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def good(models):
    return models.get("llama", "tiny", dtype="f32", seed=5)


@pytest.fixture(scope="module")
def good_sharded(models):
    return models.get("llama", "tiny", dtype="f32", seed=5, shard_size="16KiB")


@pytest.fixture
def broken(good, work):
    """A fresh copy of the good model to break; returns (dir, parsed file)."""
    d = copy_model(good, work / "m")
    return d, st_util.read(d / ST)


def gen(ferry, model, *extra, prompt="1,2,3", n=2):
    return ferry.run("generate", "--model", model, "--prompt-ids", prompt,
                     "--max-new-tokens", n, *extra)


def test_good_model_works(ferry, good):
    p = gen(ferry, good)
    assert p.returncode == 0, p.stderr


# --------------------------------------------------------------------------
# safetensors container
# --------------------------------------------------------------------------

def test_truncated_file(ferry, broken):
    d, st = broken
    size = os.path.getsize(d / ST)
    with open(d / ST, "r+b") as f:
        f.truncate(size - 100)
    assert_ferry_error(gen(ferry, d), [ST])


def test_truncated_inside_header(ferry, broken):
    d, st = broken
    with open(d / ST, "r+b") as f:
        f.truncate(8 + st.header_len // 2)
    assert_ferry_error(gen(ferry, d), [ST])


def test_shorter_than_length_field(ferry, broken):
    d, st = broken
    with open(d / ST, "wb") as f:
        f.write(b"\x10\x00\x00")
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_length_past_eof(ferry, broken):
    d, st = broken
    size = os.path.getsize(d / ST)
    with open(d / ST, "r+b") as f:
        f.write(struct.pack("<Q", size + 100))
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_length_huge(ferry, broken):
    d, st = broken
    blob = bytearray((d / ST).read_bytes())
    blob[:8] = struct.pack("<Q", 200 * 1024 * 1024)
    blob += b" " * (1024 * 1024)  # still far short of the claimed length
    (d / ST).write_bytes(bytes(blob))
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_length_u64_max(ferry, broken):
    d, st = broken
    with open(d / ST, "r+b") as f:
        f.write(struct.pack("<Q", 2 ** 64 - 1))
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_not_utf8(ferry, broken):
    d, st = broken
    hdr = dict(st.header)
    hdr["__metadata__"] = dict(st.metadata or {}, note="PLACEHOLDER")
    text = st_util.header_bytes(hdr).replace(b"PLACEHOLDER", b"bad \xff\xfe \xc3\x28 seq")
    st_util.write_raw(d / ST, text, st.data)
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_not_json(ferry, broken):
    d, st = broken
    text = b"this is not json" + b" " * (st.header_len - 16)
    st_util.write_raw(d / ST, text, st.data)
    assert_ferry_error(gen(ferry, d), [ST])


def test_header_json_not_object(ferry, broken):
    d, st = broken
    st_util.write_raw(d / ST, b"[1, 2, 3]       ", st.data)
    assert_ferry_error(gen(ferry, d), [ST])


def _entries(st):
    return st.entries()


def test_overlapping_offsets(ferry, broken):
    d, st = broken
    ents = _entries(st)
    a, b = ents[2], ents[3]
    # b starts 4 bytes inside a; same length so shape*dtype still matches
    hb, he = st.header[b[0]]["data_offsets"]
    st.header[b[0]]["data_offsets"] = [hb - 4, he - 4]
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [ST, a[0], b[0]])


def test_out_of_bounds_offsets(ferry, broken):
    d, st = broken
    last = _entries(st)[-1][0]
    b, e = st.header[last]["data_offsets"]
    st.header[last]["data_offsets"] = [b + 4096, e + 4096]
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [ST, last])


def test_offsets_end_before_begin(ferry, broken):
    d, st = broken
    name = _entries(st)[1][0]
    b, e = st.header[name]["data_offsets"]
    st.header[name]["data_offsets"] = [e, b]
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [ST, name])


def test_gap_between_tensors(ferry, broken):
    d, st = broken
    ents = _entries(st)
    # 64 unused bytes between the first and second tensor, later offsets shifted
    data = bytearray()
    for i, (n, dt, shape, buf) in enumerate(ents):
        if i == 1:
            data += b"\0" * 64
        st.header[n]["data_offsets"] = [len(data), len(data) + len(buf)]
        data += buf
    st_util.write_header(d / ST, st.header, bytes(data))
    assert_ferry_error(gen(ferry, d), [ST, ents[0][0], ents[1][0]])


def test_trailing_bytes(ferry, broken):
    d, st = broken
    with open(d / ST, "ab") as f:
        f.write(b"\0" * 64)
    assert_ferry_error(gen(ferry, d), [ST])


def test_wrong_byte_length_for_shape(ferry, broken):
    d, st = broken
    info = st.header[VICTIM]
    info["shape"] = [info["shape"][0], info["shape"][1] - 1]  # bytes unchanged
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [VICTIM])


def test_shape_product_overflows_u64(ferry, broken):
    d, st = broken
    st.header[VICTIM]["shape"] = [2 ** 32, 2 ** 32, 16]
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [VICTIM])


def test_shape_product_times_dtype_overflows_u64(ferry, broken):
    d, st = broken
    st.header[VICTIM]["shape"] = [2 ** 31, 2 ** 31, 2]  # 2^63 elements * 4 bytes
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [VICTIM])


def test_negative_dimension(ferry, broken):
    d, st = broken
    st.header[VICTIM]["shape"] = [-1, st.header[VICTIM]["shape"][1]]
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [VICTIM, ST])


def test_unknown_dtype(ferry, broken):
    d, st = broken
    st.header[VICTIM]["dtype"] = "Q7"
    st_util.write_header(d / ST, st.header, st.data)
    assert_ferry_error(gen(ferry, d), [VICTIM, "q7"])


def test_duplicate_tensor_names(ferry, broken):
    d, st = broken
    ents = _entries(st)
    # hand-written JSON: the first tensor's key appears twice, with the second
    # entry describing the second tensor's bytes
    parts = []
    if st.metadata is not None:
        parts.append('"__metadata__":%s' % json.dumps(st.metadata))
    dup = ents[0][0]
    for i, (n, dt, shape, buf) in enumerate(ents):
        key = dup if i == 1 else n
        parts.append('%s:%s' % (json.dumps(key), json.dumps(st.header[n])))
    text = ("{" + ",".join(parts) + "}").encode()
    text += b" " * ((-len(text)) % 8)
    st_util.write_raw(d / ST, text, st.data)
    assert_ferry_error(gen(ferry, d), [dup])


def test_missing_required_tensor(ferry, broken):
    d, st = broken
    ents = [e for e in _entries(st) if e[0] != VICTIM]
    st_util.write_entries(d / ST, ents, metadata=st.metadata)
    assert_ferry_error(gen(ferry, d), [VICTIM])


def test_tensor_wrong_shape_for_config(ferry, broken):
    """A well-formed file whose tensor shape disagrees with config.json."""
    d, st = broken
    ents = []
    for n, dt, shape, buf in _entries(st):
        if n == VICTIM:
            shape = [shape[1], shape[0]]  # transposed: same byte length
        ents.append((n, dt, shape, buf))
    st_util.write_entries(d / ST, ents, metadata=st.metadata)
    assert_ferry_error(gen(ferry, d), [VICTIM])


def test_missing_weights_file(ferry, broken):
    d, st = broken
    os.unlink(d / ST)
    assert_ferry_error(gen(ferry, d), [ST])


def test_model_dir_missing(ferry, work):
    missing = work / "no-such-model-dir"
    assert_ferry_error(gen(ferry, missing), ["no-such-model-dir"])


# --------------------------------------------------------------------------
# sharded checkpoints
# --------------------------------------------------------------------------

@pytest.fixture
def sharded(good_sharded, work):
    d = copy_model(good_sharded, work / "m")
    return d, st_util.read_index(d)


def test_shard_missing(ferry, sharded):
    d, index = sharded
    shard = sorted(set(index["weight_map"].values()))[-1]
    os.unlink(d / shard)
    assert_ferry_error(gen(ferry, d), [shard])


def test_index_not_json(ferry, sharded):
    d, index = sharded
    (d / "model.safetensors.index.json").write_text("{ not json")
    assert_ferry_error(gen(ferry, d), ["model.safetensors.index.json"])


def test_index_names_tensor_absent_from_shard(ferry, sharded):
    d, index = sharded
    wm = index["weight_map"]
    shards = sorted(set(wm.values()))
    name = next(n for n, f in wm.items() if f != shards[0])
    wm[name] = shards[0]  # the tensor is actually in another shard
    st_util.write_index(d, index)
    assert_ferry_error(gen(ferry, d), [name])


def test_weight_map_dotdot(ferry, sharded, work):
    d, index = sharded
    wm = index["weight_map"]
    name = next(iter(wm))
    shard = wm[name]
    # the escaped path exists and is a valid file, so only the path policy can reject it
    shutil.copy(str(d / shard), str(work / shard))
    wm[name] = "../" + shard
    for n, f in wm.items():
        if f == shard:
            wm[n] = "../" + shard
    st_util.write_index(d, index)
    assert_ferry_error(gen(ferry, d), ["..", name, "model.safetensors.index.json"])


def test_weight_map_absolute_path(ferry, sharded, work):
    d, index = sharded
    wm = index["weight_map"]
    name = next(iter(wm))
    shard = wm[name]
    outside = work / "outside"
    outside.mkdir()
    shutil.copy(str(d / shard), str(outside / shard))
    for n, f in wm.items():
        if f == shard:
            wm[n] = str(outside / shard)
    st_util.write_index(d, index)
    assert_ferry_error(gen(ferry, d), [str(outside / shard).lower(), shard, name,
                                       "model.safetensors.index.json"])


def test_weight_map_symlink_outside(ferry, sharded, work):
    """A shard that is a symlink to a file outside the model directory."""
    d, index = sharded
    wm = index["weight_map"]
    shard = wm[next(iter(wm))]
    outside = work / "outside"
    outside.mkdir()
    shutil.move(str(d / shard), str(outside / shard))
    os.symlink(str(outside / shard), str(d / shard))
    assert_ferry_error(gen(ferry, d), [shard])


# --------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------

def _with_config(d, **changes):
    cfg = st_util.read_config(d)
    for k, v in changes.items():
        if v is KeyError:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    st_util.write_config(d, cfg)


def test_config_unsupported_architecture(ferry, broken):
    d, st = broken
    _with_config(d, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    assert_ferry_error(gen(ferry, d), ["gpt2lmheadmodel", "architecture"])


def test_config_rope_scaling(ferry, broken):
    """A scaling type ferry does not implement (test_rope_scaling.py has the
    ones it does)."""
    d, st = broken
    _with_config(d, rope_scaling={"type": "dynamic", "factor": 2.0})
    assert_ferry_error(gen(ferry, d), ["rope_scaling type 'dynamic'"])


def test_config_rope_scaling_null_is_fine(ferry, broken):
    """Hugging Face configs routinely carry "rope_scaling": null."""
    d, st = broken
    _with_config(d, rope_scaling=None)
    p = gen(ferry, d)
    assert p.returncode == 0, p.stderr


def test_config_hidden_act_gelu(ferry, broken):
    d, st = broken
    _with_config(d, hidden_act="gelu")
    assert_ferry_error(gen(ferry, d), ["hidden_act", "gelu"])


def test_config_missing_field(ferry, broken):
    d, st = broken
    _with_config(d, hidden_size=KeyError)
    assert_ferry_error(gen(ferry, d), ["hidden_size"])


def test_config_heads_not_multiple_of_kv_heads(ferry, broken):
    d, st = broken
    cfg = st_util.read_config(d)
    _with_config(d, num_key_value_heads=cfg["num_attention_heads"] + 1)
    assert_ferry_error(gen(ferry, d), ["num_key_value_heads", "num_attention_heads"])


def test_config_not_json(ferry, broken):
    d, st = broken
    (d / "config.json").write_text("{")
    assert_ferry_error(gen(ferry, d), ["config.json"])


def test_config_missing(ferry, broken):
    d, st = broken
    os.unlink(d / "config.json")
    assert_ferry_error(gen(ferry, d), ["config.json"])


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def test_token_id_out_of_vocab(ferry, good):
    vocab = st_util.read_config(good)["vocab_size"]
    assert_ferry_error(gen(ferry, good, prompt="1,%d,3" % vocab),
                       [str(vocab), "vocab", "prompt", "token"])


def test_negative_token_id(ferry, good):
    assert_ferry_error(gen(ferry, good, prompt="1,-4,3"), ["prompt", "token", "-4"])


def test_garbage_token_id(ferry, good):
    assert_ferry_error(gen(ferry, good, prompt="1,x,3"), ["prompt", "token"])


def test_empty_prompt(ferry, good):
    assert_ferry_error(gen(ferry, good, prompt=""), ["prompt"])


@pytest.mark.parametrize("n", ["0", "-1", "abc"])
def test_bad_max_new_tokens(ferry, good, n):
    assert_ferry_error(gen(ferry, good, n=n), ["max-new-tokens", "max_new_tokens"])


def test_unknown_flag(ferry, good):
    p = ferry.run("generate", "--model", good, "--prompt-ids", "1,2", "--max-new-tokens", "2",
                  "--bogus-flag", "1")
    assert_ferry_error(p, ["bogus-flag"], rcs=(2,))


def test_missing_model_flag(ferry):
    p = ferry.run("generate", "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert_ferry_error(p, ["model"], rcs=(2,))


def test_flag_missing_value(ferry, good):
    p = ferry.run("generate", "--model", good, "--prompt-ids")
    assert_ferry_error(p, ["prompt-ids", "prompt_ids"], rcs=(2,))


def test_unknown_command(ferry):
    assert_ferry_error(ferry.run("frobnicate"), ["frobnicate"], rcs=(2,))


@pytest.mark.parametrize("flag,value", [("--temperature", "-1"), ("--top-p", "1.5"),
                                        ("--top-k", "-3"), ("--temperature", "nan")])
def test_bad_sampling_flags(ferry, good, flag, value):
    assert_ferry_error(gen(ferry, good, flag, value), [flag[2:], flag[2:].replace("-", "_")])


def test_mkmodel_bad_arch(ferry, work):
    p = ferry.run("mkmodel", "--out", work / "x", "--arch", "gpt2", "--preset", "tiny")
    assert_ferry_error(p, ["arch", "gpt2"])


def test_mkmodel_bad_shard_size(ferry, work):
    p = ferry.run("mkmodel", "--out", work / "x", "--arch", "llama", "--preset", "tiny",
                  "--shard-size", "12XB")
    assert_ferry_error(p, ["shard-size", "shard_size", "12xb"])


@pytest.mark.parametrize("command", ["generate", "serve", "plan", "inspect", "bench"])
def test_empty_model_flag(ferry, command):
    """An empty --model is a usage error naming --model (serve used to blame
    --name, which derives from it; the others looked for /config.json)."""
    p = ferry.run(command, "--model", "", *(("--prompt-ids", "1,2") if command == "generate" else ()))
    line = assert_ferry_error(p, "--model", rcs=(2,))
    assert "empty" in line, line


@pytest.mark.parametrize("flag", ["--offload-dir", "--dump-logits"])
def test_empty_path_flag(ferry, good, flag):
    p = ferry.run("generate", "--model", good, "--prompt-ids", "1,2", flag, "")
    assert_ferry_error(p, [flag + " must not be empty"], rcs=(2,))


def test_mkmodel_empty_out(ferry):
    assert_ferry_error(ferry.run("mkmodel", "--out", ""), ["--out must not be empty"], rcs=(2,))
