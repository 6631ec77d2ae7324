"""The soak's short mode (bench/soak.py --seconds 30): every kind of client
at once - wrk on KServe infer, generate_stream, the OpenAI client streamed
and not, tritonclient's gRPC infer and stream, malformed requests on raw
sockets, clients that disconnect mid-stream and mid-body, an export through
the admin API - against one server with part of its weights on disk. The
script's verdict must pass: the server alive and exiting 0, no failed valid
request, every malformed one answered 4xx or closed, every kind run, KV
blocks back to 0 and descriptors back to their warm-up count. (RSS growth is
judged in runs of 120 s and more: `make soak`, 10 minutes.)"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_short(ferry_bin, tmp_path):
    if not shutil.which("wrk"):
        pytest.fail("wrk not found: `make deps` installs it (Debian package wrk)")
    report = tmp_path / "soak.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--seconds", "30", "--ferry", ferry_bin,
                        "--json", str(report)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    out = p.stdout.decode(errors="replace")
    assert p.returncode == 0, out[-4000:]
    r = json.loads(report.read_text())
    assert r["pass"] and not r["requests_failed"], r
    assert all(r["checks"].values()), r["checks"]
