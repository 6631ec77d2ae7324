"""Tiered weights: every placement gives the outputs of the all-resident run.

For several checkpoints (untied, tied, qwen2 with q/k/v bias, qwen3 with its
own head_dim, sharded, bf16 with a sliding window, and a larger qwen2 whose
groups take several read requests) and every placement (all resident, all
host, all disk, mixed across the three tiers, the embedding alone on host or
disk, only the head streamed, only the last layer group streamed), group
sizes 1, 3 and more than the layers, prefetch 1 and 3, batch 1 and 4 and
chunked prefill (--max-step-tokens smaller than the prompts): the same greedy
tokens and last-position logits as ferry's all-resident run (rel err <=
1e-6), and for two models the PyTorch reference as in test_numerics. Peak RSS
follows the budgets.

The same matrix runs on --device cpu-split for three of the checkpoints
(untied, tied, and the one of multi-request reads): the CPU kernels behind
a GPU's separate device memory and asynchronous copy stream, so the
pipeline's non-unified paths (disk bounce buffers, copy and compute events,
slot reuse, the embedding rows' upload) run here. Each (group, prefetch)
combination runs with its own compute stream (inline, or a thread that lets
the host run ahead) and copy latency (FERRY_SPLIT_DELAY_US), and must match
the all-resident CPU run as closely. `make test-mutants` runs these against
pipelines with deliberate ordering bugs and expects them to fail.

Then `ferry plan`: its JSON is self-consistent (totals = sum of the groups,
every layer in exactly one group, groups contiguous), budgets are respected,
placement is first-fit in execution order with the embedding last, working
memory follows the flags, and a plan that needs more memory than the machine
has says so - and `ferry generate` refuses it at startup in one line.
"""

import json
import os
import subprocess
import sys

import pytest

import llama_ref
import refdata
import st_util
from conftest import assert_ferry_error, check_greedy, copy_model, prompt_ids, rel_err

N_NEW = 8
SAME = 1e-6  # rel logit error allowed between two ferry runs of the same maths
REF_TOL = {"f32": 1e-4, "f16": 1e-3, "bf16": 1e-3}

# name -> models.get() arguments; each has >= 3 layers so group size 3 groups
MODELS = {
    "llama-untied-f32": dict(arch="llama", layers=5, tied=False, seed=201),
    "llama-tied-f32": dict(arch="llama", layers=5, tied=True, seed=202),
    "qwen2-bias-f32": dict(arch="qwen2", layers=3, seed=203),
    "qwen3-f16": dict(arch="qwen3", dtype="f16", layers=4, seed=204),
    "llama-bf16-sharded-tied": dict(arch="llama", dtype="bf16", layers=4, tied=True, shard_size="16KiB",
                                    seed=205),
    "mistral-bf16-window": dict(arch="mistral", dtype="bf16", layers=3, sliding_window=4, seed=206),
    # layers of 2.8 MiB: a group of 3 is read in several 4 MiB requests
    "qwen2-small-tied": dict(arch="qwen2", preset="small", layers=4, seed=207),
}

PLACEMENTS = ["resident", "host", "disk", "mixed", "embed-host", "embed-disk", "head-disk", "last-disk"]
# (group size, prefetch); 7 is more than any model's layers: one layer group
GROUP_PREFETCH = [(1, 1), (1, 3), (3, 1), (3, 3), (7, 2)]
CHUNKED = [(1, 1), (3, 3)]  # (group, prefetch) combinations also run with chunked prefill

SPLIT_MODELS = ["llama-untied-f32", "llama-tied-f32", "qwen2-small-tied"]
# each case of these took 3 s or more on 2 cores: marked slow (make check leaves them out)
SLOW_MODELS = ["qwen2-small-tied"]
# (group, prefetch) -> cpu-split's compute stream and copy delay (us). A delay
# makes a read of a slot before its copy landed visible; no delay and a
# compute thread make a copy that overtakes the compute still reading the
# slot visible - where the slot holds a different group on its next fill:
# with 5 equal layers one a group, the groups share prefetch + 1 slots in
# turn, while with group 3 the two layer groups and the head each have a
# slot of their own (plan.h), refilled with the same bytes.
SPLIT_MODES = {(1, 1): ("thread", 1000), (1, 3): ("thread", 0), (3, 1): ("inline", 300), (3, 3): ("inline", 0),
               (7, 2): ("thread", 200)}


def _model(models, name):
    opts = dict(MODELS[name])
    arch = opts.pop("arch")
    d = models.get(arch, opts.pop("preset", "tiny"), **opts)
    return d, st_util.read_config(d)


def _workloads(vocab, seed):
    p7, p11, p5 = (prompt_ids(vocab, n, seed + n) for n in (7, 11, 5))
    p3 = [vocab - 1, 0, vocab - 1]  # the first and last rows of the embedding table
    return {
        "b1": ([p7], ()),
        "b4": ([p7, p11, p3, p5], ()),
        # chunked prefill: 3-token steps for prompts of 7 and 11 tokens
        "chunk": ([p7, p11], ("--max-step-tokens", 3)),
        # sampled tokens follow every decode step's logits more closely than
        # greedy ones (random tiny models often repeat one token)
        "sample": ([p7, p11, p3, p5], ("--temperature", 1.0, "--seed", 5)),
    }


def _run(ferry, d, prompts, flags, dump):
    return ferry.generate_all(d, prompts, N_NEW, *flags, dump_logits=dump)


def plan_json(ferry, d, *flags):
    p = ferry.check("plan", "--model", d, "--json", *flags)
    try:
        return json.loads(p.stdout.decode())
    except ValueError:
        pytest.fail("ferry plan --json printed non-JSON: %r" % p.stdout[:500])


_BASE = {}


def baseline(ferry, d, cfg, name, wl, tmp, device=None):
    """The all-resident run of workload wl (no placement flags, and for the
    chunked workload no --max-step-tokens: it is compared with one-step prefill)
    on `device` (default: ferry's, or $FERRY_TEST_DEVICE)."""
    key = (str(d), wl, device or os.environ.get("FERRY_TEST_DEVICE") or "cpu")
    if key not in _BASE:
        prompts, extra = _workloads(cfg["vocab_size"], MODELS[name]["seed"])[wl]
        extra = [] if wl == "chunk" else list(extra)
        if device:
            extra += ["--device", device]
        _BASE[key] = _run(ferry, d, prompts, extra, tmp / ("base-%s.bin" % wl))
    return _BASE[key]


def split_budgets(groups, placement):
    """--max-memory for a placement, computed from a plan's group bytes
    (groups: the plan JSON list, embed first). Returns (spec, expected tiers
    per group in plan order)."""
    embed = groups[0]["bytes"]
    rest = [g["bytes"] for g in groups[1:]]  # layer groups..., head: execution order
    n = len(rest)
    if placement == "resident":
        return None, ["device"] * (n + 1)
    if placement == "host":
        return "device=0", ["host"] * (n + 1)
    if placement == "disk":
        return "device=0,host=0", ["disk"] * (n + 1)
    if placement == "mixed":
        a = max(1, n // 3)
        b = max(1, (n - a) // 2)
        c = n - a - b
        tiers = ["device"] * a + ["host"] * b + ["disk"] * c
        spec = "device=%d,host=%d" % (sum(rest[:a]), sum(rest[a:a + b]))
        # the embedding goes last: nothing is left on device or host
        return spec, [("disk" if embed else "device")] + tiers
    if placement in ("embed-host", "embed-disk"):
        host = "" if placement == "embed-host" else ",host=0"
        spec = "device=%d%s" % (sum(rest), host)
        et = placement.split("-")[1] if embed else "device"
        return spec, [et] + ["device"] * n
    if placement == "head-disk":
        # one streamed group (the head): a single staging slot reused every step
        return "device=%d,host=0" % sum(rest[:-1]), [("disk" if embed else "device")] + ["device"] * (n - 1) + ["disk"]
    if placement == "last-disk":
        # the last layer group does not fit; the smaller head after it does (first fit)
        assert rest[-1] <= rest[-2], "the head is expected to be smaller than a layer group"
        spec = "device=%d,host=0" % (sum(rest[:-2]) + rest[-1])
        return spec, [("disk" if embed else "device")] + ["device"] * (n - 2) + ["disk", "device"]
    raise AssertionError(placement)


def tiers_of(plan):
    return [g["tier"] for g in plan["groups"]]


def placement_flags(ferry, d, placement, group, prefetch, od, device=None):
    flags = ["--group-size", group, "--prefetch", prefetch] + (["--device", device] if device else [])
    plan0 = plan_json(ferry, d, *flags)
    spec, want = split_budgets(plan0["groups"], placement)
    if spec is not None:  # placements by weight bytes: the working memory comes on top
        flags += ["--max-memory-scope", "weights", "--max-memory", spec]
    plan = plan_json(ferry, d, *flags)
    got = tiers_of(plan)
    # an empty embedding group (tied) has no tier worth asserting
    for i, g in enumerate(plan["groups"]):
        if g["bytes"] == 0:
            got[i] = want[i] = "-"
    assert got == want, "placement %s (--max-memory %s, group %d): plan tiers %r, expected %r" % (
        placement, spec, group, got, want)
    if "disk" in got:
        flags += ["--offload-dir", od]
    return flags, plan


@pytest.mark.parametrize("name,placement,device", [
    pytest.param(name, placement, device, id="%s-%s%s" % (name, placement, "-split" if device else ""),
                 marks=[pytest.mark.slow] if name in SLOW_MODELS else [])
    for device, names in ((None, list(MODELS)), ("cpu-split", SPLIT_MODELS))
    for name in names for placement in PLACEMENTS])
def test_placement_matches_resident(ferry, models, tmp_path, monkeypatch, name, placement, device):
    """device None: ferry's default (or $FERRY_TEST_DEVICE) against its own
    all-resident run; cpu-split: against the CPU's."""
    d, cfg = _model(models, name)
    wls = _workloads(cfg["vocab_size"], MODELS[name]["seed"])
    runs = 0
    for group, prefetch in GROUP_PREFETCH:
        what = "%s %s group=%d prefetch=%d" % (name, placement, group, prefetch)
        if device:
            compute, delay = SPLIT_MODES[(group, prefetch)]
            monkeypatch.setenv("FERRY_SPLIT_COMPUTE", compute)
            monkeypatch.setenv("FERRY_SPLIT_DELAY_US", str(delay))
            what += " %s (compute %s, copies %d us late)" % (device, compute, delay)
        od = tmp_path / ("od-g%d-p%d" % (group, prefetch))
        flags, _ = placement_flags(ferry, d, placement, group, prefetch, od, device)
        for wl, (prompts, extra) in wls.items():
            if wl == "chunk" and (group, prefetch) not in CHUNKED:
                continue
            want_out, want_logits = baseline(ferry, d, cfg, name, wl, tmp_path, "cpu" if device else None)
            what_wl = "%s %s" % (what, wl)
            out, logits = _run(ferry, d, prompts, flags + list(extra), tmp_path / "l.bin")
            assert out == want_out, "%s: tokens %r, all-resident %r" % (what_wl, out, want_out)
            for i in range(len(prompts)):
                err = rel_err(logits[i], want_logits[i])
                assert err <= SAME, "%s: prompt %d: rel logit error %.3g vs all-resident" % (what_wl, i, err)
            runs += 1
    assert runs == len(GROUP_PREFETCH) * 3 + len(CHUNKED)


@pytest.mark.parametrize("name,placement,group,prefetch,wl", [
    ("qwen2-bias-f32", "disk", 3, 1, "b4"),
    ("qwen2-bias-f32", "mixed", 1, 3, "chunk"),
    ("mistral-bf16-window", "mixed", 1, 1, "chunk"),
])
def test_placement_against_reference(ferry, models, ref, tmp_path, name, placement, group, prefetch, wl):
    d, cfg = _model(models, name)
    prompts, extra = _workloads(cfg["vocab_size"], MODELS[name]["seed"])[wl]
    flags, _ = placement_flags(ferry, d, placement, group, prefetch, tmp_path / "od")
    out, logits = _run(ferry, d, prompts, flags + list(extra), tmp_path / "l.bin")
    m = ref(d)
    tol = REF_TOL[MODELS[name].get("dtype", "f32")]
    for i, p in enumerate(prompts):
        err = rel_err(logits[i], llama_ref.last_logits(m, p))
        assert err < tol, "prompt %d: rel logit error vs reference %.3g >= %g" % (i, err, tol)
        check_greedy(d, m, p, out[i], N_NEW, tol)


@pytest.mark.parametrize("placement", ["disk", "embed-disk", "mixed"])
def test_disk_tier_needs_offload_dir(ferry, models, work, placement):
    d, cfg = _model(models, "llama-untied-f32")
    plan = plan_json(ferry, d)
    spec, want = split_budgets(plan["groups"], placement)
    assert "disk" in want
    p = ferry.run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 2,
                  "--max-memory-scope", "weights", "--max-memory", spec)
    assert_ferry_error(p, "--offload-dir")
    assert not any(work.iterdir())


def test_bad_max_memory(ferry, models):
    d, _ = _model(models, "llama-untied-f32")
    for spec, needle in [("gpu=1GiB", "gpu"), ("device=x", "device"), ("device", "device"),
                         ("host=1GiB,device=12QiB", "device")]:
        p = ferry.run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 2,
                      "--max-memory", spec)
        assert_ferry_error(p, needle)
        p = ferry.run("plan", "--model", d, "--max-memory", spec)
        assert_ferry_error(p, needle)


# --------------------------------------------------------------------------
# ferry plan
# --------------------------------------------------------------------------

def check_plan(plan, cfg, group, prefetch, budgets=(None, None), batch=64, context=None, kv_memory=None):
    """Invariants of any plan (JSON of `ferry plan --json`). batch and context
    default as settings.def says: 64 sequences, max_position_embeddings capped
    at 4096. kv_memory: the --kv-memory given, None for the default pool."""
    L = cfg["num_hidden_layers"]
    groups = plan["groups"]
    assert [g["group"] for g in groups] == list(range(len(groups)))
    assert groups[0]["name"] == "embed" and groups[-1]["name"] == "head"
    layers = groups[1:-1]
    assert len(layers) == -(-L // group)
    nxt = 0
    for i, g in enumerate(layers):
        assert g["first_layer"] == nxt, "groups not contiguous: %r" % layers
        want_n = group if i < len(layers) - 1 else L - nxt
        assert g["n_layers"] == want_n, "group %d: %d layers, expected %d" % (i, g["n_layers"], want_n)
        assert g["name"] == "layers %d-%d" % (nxt, nxt + want_n - 1)
        nxt += want_n
    assert nxt == L
    for g in groups:
        assert g["bytes"] % 4096 == 0 and g["bytes"] >= 0
        assert g["tier"] in ("device", "host", "disk")
    for g in layers + [groups[-1]]:
        assert g["bytes"] > 0
    # totals
    totals = {t: sum(g["bytes"] for g in groups if g["tier"] == t) for t in ("device", "host", "disk")}
    assert plan["tier_bytes"] == totals
    # budgets
    for t, b in zip(("device", "host"), budgets):
        if b is not None:
            assert plan["tier_bytes"][t] <= b, "%s tier holds %d bytes, budget %d" % (t, plan["tier_bytes"][t], b)
    # working memory
    streamed = [g for g in groups[1:] if g["tier"] != "device"]
    w = plan["working"]
    assert plan["streamed_groups"] == len(streamed)
    # slots sized per group: the largest groups may have their own, the rest
    # share prefetch + 1 of their largest; never more bytes than prefetch + 1
    # slots of the largest group
    sizes = plan["slot_sizes"]
    assert w["staging_slots"] == len(sizes) <= len(streamed)
    assert w["slot_bytes"] == max([g["bytes"] for g in streamed], default=0) == max(sizes, default=0)
    assert w["staging_bytes"] == sum(sizes)
    assert w["staging_bytes"] <= min(prefetch + 1, len(streamed)) * w["slot_bytes"]
    by_size = sorted((g["bytes"] for g in streamed), reverse=True)
    own = plan["own_slots"]
    assert sizes[:own] == by_size[:own]
    assert all(x == max(by_size[own:], default=0) for x in sizes[own:])
    assert len(sizes) - own == min(prefetch + 1, len(streamed) - own)
    ctx = context or min(cfg["max_position_embeddings"], 4096)
    assert plan["sequences"] == batch and plan["context"] == ctx
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_dim = (cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * head_dim
    # the paged KV pool (engine/kv.h): blocks of 16 positions; --kv-memory
    # bytes of them, else by default batch sequences of the whole context, or
    # fewer (never under one) where the memory does not afford them: then the
    # plan fits
    block_bytes = 2 * L * 16 * kv_dim * 4
    ctx_blocks = -(-ctx // 16)
    blocks = plan["kv_pool"]["blocks"]
    if kv_memory is not None:
        assert blocks == kv_memory // block_bytes
    else:
        assert ctx_blocks <= blocks <= batch * ctx_blocks
        assert blocks == batch * ctx_blocks or plan["fits"] is True, plan
    assert plan["kv_pool"]["positions"] == blocks * 16
    assert plan["kv_pool"]["sequences_of_context"] == blocks // ctx_blocks
    assert w["kv_bytes"] == plan["kv_pool"]["bytes"] == blocks * block_bytes
    assert w["activation_bytes"] > 0
    assert plan["needs"]["host"] >= plan["tier_bytes"]["device"] + plan["tier_bytes"]["host"] + \
        w["staging_bytes"] + w["kv_bytes"] + w["activation_bytes"]  # the CPU backend: one memory
    assert plan["fits"] == (plan["needs"]["host"] <= plan["host_available"])


@pytest.mark.slow
def test_plan_invariants(ferry, models, work):
    d, cfg = _model(models, "llama-untied-f32")
    base = plan_json(ferry, d)
    check_plan(base, cfg, 1, 2)
    assert set(tiers_of(base)) == {"device"}
    assert base["streamed_groups"] == 0
    layer = base["groups"][1]["bytes"]
    head = base["groups"][-1]["bytes"]
    embed = base["groups"][0]["bytes"]
    total = sum(g["bytes"] for g in base["groups"])
    budgets = [(None, None), (0, None), (0, 0), (layer, layer), (2 * layer - 1, 2 * layer + 1),
               (head, 0), (total - embed, 0), (total, 0), (total - 1, 3 * layer), (embed, embed)]
    for group in (1, 2, 3, 5, 7):
        for prefetch in (1, 2, 4):
            for dev, host in budgets:
                spec = ",".join("%s=%d" % (k, v) for k, v in (("device", dev), ("host", host)) if v is not None)
                flags = ["--group-size", group, "--prefetch", prefetch, "--offload-dir", work / "od"]
                if spec:  # check_plan checks weight budgets
                    flags += ["--max-memory-scope", "weights", "--max-memory", spec]
                plan = plan_json(ferry, d, *flags, "--batch", 3, "--context", 100)
                check_plan(plan, cfg, group, prefetch, (dev, host), batch=3, context=100)
                # first fit, execution order, the embedding last
                left = [float("inf") if dev is None else dev, float("inf") if host is None else host]
                want = []
                for g in plan["groups"][1:] + plan["groups"][:1]:
                    for t in (0, 1):
                        if g["bytes"] <= left[t]:
                            left[t] -= g["bytes"]
                            want.append(("device", "host")[t])
                            break
                    else:
                        want.append("disk")
                want = want[-1:] + want[:-1]
                assert tiers_of(plan) == want, "group %d, --max-memory %s" % (group, spec)
    # the plan writes nothing, not even the offload dir
    assert not (work / "od").exists()


def test_plan_embed_placed_last(ferry, models):
    d, cfg = _model(models, "llama-untied-f32")
    g = plan_json(ferry, d)["groups"]
    embed, rest = g[0]["bytes"], sum(x["bytes"] for x in g[1:])
    assert embed > 0
    # room for everything but the embedding: it alone leaves the device
    plan = plan_json(ferry, d, "--max-memory-scope", "weights", "--max-memory", "device=%d,host=0" % rest)
    assert tiers_of(plan) == ["disk"] + ["device"] * (len(g) - 1)
    plan = plan_json(ferry, d, "--max-memory-scope", "weights", "--max-memory", "device=%d" % rest)
    assert tiers_of(plan) == ["host"] + ["device"] * (len(g) - 1)
    # placed first, the embedding would take the device and leave layer 0 out;
    # placed last, layer 0 is in and the embedding no longer fits
    plan = plan_json(ferry, d, "--max-memory-scope", "weights", "--max-memory", "device=%d,host=0" % (embed + g[1]["bytes"] - 4096))
    t = tiers_of(plan)
    assert t[1] == "device" and t[0] == "disk", t
    # ... unless the layers and head leave room for it
    plan = plan_json(ferry, d, "--max-memory-scope", "weights", "--max-memory", "device=%d,host=0" % (rest + embed))
    assert set(tiers_of(plan)) == {"device"}
    # first fit: a head smaller than a layer takes the device after the layers did not
    head = g[-1]["bytes"]
    assert head < g[1]["bytes"]
    plan = plan_json(ferry, d, "--max-memory-scope", "weights", "--max-memory", "device=%d" % head)
    assert tiers_of(plan) == ["host"] + ["host"] * (len(g) - 2) + ["device"]


def test_plan_tied_embed_group_is_empty(ferry, models):
    d, cfg = _model(models, "llama-tied-f32")
    untied, _ = _model(models, "llama-untied-f32")
    plan = plan_json(ferry, d, "--max-memory", "device=0,host=0")
    assert plan["groups"][0]["bytes"] == 0
    # the table lives in the head group: as big as the untied head (norm + lm_head)
    assert plan["groups"][-1]["bytes"] == plan_json(ferry, untied)["groups"][-1]["bytes"]
    assert plan["tier_bytes"]["device"] == 0 and plan["tier_bytes"]["host"] == 0
    check_plan(plan, cfg, 1, 2, (0, 0))


def _huge_context_model(models, work):
    """qwen2 small with max_position_embeddings raised so that a KV cache of
    terabytes is a valid request."""
    d = copy_model(models.get("qwen2", "small", seed=7), work / "q2big")
    cfg = st_util.read_config(d)
    cfg["max_position_embeddings"] = 1 << 24
    (d / "config.json").write_text(json.dumps(cfg))
    return d, cfg


def test_plan_does_not_fit(ferry, models, work):
    d, cfg = _huge_context_model(models, work)
    flags = ["--max-memory-scope", "weights", "--max-memory", "device=1MiB,host=1MiB"]
    small = plan_json(ferry, d, *flags, "--batch", 1, "--context", 64)
    check_plan(small, cfg, 1, 2, (1 << 20, 1 << 20), batch=1, context=64)
    assert small["fits"] is True
    assert small["tier_bytes"]["disk"] > 0
    # the default pool is what the memory affords: it fits
    auto = plan_json(ferry, d, *flags, "--batch", 4096, "--context", 131072)
    check_plan(auto, cfg, 1, 2, (1 << 20, 1 << 20), batch=4096, context=131072)
    assert auto["fits"] is True and auto["kv_pool"]["sequences_of_context"] >= 1
    # a pool asked for that no machine here has
    kv = ["--kv-memory", "2TiB"]
    big = plan_json(ferry, d, *flags, "--batch", 4096, "--context", 131072, *kv)
    check_plan(big, cfg, 1, 2, (1 << 20, 1 << 20), batch=4096, context=131072, kv_memory=2 << 40)
    assert big["working"]["kv_bytes"] >= 1 << 40
    if big["host_available"] >= big["needs"]["host"]:
        pytest.skip("this machine has more than %d bytes available" % big["needs"]["host"])
    assert big["needs"]["host"] > big["host_available"]
    assert big["fits"] is False
    # the text form says so too, and plan still exits 0 (it is a report)
    p = ferry.check("plan", "--model", d, *flags, "--batch", 4096, "--context", 131072, *kv)
    assert "fit" in p.stdout.decode().lower()


def test_generate_refuses_plan_that_does_not_fit(ferry, models, work):
    d, cfg = _huge_context_model(models, work)
    n_prompts, n_new = 64, (1 << 24) - 1
    plan = plan_json(ferry, d, "--max-memory", "device=0,host=0", "--batch", n_prompts, "--context", 1 << 24)
    if plan["fits"]:
        pytest.skip("this machine has %d bytes available, more than the %d the test needs to exceed" % (
            plan["host_available"], plan["needs"]["host"]))
    od = work / "od"
    p = ferry.run("generate", "--model", d, "--prompt-ids", ";".join(["1"] * n_prompts),
                  "--max-new-tokens", n_new, "--max-memory", "device=0,host=0", "--offload-dir", od, timeout=30)
    line = assert_ferry_error(p, "needs", rcs=(1,))
    assert "TiB" in line or "GiB" in line, line
    # refused at startup: no blob was written
    assert not od.exists() or not any(od.iterdir())


@pytest.mark.parametrize("flag,value", [("--group-size", 0), ("--group-size", -1), ("--prefetch", -1),
                                        ("--max-step-tokens", 0)])
def test_bad_placement_flags(ferry, models, flag, value):
    d, _ = _model(models, "llama-untied-f32")
    for cmd in ("generate", "plan"):
        args = [cmd, "--model", d, flag, value]
        if cmd == "generate":
            args += ["--prompt-ids", "1,2,3", "--max-new-tokens", 2]
        assert_ferry_error(ferry.run(*args), flag)


def test_offload_dir_not_a_directory(ferry, models, work):
    d, _ = _model(models, "llama-untied-f32")
    f = work / "a-file"
    f.write_text("x")
    for od in (f, f / "sub"):
        p = ferry.run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 2,
                      "--max-memory", "device=0,host=0", "--offload-dir", od)
        line = assert_ferry_error(p, "directory", rcs=(1,))
        assert str(f) in line
    assert f.read_text() == "x"


# --------------------------------------------------------------------------
# peak memory follows the budgets
# --------------------------------------------------------------------------

# Runs argv and prints its peak RSS. It runs in a fresh small interpreter: a
# child forked from this (torch-laden) process would count our RSS at the
# fork in its own high-water mark.
_RSS_PROBE = r"""
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read()
_, status, ru = os.wait4(p.pid, 0)
if status != 0:
    sys.stderr.write(err.decode(errors="replace"))
    sys.exit(1)
print(ru.ru_maxrss * 1024)
"""


def _peak_rss(argv):
    """Peak RSS in bytes of one (successful) run of argv."""
    p = subprocess.run([sys.executable, "-c", _RSS_PROBE] + [str(a) for a in argv], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert p.returncode == 0, "%s failed: %r" % (" ".join(str(a) for a in argv), p.stderr[-1000:])
    return int(p.stdout)


def test_peak_rss_follows_budgets(ferry_bin, models, work):
    """Resident weights are paid for in RSS; streamed ones are not, neither
    while running nor while the offload dir is built (the checkpoint is
    never materialized: each tensor's mapped pages are released)."""
    with open(ferry_bin, "rb") as f:
        if b"__asan_init" in f.read():
            pytest.skip("sanitizer builds have their own memory overheads")
    d = models.get("llama", "small", layers=16, seed=208)
    plan = json.loads(subprocess.run([ferry_bin, "plan", "--model", str(d), "--json"], stdout=subprocess.PIPE,
                                     check=True, timeout=60).stdout)
    weights = sum(g["bytes"] for g in plan["groups"])
    assert weights > 40 << 20
    base = [ferry_bin, "generate", "--model", d, "--prompt-ids", "1,2,3,4,5,6,7", "--max-new-tokens", 4]
    od = work / "od"
    resident = _peak_rss(base)
    disk_build = _peak_rss(base + ["--max-memory", "device=0,host=0", "--offload-dir", od])
    disk_reuse = _peak_rss(base + ["--max-memory", "device=0,host=0", "--offload-dir", od])
    mixed = _peak_rss(base + ["--max-memory-scope", "weights", "--max-memory", "device=8MiB,host=8MiB",
                              "--offload-dir", work / "od2"])
    what = "peak RSS MiB: resident %.1f, disk (build) %.1f, disk (reuse) %.1f, 8+8 MiB %.1f; weights %.1f" % (
        resident / 2**20, disk_build / 2**20, disk_reuse / 2**20, mixed / 2**20, weights / 2**20)
    assert resident >= 0.9 * weights, what  # the measurement sees the weights
    assert disk_build <= resident - 0.6 * weights, what
    assert disk_reuse <= resident - 0.6 * weights, what
    assert mixed <= disk_reuse + (16 << 20) + (12 << 20), what
    assert mixed <= resident - 0.3 * weights, what


@pytest.mark.slow
def test_prefetch_given_is_obeyed(ferry_bin, work):
    """An explicit --prefetch bounds the staging slots even where the planner
    would read further ahead: SmolLM2 (a 108 MiB head, 13.5 MiB layers) all
    on disk, one layer a group. Left to the planner, prefetch reads 256 MiB
    of layers ahead; with --prefetch 1 two fetches are in flight, and the
    slots are sized per group: the head has its own, the layers share two
    of 13.5 MiB. The run peaks below twice the largest group + 96 MiB."""
    with open(ferry_bin, "rb") as f:
        if b"__asan_init" in f.read():
            pytest.skip("sanitizer builds have their own memory overheads")
    d = refdata.smollm2()
    od = work / "od-prefetch"
    flags = ["--max-memory", "device=0,host=0", "--group-size", "1", "--offload-dir", str(od)]

    def plan(*extra):
        return json.loads(subprocess.run([ferry_bin, "plan", "--model", str(d), "--json"] + flags + list(extra),
                                         stdout=subprocess.PIPE, check=True, timeout=60).stdout)

    auto, given = plan(), plan("--prefetch", "1")
    largest = given["working"]["slot_bytes"]
    layer = max(g["bytes"] for g in given["groups"] if g["name"].startswith("layers"))
    assert largest == given["groups"][-1]["bytes"] > 4 * layer
    assert auto["prefetch_source"] == "planner" and auto["prefetch"] * layer >= 256 << 20, auto
    assert auto["slot_sizes"] == [largest] + [layer] * (auto["prefetch"] + 1), auto["slot_sizes"]
    assert given["prefetch_source"] == "given" and given["prefetch"] == 1, given
    assert given["slot_sizes"] == [largest, layer, layer], given["slot_sizes"]
    assert given["working"]["staging_bytes"] == largest + 2 * layer
    peak = _peak_rss([ferry_bin, "generate", "--model", d, "--prompt-ids", "1,2,3,4", "--max-new-tokens", 24,
                      "--prefetch", 1] + flags)
    assert peak < 2 * largest + (96 << 20), "peak RSS %.1f MiB, largest group %.1f MiB" % (peak / 2**20,
                                                                                          largest / 2**20)



def _vmhwm_and_plan(ferry_bin, d, flags, prompt, n_new):
    """(peak RSS of `ferry generate`, the plan `ferry plan` makes for the same
    run: one sequence of the prompt and its new tokens)."""
    plan = json.loads(subprocess.run([ferry_bin, "plan", "--model", str(d), "--json", "--batch", "1", "--context",
                                      str(len(prompt) + n_new)] + [str(f) for f in flags],
                                     stdout=subprocess.PIPE, check=True, timeout=60).stdout)
    peak = _peak_rss([ferry_bin, "generate", "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
                      "--max-new-tokens", n_new] + list(flags))
    return peak, plan


@pytest.mark.slow
def test_host_budget_holds(ferry_bin, models, work):
    """--max-memory host=X bounds all the model takes of RAM on the CPU
    backend (weights, staging, KV cache, activations, expert slots), and
    device=,host= all it takes of each memory on cpu-split (whose device
    memory is RAM too): for several budgets and placements - all on disk,
    mixed, quantized, a mixture of experts with experts on disk, and the
    non-unified path - the peak RSS stays within the budget + 64 MiB + the
    process's own baseline (a tiny model's run), and within the plan's
    expected peak + 10%; the plan's own account of the budget holds too."""
    with open(ferry_bin, "rb") as f:
        if b"__asan_init" in f.read():
            pytest.skip("sanitizer builds have their own memory overheads")
    prompt, n_new = [1, 2, 3, 4, 5, 6, 7], 8
    tiny = models.get("llama", "tiny", seed=1)
    baseline, _ = _vmhwm_and_plan(ferry_bin, tiny, [], prompt, n_new)
    # 186 MiB of f32 weights: well above any budget + 64 MiB + the baseline
    dense = models.get("llama", "small", layers=64, seed=208)
    moe = models.get("qwen3moe", "small", seed=3)
    MiB = 1 << 20
    cases = [  # (model, flags, budget bytes, expected tiers present)
        (dense, ["--max-memory", "host=64MiB"], 64 * MiB, {"device", "disk"}),
        (dense, ["--max-memory", "96MiB"], 96 * MiB, {"device", "disk"}),
        (dense, ["--max-memory", "cpu=16MiB"], 16 * MiB, {"disk"}),  # the least working memory and no more
        (dense, ["--max-memory", "host=32MiB", "--quantize", "int8"], 32 * MiB, {"device", "disk"}),
        (moe, ["--max-memory", "host=20MiB"], 20 * MiB, {"device", "disk"}),
        (dense, ["--device", "cpu-split", "--max-memory", "device=64MiB,host=16MiB"], 80 * MiB,
         {"device", "host", "disk"}),
    ]
    for i, (d, flags, budget, tiers) in enumerate(cases):
        flags = flags + ["--offload-dir", work / ("od-budget-%d" % i)]
        peak, plan = _vmhwm_and_plan(ferry_bin, d, flags, prompt, n_new)
        what = "%s %s: peak RSS %.1f MiB, budget %.1f MiB, baseline %.1f MiB, plan expects %.1f MiB, tiers %r" % (
            d.name, " ".join(map(str, flags[:-2])), peak / MiB, budget / MiB, baseline / MiB,
            plan["expected_peak_rss"] / MiB, plan["tier_bytes"])
        assert {t for t, b in plan["tier_bytes"].items() if b} == tiers, what
        used = plan["budget"]["used"]
        assert plan["budget"]["scope"] == "all" and used["device"] + used["host"] <= budget, what
        assert peak <= budget + 64 * MiB + baseline, what
        assert peak <= 1.1 * plan["expected_peak_rss"], what


def test_budget_too_small_is_refused(ferry, models, work):
    """A budget that cannot hold the least working memory with every weight
    on disk is refused in one line naming the numbers, by plan and generate;
    on the CPU backend a device= budget alone is refused, saying what to
    write; cpu= and a bare size are host=."""
    d = models.get("llama", "small", layers=64, seed=208)
    for cmd in (("plan",), ("generate", "--prompt-ids", "1,2,3", "--max-new-tokens", 2)):
        p = ferry.run(*cmd, "--model", d, "--max-memory", "host=2MiB", "--offload-dir", work / "od-small")
        assert_ferry_error(p, "--max-memory host=2.00 MiB cannot hold the least this model needs")
        for needle in ("staging", "KV cache", "activations"):
            assert needle in p.stderr.decode()
        p = ferry.run(*cmd, "--model", d, "--max-memory", "device=1GiB")
        assert_ferry_error(p, "write --max-memory 1GiB")
    plans = [plan_json(ferry, d, "--max-memory", spec, "--offload-dir", work / "od-small", "--context", 64)
             for spec in ("host=80MiB", "cpu=80MiB", "80MiB")]
    assert plans[0]["budget"]["host"] == 80 << 20
    assert all(tiers_of(p) == tiers_of(plans[0]) and p["budget"] == plans[0]["budget"] for p in plans), plans
