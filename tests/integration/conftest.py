"""Fixtures for the integration tests that drive the real `ferry` binary.

Run with Debian's interpreter (it has torch/numpy/pytest):
    /usr/bin/python3 -m pytest tests/integration
The binary is $FERRY_BIN if set, else <repo>/build/ferry. A missing binary is a
test failure (not a skip) for every test that needs it. With $FERRY_TEST_DEVICE set
(`make test-gpu` sets cuda), generate/bench/plan runs that name no --device get
`--device $FERRY_TEST_DEVICE` appended.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "reference"))

import llama_ref  # noqa: E402
import st_util  # noqa: E402

# "address" or "thread" when the binary is a sanitized build (make check-asan,
# make check-tsan; docs/sanitizers.md): a few bounds on time and memory that
# such a build cannot keep (ASan's quarantine holds freed memory, ThreadSanitizer
# runs 5-15x slower) are widened or left out there - never a functional check.
SANITIZER = os.environ.get("FERRY_SANITIZER", "")
RUN_TIMEOUT = 120  # seconds for any single ferry invocation (a hang is a failure)
DEVICE_COMMANDS = ("generate", "bench", "plan")  # the ones $FERRY_TEST_DEVICE applies to


def pytest_configure(config):
    # `make check` runs the integration tests not marked slow, in parallel
    # (pytest-xdist); `make test` runs them all (docs/testing.md)
    config.addinivalue_line("markers", "slow: took 3 s or more on 2 cores (measured with --durations): left out "
                                       "of make check, run by make test")


def wait_until(cond, what, timeout=60, interval=0.02):
    """Polls cond() until it returns something true, and returns that; fails
    naming `what` (a string, or a callable giving one) after timeout seconds.
    Tests wait on what they can observe - a metric, a log line, a frame -
    never for a fixed time."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail("after %ss: %s" % (timeout, what() if callable(what) else what))
        time.sleep(interval)


def ferry_path():
    return os.environ.get("FERRY_BIN") or str(REPO / "build" / "ferry")


class Ferry:
    """Thin wrapper over subprocess calls to the ferry binary."""

    def __init__(self, path):
        self.path = path

    def run(self, *args, timeout=RUN_TIMEOUT, env=None):
        argv = [self.path] + [str(a) for a in args]
        device = os.environ.get("FERRY_TEST_DEVICE")
        if device and len(argv) > 1 and argv[1] in DEVICE_COMMANDS and "--device" not in argv:
            argv += ["--device", device]
        try:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            pytest.fail("ferry timed out after %ss: %s" % (timeout, " ".join(argv)))

    def check(self, *args, **kw):
        p = self.run(*args, **kw)
        if p.returncode != 0:
            pytest.fail("ferry %s failed (rc=%d):\nstdout: %s\nstderr: %s" % (
                " ".join(str(a) for a in args), p.returncode,
                p.stdout.decode(errors="replace")[-2000:],
                p.stderr.decode(errors="replace")[-2000:]))
        return p

    def mkmodel(self, out, arch, preset="tiny", dtype=None, seed=None, shard_size=None,
                layers=None, kv_heads=None, tied=None, sliding_window=None, extra=()):
        args = ["mkmodel", "--out", out, "--arch", arch, "--preset", preset]
        if dtype is not None:
            args += ["--dtype", dtype]
        if seed is not None:
            args += ["--seed", seed]
        if shard_size is not None:
            args += ["--shard-size", shard_size]
        if layers is not None:
            args += ["--layers", layers]
        if kv_heads is not None:
            args += ["--kv-heads", kv_heads]
        if tied is not None:
            args += ["--tied", "true" if tied else "false"]
        if sliding_window is not None:
            args += ["--sliding-window", sliding_window]
        args += list(extra)
        self.check(*args)
        return Path(out)

    def generate(self, model, prompts, max_new_tokens, *extra, dump_logits=None):
        """prompts: one list of ids or a list of lists. Returns (output_ids, logits)
        where output_ids mirrors the prompt nesting and logits is a float32
        array [n_prompts, vocab] (None unless dump_logits is a path)."""
        batched = bool(prompts) and isinstance(prompts[0], (list, tuple))
        plist = prompts if batched else [prompts]
        spec = ";".join(",".join(str(int(t)) for t in p) for p in plist)
        args = ["generate", "--model", model, "--prompt-ids", spec,
                "--max-new-tokens", max_new_tokens, "--json"]
        if dump_logits is not None:
            args += ["--dump-logits", dump_logits]
        args += list(extra)
        p = self.check(*args)
        try:
            obj = json.loads(p.stdout.decode())
        except ValueError:
            pytest.fail("ferry generate --json printed non-JSON: %r" % p.stdout[:500])
        out = obj["output_ids"]
        logits = None
        if dump_logits is not None:
            logits = np.fromfile(str(dump_logits), dtype="<f4")
            assert logits.size % len(plist) == 0, "dump-logits size %d not a multiple of %d prompts" % (
                logits.size, len(plist))
            logits = logits.reshape(len(plist), -1)
        if batched:
            assert isinstance(out, list) and len(out) == len(plist) and all(
                isinstance(o, list) for o in out), "batched output_ids must be a list of lists: %r" % (out,)
        else:
            assert isinstance(out, list) and all(isinstance(t, int) for t in out), \
                "output_ids must be a flat list of ints: %r" % (out,)
        return out, logits

    def generate_all(self, model, prompts, max_new_tokens, *extra, dump_logits):
        """A list of prompts (one or more) in one run: (output ids per prompt,
        logits [n_prompts, vocab]), every logit finite."""
        if len(prompts) == 1:
            out, logits = self.generate(model, prompts[0], max_new_tokens, *extra, dump_logits=dump_logits)
            out = [out]
        else:
            out, logits = self.generate(model, prompts, max_new_tokens, *extra, dump_logits=dump_logits)
        assert logits.shape[0] == len(prompts)
        bad = int(np.sum(~np.isfinite(logits)))
        assert bad == 0, "%s: %d of %d logits are not finite" % (" ".join(str(f) for f in extra), bad, logits.size)
        return out, logits


@pytest.fixture(scope="session")
def ferry_bin():
    p = ferry_path()
    if not (os.path.isfile(p) and os.access(p, os.X_OK)):
        pytest.fail("ferry binary not found or not executable at %s "
                    "(build it with `make`, or set FERRY_BIN)" % p)
    return p


@pytest.fixture(scope="session")
def ferry(ferry_bin):
    return Ferry(ferry_bin)


class ModelFactory:
    """Builds checkpoints with `ferry mkmodel`, each distinct option set once
    per session. kv_heads="mha" means as many kv heads as attention heads."""

    def __init__(self, ferry, root):
        self.ferry = ferry
        self.root = Path(root)
        self.cache = {}

    def get(self, arch, preset="tiny", **opts):
        if opts.get("kv_heads") == "mha":
            base = self.get(arch, preset)
            opts["kv_heads"] = int(st_util.read_config(base)["num_attention_heads"])
        key = (arch, preset) + tuple(sorted((k, v) for k, v in opts.items() if v is not None))
        if key not in self.cache:
            name = "-".join(str(x) for x in key if not isinstance(x, tuple))
            name += "".join("-%s=%s" % kv for kv in key if isinstance(kv, tuple))
            out = self.root / name.replace("/", "_")
            if out.exists():
                shutil.rmtree(out)
            self.ferry.mkmodel(out, arch, preset, **opts)
            self.cache[key] = out
        return self.cache[key]


@pytest.fixture(scope="session")
def models(ferry, tmp_path_factory):
    return ModelFactory(ferry, tmp_path_factory.mktemp("models"))


class RefCache:
    def __init__(self):
        self.cache = {}

    def __call__(self, model_dir):
        k = str(model_dir)
        if k not in self.cache:
            self.cache[k] = llama_ref.load_model(k)
        return self.cache[k]


@pytest.fixture(scope="session")
def ref():
    """ref(model_dir) -> llama_ref model (loaded once per dir)."""
    return RefCache()


@pytest.fixture
def work(tmp_path_factory):
    """A fresh scratch dir whose path does not contain the test's name (so that
    a path echoed in an error message cannot satisfy a substring check)."""
    return tmp_path_factory.mktemp("case")


def copy_model(src, dst):
    """Copy a checkpoint directory (regular files only) to dst; returns dst."""
    dst = Path(dst)
    shutil.copytree(str(src), str(dst))
    return dst


def assert_ferry_error(proc, needles, rcs=(1, 2)):
    """A clean ferry failure: rc in rcs (never a signal), exactly one non-empty
    stderr line starting with 'ferry: ' that contains (case-insensitively) at
    least one of needles."""
    err = proc.stderr.decode("utf-8", errors="replace")
    ctx = "rc=%d\nstderr=%r\nstdout=%r" % (proc.returncode, err[:2000], proc.stdout[:500])
    assert proc.returncode >= 0, "ferry died from signal %d\n%s" % (-proc.returncode, ctx)
    assert proc.returncode in rcs, "expected exit status in %s\n%s" % (rcs, ctx)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, "expected exactly one stderr line\n%s" % ctx
    assert lines[0].startswith("ferry: "), "stderr line must start with 'ferry: '\n%s" % ctx
    if isinstance(needles, str):
        needles = [needles]
    low = lines[0].lower()
    assert any(n.lower() in low for n in needles), \
        "stderr should name one of %r\n%s" % (list(needles), ctx)
    return lines[0]


def placement_flags(placement, tmp_path):
    """(flags, the tier every weight group is on) of a placement named host
    (all in RAM, none on the device), disk (every group streamed from an
    offload dir) or cpu-split (the GPU memory model on the CPU)."""
    return {
        "host": (["--max-memory", "device=0,host=2GiB"], "host"),
        "disk": (["--max-memory", "device=0,host=0", "--offload-dir", tmp_path / "offload"], "disk"),
        "cpu-split": (["--device", "cpu-split"], "device"),
    }[placement]


def rel_err(a, b):
    """max|a - b| / max|b| (b is the reference)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, "shape mismatch %s vs %s" % (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def eos_ids(model_dir):
    e = st_util.read_config(model_dir).get("eos_token_id")
    if e is None:
        return set()
    return set(e) if isinstance(e, list) else {int(e)}


def check_greedy(model_dir, refmodel, prompt, got, n, tol):
    """ferry's greedy tokens `got` against the reference. Tokens must be equal;
    the only excuses are (a) a near-tie in the reference logits at the first
    divergence (top-2 gap within the numeric tolerance), after which the
    sequences legitimately differ, and (b) early stop at an eos token."""
    want = llama_ref.greedy(refmodel, prompt, n)
    assert len(got) <= n, "ferry generated %d tokens, asked for %d" % (len(got), n)
    vocab = refmodel.vocab
    assert all(0 <= t < vocab for t in got), "token out of range: %r" % (got,)
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            logits = llama_ref.last_logits(refmodel, list(prompt) + want[:i])
            gap = float(logits[w] - logits[g])
            scale = float(np.max(np.abs(logits)))
            assert gap <= 4 * tol * scale, (
                "greedy tokens differ at step %d: ferry %r, reference %r "
                "(reference logit gap %.3g, max|logit| %.3g)" % (i, got, want, gap, scale))
            return  # legitimate near-tie; later tokens are not comparable
    if len(got) < n:
        eos = eos_ids(model_dir)
        assert got and got[-1] in eos, (
            "ferry stopped after %d of %d tokens without an eos token: %r (reference %r)" % (
                len(got), n, got, want))


def prompt_ids(vocab, length, seed):
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, vocab, size=length)]


@pytest.fixture(scope="module")
def vocab(tiny):
    """The vocabulary size of the module's `tiny` model (each server test
    module picks its own tiny checkpoint)."""
    return int(st_util.read_config(tiny)["vocab_size"])
