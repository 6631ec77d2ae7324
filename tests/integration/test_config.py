"""Configuration: the JSON config file, FERRY_* environment variables and
flags, through the real binary.

- Precedence flags > environment > file > defaults, shown by `ferry config
  --print` with each value's source, and FERRY_CONFIG naming the file.
- Errors name the flag, the variable, or the file and line, and suggest the
  closest setting; the admin token is a secret: never a flag, never printed,
  refused from a file other users can read.
- `ferry serve --config FILE` serves what the file says.
- config/ferry.json and every config/examples/*.json load cleanly, and each
  example's plan on a checkpoint of the shape it was sized for (Llama-3.1-70B,
  Qwen3-30B-A3B: sparse files, so nothing is written but headers) puts the
  weights on the tiers it says, within the memory of the machine it names.
- docs/configuration.md's settings table is what `make docs` generates from
  config/settings.def.
"""
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import refdata
from test_http import Server, request

ROOT = Path(__file__).resolve().parents[2]
GiB = 1 << 30


@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny")


def clean_env(**extra):
    """The test's environment without FERRY_* settings (a stray FERRY_MODEL
    or FERRY_CONFIG would change what is tested), plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def write_json(path, obj, mode=0o644):
    path.write_text(json.dumps(obj, indent=2) + "\n")
    os.chmod(path, mode)
    return path


def config_print(ferry, *args, env=None):
    p = ferry.run("config", "--print", *args, env=env or clean_env())
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def fails(ferry, args, needles, env=None, rc=2):
    p = ferry.run(*args, env=env or clean_env())
    err = p.stderr.decode()
    assert p.returncode == rc, (p.returncode, err)
    assert err.count("\n") == 1 and err.startswith("ferry: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


# --------------------------------------------------------------------------
# precedence and --print
# --------------------------------------------------------------------------

def test_precedence_flag_env_file_default(ferry, tmp_path):
    cfg = write_json(tmp_path / "f.json", {
        "// note": "comments are keys starting with //",
        "http_port": 9000, "batch": 8, "kv_memory": "1GiB", "max_memory": "device=4GiB", "temperature": 0.5})
    env = clean_env(FERRY_HTTP_PORT=9100, FERRY_BATCH=4)
    s = config_print(ferry, "--config", cfg, "--http-port", "9200", env=env)["settings"]
    assert s["http_port"] == {"value": 9200, "source": "flag", "from": "--http-port"}
    assert s["batch"] == {"value": 4, "source": "env", "from": "FERRY_BATCH"}
    assert s["kv_memory"] == {"value": GiB, "source": "file", "from": "%s:5" % cfg}  # json.dumps indent=2: one key a line
    assert s["max_memory"]["value"] == "device=4GiB" and s["max_memory"]["source"] == "file"
    assert s["temperature"]["value"] == 0.5
    assert s["device"] == {"value": "cpu", "source": "default"}
    assert s["offload_dir"] == {"value": None, "source": "default"}
    assert s["grpc_port"]["value"] == 8001


def test_config_file_from_environment(ferry, tmp_path):
    a = write_json(tmp_path / "a.json", {"http_port": 1111})
    b = write_json(tmp_path / "b.json", {"http_port": 2222})
    out = config_print(ferry, env=clean_env(FERRY_CONFIG=a))
    assert out["config_file"] == str(a) and out["settings"]["http_port"]["value"] == 1111
    assert out["settings"]["config"]["source"] == "env"
    out = config_print(ferry, "--config", b, env=clean_env(FERRY_CONFIG=a))  # the flag wins
    assert out["config_file"] == str(b) and out["settings"]["http_port"]["value"] == 2222
    assert config_print(ferry)["config_file"] is None


def test_last_of_repeated_flags_wins_and_empty_environment_is_unset(ferry, tmp_path, tiny):
    a = write_json(tmp_path / "a.json", {"batch": 3})
    b = write_json(tmp_path / "b.json", {"batch": 5})
    s = config_print(ferry, "--config", a, "--config", b, "--http-port", "1", "--http-port", "2")["settings"]
    assert s["batch"]["value"] == 5 and s["http_port"]["value"] == 2
    out = config_print(ferry, env=clean_env(FERRY_CONFIG="", FERRY_BATCH=""))
    assert out["config_file"] is None and out["settings"]["batch"]["source"] == "default"
    fails(ferry, ["plan"], ["missing required flag --model"], env=clean_env(FERRY_MODEL=""))
    empty = write_json(tmp_path / "empty.json", {"offload_dir": ""})
    fails(ferry, ["plan", "--model", tiny, "--config", empty], ["%s:2: offload_dir must not be empty" % empty])  # indent=2: line 2
    fails(ferry, ["plan", "--model", tiny, "--offload-dir="], ["--offload-dir must not be empty"])


def test_print_lists_every_setting_and_redacts_secrets(ferry, tmp_path):
    token = "s3cret-token-value-0123456789"
    out = config_print(ferry, env=clean_env(FERRY_ADMIN_TOKEN=token))
    assert out["settings"]["admin_token"] == {"value": "<redacted>", "source": "env", "from": "FERRY_ADMIN_TOKEN"}
    text = (ROOT / "config" / "settings.def").read_text()
    names = [l.split("(", 1)[1].split(",", 1)[0] for l in text.splitlines() if l.startswith("FERRY_SETTING(")]
    assert list(out["settings"]) == names
    cfg = write_json(tmp_path / "secret.json", {"admin_token": token}, mode=0o600)
    p = ferry.run("config", "--print", "--config", cfg, env=clean_env())
    assert p.returncode == 0 and token.encode() not in p.stdout + p.stderr
    assert json.loads(p.stdout)["settings"]["admin_token"]["source"] == "file"


def test_environment_is_read_only_for_the_command_s_settings(ferry, tiny):
    """FERRY_HTTP_PORT=junk does not break `ferry plan`, which has no port;
    for serve it is an error naming the variable."""
    env = clean_env(FERRY_HTTP_PORT="junk")
    p = ferry.run("plan", "--model", tiny, env=env)
    assert p.returncode == 0, p.stderr
    fails(ferry, ["serve", "--model", tiny], ["FERRY_HTTP_PORT: 'junk' is not an integer"], env=env)
    fails(ferry, ["plan", "--model", tiny], ["FERRY_BATCH must be in 1..4096 (got 0)"], env=clean_env(FERRY_BATCH=0))


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------

def test_file_errors_name_file_line_and_closest_key(ferry, tiny, tmp_path):
    def bad(text, needles):
        f = tmp_path / "bad.json"
        f.write_text(text)
        return fails(ferry, ["plan", "--model", tiny, "--config", f], ["%s:" % f] + needles)

    bad('{\n  "batch": 8,\n  "max_memroy": "device=1GiB"\n}\n',
        [":3: unknown setting 'max_memroy' (did you mean max_memory?)"])
    bad('{\n  "batch": "8"\n}\n', [":2: batch must be an integer, not a string"])
    bad('{\n\n  "batch": 5000\n}\n', [":3: batch must be in 1..4096 (got 5000)"])
    bad('{"device": "gpu"}', [":1: device must be one of cpu, cpu-split, cuda (got 'gpu'"])
    bad('{"kv_memory": "2 GiB"}', ["kv_memory"])
    bad('{"batch": 8,\n "batch": 9}', [":2: batch is set twice (first at line 1)"])
    bad('{"batch": 8,,}', [":1:13: invalid JSON"])
    bad('["batch", 8]', ["one JSON object of settings, not an array"])
    bad('{"config": "x.json"}', ["config is not read from a config file"])
    fails(ferry, ["plan", "--model", tiny, "--config", tmp_path / "missing.json"],
          ["config file %s: No such file or directory" % (tmp_path / "missing.json")])


def test_flag_errors_suggest(ferry, tiny):
    fails(ferry, ["plan", "--model", tiny, "--max-memroy", "device=1GiB"],
          ["unknown flag '--max-memroy' (did you mean --max-memory?)"])
    fails(ferry, ["plan", "--model", tiny, "--http-port", "1"], ["ferry plan does not take it"])
    fails(ferry, ["plan", "--model", tiny, "--device", "cdua"], ["did you mean cuda?"])
    fails(ferry, ["plan"], ["missing required flag --model (or FERRY_MODEL"])
    fails(ferry, ["config"], ["give --print"])
    fails(ferry, ["config", "--print", "--batch", "0"], ["--batch must be in 1..4096 (got 0)"])


def test_secret_in_a_readable_file_is_refused(ferry, tiny, tmp_path):
    token = "another-secret-token-0123456789"
    cfg = write_json(tmp_path / "open.json", {"admin_token": token}, mode=0o644)
    err = fails(ferry, ["serve", "--model", tiny, "--config", cfg],
                ["admin_token is a secret, but the file's mode 0644 lets group or others read it", "chmod 600"])
    assert token not in err


# --------------------------------------------------------------------------
# serve from a file
# --------------------------------------------------------------------------

class ConfigServer(Server):
    """`ferry serve` with exactly the given arguments (Server adds --model,
    ports and host as flags, which would override the file)."""

    def __init__(self, argv, env):  # pylint: disable=super-init-not-called
        self.model, self.name, self.argv = None, None, argv
        self.log, self.port = [], None
        self._port_seen = threading.Event()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()


def test_serve_from_config_file(ferry_bin, tiny, tmp_path):
    """The model, its name, address, ports and body limit come from the
    file; the environment's name overrides the file's."""
    cfg = write_json(tmp_path / "serve.json", {
        "model": str(tiny), "name": "from-file", "host": "127.0.0.1", "http_port": 0, "grpc_port": -1,
        "max_body": "4KiB", "admin_port": 0})
    for env, name in ((clean_env(), "from-file"), (clean_env(FERRY_NAME="from-env"), "from-env")):
        srv = ConfigServer([ferry_bin, "serve", "--config", str(cfg)], env)
        try:
            srv.wait_ready()
            assert request(srv, "GET", "/v2/models/%s/ready" % name)[0] == 200
            assert request(srv, "GET", "/v2/models/from-file/ready")[0] == (200 if name == "from-file" else 404)
            big = json.dumps({"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1], "data": ["a" * 5000]}]})
            assert request(srv, "POST", "/v2/models/%s/infer" % name, big)[0] == 413  # max_body from the file
            assert not any("grpc" in l.lower() and "listening" in l for l in srv.log)  # grpc_port -1
            assert srv.stop() == 0
        finally:
            srv.kill()


# --------------------------------------------------------------------------
# the shipped files
# --------------------------------------------------------------------------

def test_default_config_loads(ferry, tmp_path):
    """config/ferry.json: make run's configuration."""
    path = ROOT / "config" / "ferry.json"
    s = config_print(ferry, "--config", path)["settings"]
    want = {"model": "build/ref/smollm2-gguf/SmolLM2-135M-Instruct.Q4_1.gguf", "http_port": 8000, "grpc_port": 8001, "admin_host": "127.0.0.1",
            "admin_port": 8003, "offload_dir": "build/smollm2-offload", "export_dir": "build/exports"}
    for k, v in want.items():
        assert s[k]["value"] == v and s[k]["source"] == "file", (k, s[k])
    assert s["admin_token"]["value"] is None  # admin API off until a token is given
    # on the model it names: part resident, the rest on disk, as its comment says
    gguf = next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))
    plan = ferry.check("plan", "--config", path, "--model", gguf, "--offload-dir", tmp_path / "off",
                       "--json", env=clean_env())
    tiers = {g["tier"] for g in json.loads(plan.stdout)["groups"]}
    assert tiers == {"device", "disk"}, tiers


def _attention(p, c, hd, qk_norm):
    H = c["hidden_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [(p + "input_layernorm.weight", [H]), (p + "post_attention_layernorm.weight", [H]),
           (p + "self_attn.q_proj.weight", [q, H]), (p + "self_attn.k_proj.weight", [kv, H]),
           (p + "self_attn.v_proj.weight", [kv, H]), (p + "self_attn.o_proj.weight", [H, q])]
    if qk_norm:
        out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
    return out


def _checkpoint_names(c, mlp):
    """(name, shape) of every tensor: embedding, per layer attention and
    mlp(prefix, layer config), final norm, head."""
    H, V = c["hidden_size"], c["vocab_size"]
    hd = c.get("head_dim", H // c["num_attention_heads"])
    out = [("model.embed_tokens.weight", [V, H])]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += _attention(p, c, hd, c["model_type"].startswith("qwen3")) + mlp(p, c)
    return out + [("model.norm.weight", [H]), ("lm_head.weight", [V, H])]


def _dense_mlp(p, c):
    H, I = c["hidden_size"], c["intermediate_size"]
    return [(p + "mlp.gate_proj.weight", [I, H]), (p + "mlp.up_proj.weight", [I, H]),
            (p + "mlp.down_proj.weight", [H, I])]


def _moe_mlp(p, c):
    H, MI = c["hidden_size"], c["moe_intermediate_size"]
    out = [(p + "mlp.gate.weight", [c["num_experts"], H])]
    for e in range(c["num_experts"]):
        pe = p + "mlp.experts.%d." % e
        out += [(pe + "gate_proj.weight", [MI, H]), (pe + "up_proj.weight", [MI, H]), (pe + "down_proj.weight", [H, MI])]
    return out


def sparse_checkpoint(d, cfg, names):
    """A bf16 checkpoint of the real shape whose data is a hole: the header
    is written, the file extended to its full size (zeros, no blocks)."""
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    header, off = {}, 0
    for n, shape in names:
        size = 2
        for s in shape:
            size *= s
        header[n] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return d


LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                 "num_experts_per_tok": 8, "norm_topk_prob": True, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                 "torch_dtype": "bfloat16", "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    return {"70b": sparse_checkpoint(root / "70b", LLAMA_70B, _checkpoint_names(LLAMA_70B, _dense_mlp)),
            "30b-a3b": sparse_checkpoint(root / "30b-a3b", QWEN3_30B_A3B, _checkpoint_names(QWEN3_30B_A3B, _moe_mlp))}


# example: (shape, device planned on, the machine its comment names: the
# GPU memory CUDA reports free on it and the host memory, in GiB, tiers it
# must use). An 80 GB H100 shows about 78 GiB, a 24 GB card about 22.
EXAMPLES = {
    "cpu-disk-offload": ("70b", "cpu", None, 64, {"device", "disk"}),
    "gpu-host-offload": ("70b", "cpu-split", 78, 128, {"device", "host"}),
    "gpu-disk-offload": ("70b", "cpu-split", 22, 64, {"device", "host", "disk"}),
    "moe-experts-on-host": ("30b-a3b", "cpu-split", 22, 64, {"device", "host"}),
}


def test_examples_are_all_covered():
    assert sorted(p.stem for p in (ROOT / "config" / "examples").glob("*.json")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_plans_as_it_says(ferry, shapes, name, tmp_path):
    """The example, planned on a checkpoint of the shape it was sized for.
    The GPU examples plan on cpu-split (the CPU kernels behind a separate
    device memory: the planner's GPU path) - the --device flag overrides
    the file's cuda, as flags do."""
    shape, device, gpu_gib, host_gib, tiers = EXAMPLES[name]
    path = ROOT / "config" / "examples" / (name + ".json")
    ex = json.loads(path.read_text())
    s = config_print(ferry, "--config", path)["settings"]
    for k in ex:
        if not k.startswith("//"):
            assert s[k]["source"] == "file", (k, s[k])
    p = ferry.check("plan", "--config", path, "--model", shapes[shape], "--device", device,
                    "--offload-dir", tmp_path / "off", "--json", env=clean_env())
    plan = json.loads(p.stdout)
    tb = plan["tier_bytes"]
    assert {t for t in tb if tb[t] > 0} == tiers, tb
    # the budgets bound all the model takes of each memory (the CPU: host is all of RAM)
    spec = ex["max_memory"]
    budgets = dict(kv.split("=") for kv in spec.split(",")) if "=" in spec else {"host": spec}
    for mem, size in budgets.items():
        assert plan["budget"][mem] == int(size.replace("GiB", "")) * GiB, plan["budget"]
        assert plan["budget"]["used"][mem] <= plan["budget"][mem], (mem, plan["budget"])
    assert plan["context"] == ex["context"] and plan["sequences"] == ex["batch"]
    assert plan["kv_pool"]["sequences_of_context"] >= 1, plan["kv_pool"]
    assert abs(plan["kv_pool"]["bytes"] - int(ex["kv_memory"].replace("GiB", "")) * GiB) < 64 << 20
    if gpu_gib:  # leaves 1 GiB for the CUDA context and cuBLAS
        assert plan["needs"]["device"] <= (gpu_gib - 1) * GiB, plan["needs"]
    assert plan["needs"]["host"] <= (host_gib - 4) * GiB, plan["needs"]  # on the CPU, one RAM: host = device
    if name.startswith("moe"):
        experts = [g for g in plan["groups"] if " expert " in g["name"]]
        assert experts and {g["tier"] for g in experts} >= {"host"}
        assert plan["working"]["expert_slots_bytes"] == 4 * GiB - (4 * GiB) % plan["working"]["expert_slot_bytes"]


# --------------------------------------------------------------------------
# the settings table of docs/configuration.md
# --------------------------------------------------------------------------

def test_settings_table_is_fresh():
    """`make docs` writes the table between the markers; this is its check."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "settings_table.py"), "--check"],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.returncode == 0, p.stdout.decode()
