"""--device cuda where it cannot work: a clean one-line error, exit status 1,
never a crash. On a machine with a GPU (nvidia-smi -L succeeds) the no-GPU
case is skipped: `make test-gpu` covers the backend there.
"""

import os
import shutil
import subprocess

import pytest

from conftest import assert_ferry_error


def _gpu_present():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-L"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _generate_cuda(ferry, d, env=None):
    return ferry.run("generate", "--model", d, "--prompt-ids", "1,2,3", "--max-new-tokens", 2,
                     "--device", "cuda", env=env)


@pytest.mark.skipif(_gpu_present(), reason="a GPU is present: make test-gpu covers --device cuda")
def test_cuda_without_gpu_is_one_line_error(ferry, models):
    # with the CUDA library built: "no CUDA device available (...)";
    # without it: "this build of ferry has no CUDA backend"
    line = assert_ferry_error(_generate_cuda(ferry, models.get("llama")), "cuda", rcs=(1,))
    assert "device 'cuda'" in line


def test_cuda_library_that_cannot_load_is_one_line_error(ferry, models, work):
    bogus = work / "libferry_cuda.so"
    bogus.write_bytes(b"not an ELF file")
    env = dict(os.environ, FERRY_CUDA_LIB=str(bogus))
    line = assert_ferry_error(_generate_cuda(ferry, models.get("llama"), env=env), "cuda", rcs=(1,))
    assert "cannot load" in line
