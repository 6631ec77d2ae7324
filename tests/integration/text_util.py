"""Helpers shared by the text tests (test_openai.py, test_text_http.py,
test_text_infer.py): the reference tokenizers and chat templates, and the
checkpoints with a tokenizer they serve.

References: HF `tokenizers` (the Rust library transformers uses) for
encoding and decoding, Python jinja2 with transformers' environment for
chat templates. The tokenizers are those `make deps` builds from llama.cpp's
vocabularies into build/ref/tokenizers (refdata.py: tokenizer_dir("llama-spm")
is Llama 2's) and config/demo-tokenizer (in the repository); the chat
templates are llama.cpp's models/templates (refdata.template).
"""

import json
import shutil
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
from tokenizers import Tokenizer

from refdata import template, tokenizer_dir  # noqa: F401 (tokenizer_dir: for the tests)

REPO = Path(__file__).resolve().parents[2]
DEMO_TOKENIZER = REPO / "config" / "demo-tokenizer"

_HF = {}


def hf_tokenizer(model_dir):
    """HF tokenizers on model_dir/tokenizer.json (read once)."""
    path = str(Path(model_dir) / "tokenizer.json")
    if path not in _HF:
        _HF[path] = Tokenizer.from_file(path)
    return _HF[path]


def tokenizer_config(model_dir):
    return json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))


def _token_str(v):
    if isinstance(v, dict):
        return v.get("content", "")
    return v or ""


def hf_render(model_dir, messages, add_generation_prompt=True):
    """The chat prompt as transformers' apply_chat_template(tokenize=False) renders it."""
    cfg = tokenizer_config(model_dir)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(cfg["chat_template"]).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=_token_str(cfg.get("bos_token")), eos_token=_token_str(cfg.get("eos_token")))


def hf_chat_ids(model_dir, messages):
    """apply_chat_template(tokenize=True): rendered, then encoded without
    adding special tokens (the template wrote them)."""
    return hf_tokenizer(model_dir).encode(hf_render(model_dir, messages), add_special_tokens=False).ids


def stop_ids(model_dir):
    """The ids the text endpoints stop at: generation_config's eos and the tokenizer's eos."""
    ids = set()
    gc = Path(model_dir) / "generation_config.json"
    if gc.exists():
        e = json.loads(gc.read_text()).get("eos_token_id")
        if isinstance(e, list):
            ids |= set(e)
        elif e is not None:
            ids.add(e)
    eos = _token_str(tokenizer_config(model_dir).get("eos_token"))
    if eos:
        t = hf_tokenizer(model_dir).token_to_id(eos)
        if t is not None:
            ids.add(t)
    return ids


def until_stop(ids, stops):
    """The ids a text endpoint generates where `ferry generate --prompt-ids`
    (which has no stop ids) went on: up to and including the first stop id."""
    for i, t in enumerate(ids):
        if t in stops:
            return ids[:i + 1]
    return list(ids)


def greedy_text(ferry, model, prompt_ids, n):
    """(text, ids): what a greedy text endpoint must answer for prompt_ids -
    `ferry generate --prompt-ids`' ids up to the first end-of-sequence id,
    decoded by HF tokenizers (special tokens skipped)."""
    out, _ = ferry.generate(model, prompt_ids, n)
    ids = until_stop(out, stop_ids(model))
    return hf_tokenizer(model).decode(ids, skip_special_tokens=True), ids


def chat_tokenizer_dir(dst):
    """Llama 2's tokenizer (llama-spm) with ChatML's control tokens added
    (special, as Qwen's) and the Qwen2.5 chat template: a chat model whose
    template's control tokens are real ids."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    src = tokenizer_dir("llama-spm")
    tj = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    for i, content in enumerate(["<|im_start|>", "<|im_end|>"]):
        tj["added_tokens"].append({"id": 32000 + i, "content": content, "single_word": False, "lstrip": False,
                                   "rstrip": False, "normalized": False, "special": True})
    (dst / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg["chat_template"] = template("Qwen-Qwen2.5-7B-Instruct.jinja")
    cfg["eos_token"] = "<|im_end|>"
    cfg["add_bos_token"] = False
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
    return dst


def text_model(ferry, out, tokenizer_dir, arch="llama", preset="tiny", seed=5, extra=()):
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    ferry.check("mkmodel", "--out", out, "--arch", arch, "--preset", preset, "--seed", seed,
                "--tokenizer", tokenizer_dir, *extra)
    return out
