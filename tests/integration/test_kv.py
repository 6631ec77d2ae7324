"""The paged KV cache (engine/kv.h) seen from outside: `ferry serve` with a
KV pool far smaller than --batch x --context, so blocks run out while
sequences generate.

Covered: many concurrent requests of mixed lengths against a pool of 12
blocks (192 positions) for 8 sequences: every request succeeds, sequences
are preempted (/metrics ferry_preemptions_total) and resumed by
recomputing their prefix (ferry_recomputed_tokens_total, apart from
ferry_prompt_tokens_total), and the greedy tokens equal those of an
unconstrained server; a request whose prompt + max_new_tokens can never fit
the pool is a 400 naming the numbers; the pool is fully free at idle after
requests, cancellations and disconnects (ferry_kv_blocks{state="used"} 0);
`ferry plan` shows the pool. Tests never assert on wall time.
"""

import concurrent.futures
import json
import time

import pytest

import st_util
from conftest import prompt_ids
from test_http import (REQ_TIMEOUT, expect_error, generate, hang_up, metrics, msum, open_stream, serve,
                       sse_events)

BLOCK = 16  # KV_BLOCK_POSITIONS


def block_bytes(model):
    cfg = st_util.read_config(model)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_dim = (cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * hd
    return 2 * cfg["num_hidden_layers"] * BLOCK * kv_dim * 4


@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=73)


@pytest.fixture(scope="module")
def full(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 8, name="full")


@pytest.fixture(scope="module")
def small(ferry_bin, tiny):
    yield from serve(ferry_bin, tiny, "--batch", 8, "--kv-memory", 12 * block_bytes(tiny), "--max-step-tokens", 32,
                     name="small")


def wait_idle(srv):
    deadline = time.monotonic() + REQ_TIMEOUT
    while True:
        m = metrics(srv)
        if msum(m, "ferry_requests_running") == 0 and msum(m, "ferry_requests_queued") == 0:
            return m
        assert time.monotonic() < deadline, "the server never went idle"
        time.sleep(0.01)


def assert_pool_free(srv):
    m = wait_idle(srv)
    used, free = msum(m, "ferry_kv_blocks", state="used"), msum(m, "ferry_kv_blocks", state="free")
    assert used == 0, "%d KV blocks still held at idle (%d free)" % (used, free)
    return free


def test_plan_shows_pool(ferry, tiny):
    out = ferry.check("plan", "--model", tiny, "--batch", 8, "--kv-memory", 12 * block_bytes(tiny), "--json")
    pool = json.loads(out.stdout)["kv_pool"]
    assert pool == {"blocks": 12, "block_positions": 16, "positions": 192, "bytes": 12 * block_bytes(tiny),
                    "sequences_of_context": 0}
    text = ferry.check("plan", "--model", tiny, "--batch", 8, "--context", 64).stdout.decode()
    assert "KV pool   32 blocks x 16 positions = 512 positions" in text and "holds 8 sequences of 64" in text


def test_never_fits_is_400(small):
    msg = expect_error(small, 400, "POST", "/v2/models/small/generate",
                       {"input_ids": [1, 2, 3], "parameters": {"max_new_tokens": 190}},
                       needles=("3 prompt + 190 new tokens need 193 KV positions",))
    assert "holds 192" in msg, msg
    assert generate(small, [1, 2, 3], max_new_tokens=189)  # 192: fits exactly
    assert_pool_free(small)


def test_preemption_gives_the_same_tokens(full, small, tiny):
    """16 requests of 3 to 40 prompt tokens and 20 to 60 new tokens, all at
    once: 8 run together and need up to 8 x 7 blocks from a pool of 12."""
    vocab = int(st_util.read_config(tiny)["vocab_size"])
    reqs = [(prompt_ids(vocab, 3 + (i * 7) % 38, 900 + i), 20 + (i * 13) % 41) for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        want = list(ex.map(lambda r: generate(full, r[0], max_new_tokens=r[1]), reqs))
    before = metrics(small)
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda r: generate(small, r[0], max_new_tokens=r[1]), reqs))
    after = metrics(small)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, "request %d: %r, unconstrained %r" % (i, g, w)
    assert msum(after, "ferry_preemptions_total") > msum(before, "ferry_preemptions_total"), \
        "no sequence was preempted: the test did not exhaust the pool"
    # a resumed prefix is counted apart from the prompts, each prompt once
    assert msum(after, "ferry_recomputed_tokens_total") > msum(before, "ferry_recomputed_tokens_total")
    assert msum(after, "ferry_prompt_tokens_total") - msum(before, "ferry_prompt_tokens_total") == \
        sum(len(r[0]) for r in reqs)
    assert msum(after, "ferry_sequences_total", outcome="failed") == msum(before, "ferry_sequences_total",
                                                                          outcome="failed")
    assert assert_pool_free(small) == 12


def test_pool_free_after_cancel_and_disconnect(small):
    # a stream abandoned after its first token
    conn, resp = open_stream(small, [5, 6, 7], max_new_tokens=180)
    assert resp.status == 200
    next(sse_events(resp))
    hang_up(conn)
    # several at once, half of them abandoned
    conns = [open_stream(small, [8 + i, 9, 10], max_new_tokens=100) for i in range(6)]
    for k, (c, r) in enumerate(conns):
        assert r.status == 200
        if k % 2:
            hang_up(c)
    for k, (c, r) in enumerate(conns):
        if k % 2 == 0:
            list(sse_events(r))
            c.close()
    assert assert_pool_free(small) == 12
