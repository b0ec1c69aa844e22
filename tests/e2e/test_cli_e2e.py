"""End to end through the installed ``edgesdk`` entry point: build -> verify -> pack -> unpack -> run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EDGESDK = [sys.executable, "-m", "edgesdk.cli"]


def edgesdk(*args, check=True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([*EDGESDK, *map(str, args)], capture_output=True, text=True, timeout=600, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"edgesdk {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr}")
    return result


def test_tiny_model_build_verify_pack_run(tiny_model_dir, tmp_path):
    out = tmp_path / "bundle"
    built = edgesdk("build", "--target", "host", "--model", tiny_model_dir, "--out", out, "--max-context", "128",
                    "--no-progress")
    assert built.stdout.strip() == str(out)
    assert "[3/3] writing bundle" in built.stderr

    assert "ok:" in edgesdk("verify", out, "--target", "host").stdout
    manifest = json.loads(edgesdk("inspect", out, "--json").stdout)
    assert manifest["target"]["name"] == "host"
    assert manifest["graph"]["max_context"] == 128

    archive = tmp_path / "bundle.tar"
    edgesdk("pack", out, archive)
    unpacked = Path(edgesdk("unpack", archive, tmp_path / "board").stdout.strip())
    run = edgesdk("run", unpacked, "--prompt", "The quick brown fox", "-n", "12", "--raw", "--stats")
    assert run.stdout.strip(), "no text generated"
    assert "decode" in run.stderr
    assert "tok/s" in run.stderr

    # A corrupt copy is refused before anything runs.
    broken = tmp_path / "broken"
    shutil.copytree(unpacked, broken)
    data = broken / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    refused = edgesdk("run", broken, "--prompt", "hi", check=False)
    assert refused.returncode != 0
    assert "model.onnx.data" in refused.stderr
    assert refused.stdout == ""


def test_resume_flag_on_a_finished_work_dir(tiny_model_dir, tmp_path):
    out = tmp_path / "b"
    edgesdk("build", "-t", "host", "-m", tiny_model_dir, "-o", out, "--max-context", "64", "--keep-work",
            "--no-progress")
    again = edgesdk("build", "-t", "host", "-m", tiny_model_dir, "-o", out, "--max-context", "64", "--resume",
                    "--no-progress")
    assert "export: done in an earlier run" in again.stderr
    edgesdk("verify", out)
