"""Text beside the OpenAI API: Triton's generate extension with
text_input/text_output (whole and streamed), llama.cpp's /tokenize and
/detokenize, `ferry generate --prompt`, `ferry chat` fed from a pipe, and
`ferry mkmodel --tokenizer`.

References: HF tokenizers (encode/decode), Python jinja2 (chat templates),
and `ferry generate --prompt-ids` for the greedy ids of a prompt.
"""

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import RUN_TIMEOUT, assert_ferry_error, wait_until
from test_http import jreq, request, serve
from test_http import request as http_request
from text_util import (DEMO_TOKENIZER, chat_tokenizer_dir, greedy_text, hf_render, hf_tokenizer, stop_ids,
                       text_model, tokenizer_dir)


@pytest.fixture(scope="module")
def tdir(tmp_path_factory):
    return tmp_path_factory.mktemp("text")


@pytest.fixture(scope="module")
def m_l2(ferry, tdir):
    return text_model(ferry, tdir / "l2", tokenizer_dir("llama-spm"), seed=21)


@pytest.fixture(scope="module")
def m_demo(ferry, tdir):
    return text_model(ferry, tdir / "demo", DEMO_TOKENIZER, seed=22)


@pytest.fixture(scope="module")
def m_qchat(ferry, tdir):
    return text_model(ferry, tdir / "qchat", chat_tokenizer_dir(tdir / "qchat-tok"), seed=23)


@pytest.fixture(scope="module")
def srv_l2(ferry_bin, m_l2):
    yield from serve(ferry_bin, m_l2, "--batch", 4, name="l2")


@pytest.fixture(scope="module")
def srv_demo(ferry_bin, m_demo):
    yield from serve(ferry_bin, m_demo, "--batch", 4, name="demo")


@pytest.fixture(scope="module")
def srv_bare(ferry_bin, models):
    yield from serve(ferry_bin, models.get("llama", seed=24), "--batch", 2, name="bare")


# --------------------------------------------------------------------------
# Triton's generate extension with text
# --------------------------------------------------------------------------

PROMPTS = ["Hello there", "The ferry leaves at 9:30 from pier 4.", "naïve café, 東京 🚢"]


@pytest.mark.parametrize("which", ["l2", "demo"])
def test_generate_text_input(request, ferry, which):
    srv = request.getfixturevalue("srv_" + which)
    model = request.getfixturevalue("m_" + which)
    for prompt in PROMPTS:
        st, obj = jreq(srv, "POST", "/v2/models/%s/generate" % srv.name,
                       {"text_input": prompt, "parameters": {"max_new_tokens": 10}})
        assert st == 200, obj
        want, ids = greedy_text(ferry, model, hf_tokenizer(model).encode(prompt).ids, 10)
        assert obj["text_output"] == want, (prompt, obj, ids)
        assert obj["model_name"] == srv.name and obj["finish_reason"] in ("stop", "length")
        # streamed: text deltas whose concatenation is the whole text
        st, hdrs, data = http_request(srv, "POST", "/v2/models/%s/generate_stream" % srv.name,
                                 {"text_input": prompt, "parameters": {"max_new_tokens": 10}})
        assert st == 200 and hdrs["content-type"].startswith("text/event-stream")
        events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: ")]
        assert "".join(e["text_output"] for e in events) == want, events
        assert events[-1]["finish_reason"] == obj["finish_reason"]
        assert all("finish_reason" not in e for e in events[:-1])
        assert len(events) >= 2 or len(ids) <= 1, "a stream of %d tokens in %d events" % (len(ids), len(events))


def test_generate_stream_stops_at_a_stop_string(srv_demo, m_demo, ferry):
    prompt = "The pipeline fetches"
    want, ids = greedy_text(ferry, m_demo, hf_tokenizer(m_demo).encode(prompt).ids, 30)
    stop = want[len(want) // 2:len(want) // 2 + 3]
    if not stop.strip():
        pytest.fail("pick another prompt: the stop string would be blank (%r)" % want)
    before = want[:want.index(stop)]
    st, obj = jreq(srv_demo, "POST", "/v2/models/demo/generate",
                   {"text_input": prompt, "parameters": {"max_new_tokens": 30, "stop": [stop]}})
    assert st == 200 and obj["text_output"] == before and obj["finish_reason"] == "stop", (obj, stop)
    st, hdrs, data = http_request(srv_demo, "POST", "/v2/models/demo/generate_stream",
                             {"text_input": prompt, "parameters": {"max_new_tokens": 30, "stop": stop}})
    events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e.startswith("data: ")]
    assert "".join(e["text_output"] for e in events) == before and events[-1]["finish_reason"] == "stop"


def test_generate_ids_form_unchanged(srv_demo):
    st, obj = jreq(srv_demo, "POST", "/v2/models/demo/generate", {"input_ids": [5, 6, 7],
                                                                 "parameters": {"max_new_tokens": 3}})
    assert st == 200 and len(obj["output_ids"]) == 3 and "text_output" not in obj


@pytest.mark.parametrize("body,needle", [
    ({"text_input": 5}, "text_input"),
    ({"text_input": "hi", "input_ids": [1]}, "text_input"),
    ({"input_ids": [1, 2], "parameters": {"stop": "x"}}, "stop"),
    ({"text_input": "hi", "parameters": {"stop": 3}}, "stop"),
    ({"text_input": "hi", "parameters": {"max_new_tokens": 100000}}, "context"),
])
def test_generate_text_400(srv_demo, body, needle):
    for ep in ("generate", "generate_stream"):
        st, obj = jreq(srv_demo, "POST", "/v2/models/demo/" + ep, body)
        assert st == 400 and isinstance(obj.get("error"), str) and needle in obj["error"], (ep, st, obj)


def test_text_without_tokenizer(srv_bare):
    for ep in ("generate", "generate_stream"):
        st, obj = jreq(srv_bare, "POST", "/v2/models/bare/" + ep, {"text_input": "hi"})
        assert st == 400 and "tokenizer.json" in obj["error"], obj
    for path, body in (("/tokenize", {"content": "hi"}), ("/detokenize", {"tokens": [1, 2]})):
        st, obj = jreq(srv_bare, "POST", path, body)
        assert st == 400 and "tokenizer.json" in obj["error"], obj


# --------------------------------------------------------------------------
# /tokenize and /detokenize
# --------------------------------------------------------------------------

TEXTS = ["Hello world", "  leading spaces and\ttabs\n\nnew lines", "naïve café 東京 🚢", "<s>special</s> text",
         "<|im_start|>user\nhi<|im_end|>", "", "1234567 + 89 = ?"]


@pytest.mark.parametrize("which", ["l2", "demo"])
def test_tokenize_matches_hf(request, which):
    srv = request.getfixturevalue("srv_" + which)
    tok = hf_tokenizer(request.getfixturevalue("m_" + which))
    for text in TEXTS:
        for add_special in (False, True):
            st, obj = jreq(srv, "POST", "/tokenize", {"content": text, "add_special": add_special})
            assert st == 200, obj
            assert obj["tokens"] == tok.encode(text, add_special_tokens=add_special).ids, (text, add_special, obj)
        st, obj = jreq(srv, "POST", "/tokenize", {"content": text})  # add_special defaults to false
        assert obj["tokens"] == tok.encode(text, add_special_tokens=False).ids
        ids = tok.encode(text, add_special_tokens=True).ids
        st, obj = jreq(srv, "POST", "/detokenize", {"tokens": ids})
        assert st == 200 and obj["content"] == tok.decode(ids, skip_special_tokens=False), (text, obj)


def test_tokenize_400(srv_demo):
    for path, body in (("/tokenize", {"content": 5}), ("/tokenize", {}), ("/tokenize", {"content": "x", "add_special": 1}),
                       ("/detokenize", {"tokens": "1,2"}), ("/detokenize", {"tokens": [1, 1 << 40]}),
                       ("/detokenize", {"tokens": [99999]})):
        st, obj = jreq(srv_demo, "POST", path, body)
        assert st == 400 and isinstance(obj.get("error"), str), (path, body, st, obj)
    st, obj = jreq(srv_demo, "GET", "/tokenize")
    assert st == 405


# --------------------------------------------------------------------------
# the CLI
# --------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["l2", "demo"])
def test_generate_prompt(request, ferry, which):
    model = request.getfixturevalue("m_" + which)
    prompt = PROMPTS[1]
    want, ids = greedy_text(ferry, model, hf_tokenizer(model).encode(prompt).ids, 12)
    p = ferry.check("generate", "--model", model, "--prompt", prompt, "--max-new-tokens", 12)
    assert p.stdout.decode() == want + "\n"
    p = ferry.check("generate", "--model", model, "--prompt", prompt, "--max-new-tokens", 12, "--json")
    obj = json.loads(p.stdout)
    assert obj["output_ids"] == ids and obj["text"] == want
    assert obj["finish_reason"] == ("stop" if ids[-1] in stop_ids(model) else "length")


def test_generate_prompt_ids_json_has_text(ferry, m_demo, models):
    ids = [5, 6, 7]
    p = ferry.check("generate", "--model", m_demo, "--prompt-ids", "5,6,7", "--max-new-tokens", 6, "--json")
    obj = json.loads(p.stdout)
    assert obj["text"] == hf_tokenizer(m_demo).decode(obj["output_ids"], skip_special_tokens=True)
    p = ferry.check("generate", "--model", m_demo, "--prompt-ids", "5,6,7;8,9", "--max-new-tokens", 4, "--json")
    obj = json.loads(p.stdout)
    assert len(obj["text"]) == 2 and obj["text"][1] == hf_tokenizer(m_demo).decode(obj["output_ids"][1])
    # a model without a tokenizer: ids only, as before
    bare = models.get("llama", seed=24)
    obj = json.loads(ferry.check("generate", "--model", bare, "--prompt-ids", ",".join(map(str, ids)),
                                 "--max-new-tokens", 2, "--json").stdout)
    assert "text" not in obj and len(obj["output_ids"]) == 2


def test_generate_prompt_errors(ferry, m_demo, models):
    assert_ferry_error(ferry.run("generate", "--model", models.get("llama", seed=24), "--prompt", "hi"),
                       ["tokenizer.json"])
    assert_ferry_error(ferry.run("generate", "--model", m_demo, "--prompt", "hi", "--prompt-ids", "1"),
                       ["--prompt"], rcs=(2,))
    assert_ferry_error(ferry.run("generate", "--model", m_demo), ["--prompt"], rcs=(2,))


def chat(ferry, model, stdin, *flags):
    argv = [ferry.path, "chat", "--model", str(model)] + [str(f) for f in flags]
    try:
        return subprocess.run(argv, input=stdin if isinstance(stdin, bytes) else stdin.encode(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail("ferry chat timed out: %s" % " ".join(argv))


@pytest.mark.parametrize("which", ["qchat", "demo"])
def test_chat_from_a_pipe_keeps_history(request, ferry, which):
    model = request.getfixturevalue("m_" + which)
    p = chat(ferry, model, "Hello there\nAnd a second \\\nline, continued\n", "--max-new-tokens", 8, "--json",
             "--system", "Be brief.")
    assert p.returncode == 0, p.stderr.decode()
    turns = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert len(turns) == 2, turns
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert turns[0]["prompt"] == hf_render(model, msgs)
    tok = hf_tokenizer(model)
    ids = tok.encode(turns[0]["prompt"], add_special_tokens=False).ids
    assert turns[0]["prompt_tokens"] == len(ids)
    want, gen = greedy_text(ferry, model, ids, 8)
    assert turns[0]["output_ids"] == gen and turns[0]["text"] == want
    # the second prompt holds the first answer: the history is kept
    msgs += [{"role": "assistant", "content": turns[0]["text"]},
             {"role": "user", "content": "And a second \nline, continued"}]
    assert turns[1]["prompt"] == hf_render(model, msgs)
    assert turns[0]["text"] in turns[1]["prompt"]
    ids = tok.encode(turns[1]["prompt"], add_special_tokens=False).ids
    want, gen = greedy_text(ferry, model, ids, 8)
    assert turns[1]["output_ids"] == gen and turns[1]["text"] == want


def test_chat_text_output(ferry, m_demo):
    """Without --json the answers stream to stdout, one per turn; an empty
    line sends nothing; after /clear the same message gets the same (greedy)
    answer."""
    j = chat(ferry, m_demo, "Hi\n", "--max-new-tokens", 6, "--json")
    answer = json.loads(j.stdout)["text"]
    p = chat(ferry, m_demo, "Hi\n\n/clear\nHi\n", "--max-new-tokens", 6)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode() == answer + "\n" + answer + "\n"


def test_chat_refuses_a_message_it_cannot_send(ferry, m_demo):
    """A NUL byte or invalid UTF-8 in a typed message is refused by name and
    the conversation goes on (the history stays parseable)."""
    j = chat(ferry, m_demo, "Hi\n", "--max-new-tokens", 6, "--json")
    answer = json.loads(j.stdout)["text"]
    p = chat(ferry, m_demo, b"a\x00b\nbad \xff\xfe\nHi\n", "--max-new-tokens", 6)
    assert p.returncode == 0, p.stderr.decode()
    err = p.stderr.decode()
    assert "holds a NUL byte: not sent" in err and "not valid UTF-8: not sent" in err, err
    assert p.stdout.decode() == answer + "\n"


def sigint_caught(proc):
    """Whether the process has its SIGINT handler (until then SIGINT ends it)."""
    assert proc.poll() is None, "ferry chat exited (rc=%d): %s" % (proc.returncode, proc.stderr.read().decode())
    with open("/proc/%d/status" % proc.pid) as f:
        caught = [int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:")]
    return bool(caught and caught[0] & (1 << (signal.SIGINT - 1)))


def test_chat_ctrl_c_stops_the_answer_not_the_program(ferry, tdir):
    """SIGINT while an answer is being written ends that answer (the prompt
    comes back, the partial answer stays in the history); EOF then exits 0."""
    slow = text_model(ferry, tdir / "slow", DEMO_TOKENIZER, preset="small", seed=25, extra=("--layers", 8))
    flags = ["--max-memory", "device=0,host=0", "--offload-dir", str(tdir / "slow-offload")]
    p = chat(ferry, slow, "warm up\n", "--max-new-tokens", 1, *flags)  # writes the offload blobs: loads fast next
    assert p.returncode == 0, p.stderr.decode()
    proc = subprocess.Popen([ferry.path, "chat", "--model", str(slow), "--max-new-tokens", "1500", "--json"] + flags,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pending = [b""]  # what stdout has said past the last whole line

    def interrupted_turn(message):
        """Sends message, then SIGINT every 0.1 s until the turn's JSON line
        comes out (an answer of 1500 tokens streamed from disk would take
        tens of seconds). --json writes nothing while it answers: that line
        is the one sign of the answer. A SIGINT before the answer starts
        stops nothing (the answer clears the flag; at the prompt, with
        nothing half-typed, it drops nothing), and one before the handler is
        in place would end the program: the signals start once /proc shows
        the handler."""
        proc.stdin.write(message)
        proc.stdin.flush()
        wait_until(lambda: sigint_caught(proc), lambda: "ferry chat never caught SIGINT (rc=%r)" % proc.poll())
        deadline = time.monotonic() + RUN_TIMEOUT
        while b"\n" not in pending[0]:
            assert time.monotonic() < deadline, "no answer within %ss: %r" % (RUN_TIMEOUT, pending[0][-300:])
            proc.send_signal(signal.SIGINT)
            if select.select([proc.stdout], [], [], 0.1)[0]:
                got = os.read(proc.stdout.fileno(), 1 << 16)
                assert got, "ferry chat exited (rc=%r): %s" % (proc.wait(), proc.stderr.read().decode())
                pending[0] += got
        line, _, pending[0] = pending[0].partition(b"\n")
        return json.loads(line)

    try:
        turns = [interrupted_turn(b"Tell me everything\n")]
        # a SIGINT that came before the first token leaves an empty answer: again, up to 5 turns
        while not turns[-1]["output_ids"] and len(turns) < 5:
            turns.append(interrupted_turn(b"Tell me more\n"))
        turns.append(interrupted_turn(b"Hi\n"))
        proc.stdin.close()
        rest = proc.stdout.read()  # until the program exits (a hang is the test's timeout)
        err = proc.stderr.read()
        proc.wait(RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()
    assert pending[0] + rest == b"", (pending[0] + rest)[:300]
    stopped = turns[-2]
    assert stopped["output_ids"], turns
    assert stopped["finish_reason"] == "cancelled" and len(stopped["output_ids"]) < 1500, stopped
    assert stopped["text"] in turns[-1]["prompt"]


def test_chat_errors(ferry, models, m_l2):
    assert_ferry_error(chat(ferry, models.get("llama", seed=24), "hi\n"), ["tokenizer.json"])
    # Llama 2's tokenizer_config has no chat template
    assert_ferry_error(chat(ferry, m_l2, "hi\n"), ["chat template"])


def test_mkmodel_tokenizer(ferry, tdir, m_demo, m_l2):
    for model, src in ((m_demo, DEMO_TOKENIZER), (m_l2, tokenizer_dir("llama-spm"))):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            assert (Path(model) / f).read_bytes() == (Path(src) / f).read_bytes()
        cfg = json.loads((Path(model) / "config.json").read_text())
        tok = hf_tokenizer(src)
        assert cfg["vocab_size"] == tok.get_vocab_size(with_added_tokens=True)
        gc = json.loads((Path(model) / "generation_config.json").read_text())
        tcfg = json.loads((Path(src) / "tokenizer_config.json").read_text())
        eos = tcfg["eos_token"] if isinstance(tcfg["eos_token"], str) else tcfg["eos_token"]["content"]
        assert gc["eos_token_id"] == tok.token_to_id(eos) == cfg["eos_token_id"]
    p = ferry.run("mkmodel", "--out", tdir / "none", "--tokenizer", tdir / "no-such-dir")
    assert_ferry_error(p, ["tokenizer"])
    assert not (tdir / "none").exists()


def test_override_generation_config(ferry, ferry_bin, m_qchat, tmp_path):
    """--override-generation-config sets the defaults of requests that leave
    them out (as vLLM's): with temperature 0 a chat request naming none is
    greedy - the answer of temperature 0, every time; a malformed override
    stops the server naming the field."""
    body = {"model": "qchat", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12}
    for srv in serve(ferry_bin, m_qchat, "--batch", 2, "--override-generation-config", '{"temperature": 0}', name="qchat"):
        greedy = dict(body, temperature=0)
        status, _, raw = request(srv, "POST", "/v1/chat/completions", greedy)
        assert status == 200, raw
        want = json.loads(raw)["choices"][0]["message"]["content"]
        for _ in range(3):
            status, _, raw = request(srv, "POST", "/v1/chat/completions", body)
            assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == want, raw
    for bad, field in [('{"temperature": "x"}', "temperature"), ('{"top_p": 2}', "top_p"), ("[1]", "an object"),
                       ("{", "--override-generation-config")]:
        p = ferry.run("serve", "--model", m_qchat, "--http-port", 0, "--grpc-port", 0, "--admin-port", 0,
                      "--override-generation-config", bad, timeout=60)
        err = p.stderr.decode()
        assert p.returncode == 1 and "--override-generation-config" in err and field in err, (bad, err)
