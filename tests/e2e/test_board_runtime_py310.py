"""The board runtime on Python 3.10 (JetPack 6's Python), installed without torch or transformers.

Creates a fresh virtual environment with the base install only (``pip install .``) and runs a
bundle through it. Skipped where no python3.10 interpreter exists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.network]
REPO = Path(__file__).resolve().parents[2]


def find_python310() -> str | None:
    """A working python3.10: on PATH, or a pyenv install (whose shim may not be active)."""
    candidates = [shutil.which("python3.10"), *map(str, sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")))]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "--version"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.startswith("Python 3.10"):
            return candidate
    return None


@pytest.fixture(scope="module")
def board_venv(tmp_path_factory):
    python310 = find_python310()
    if python310 is None:
        pytest.skip("no python3.10 interpreter on this machine")
    venv = tmp_path_factory.mktemp("py310") / "venv"
    subprocess.run([python310, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(REPO)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-2000:]
    return venv


def test_base_install_has_no_torch(board_venv):
    listing = subprocess.run([str(board_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                             capture_output=True, text=True, check=True).stdout.lower()
    assert "onnxruntime==" in listing
    assert "tokenizers==" in listing
    assert "torch==" not in listing
    assert "transformers==" not in listing


def test_run_and_verify_on_python310(board_venv, tiny_bundle):
    edgesdk = str(board_venv / "bin" / "edgesdk")
    verify = subprocess.run([edgesdk, "verify", str(tiny_bundle.path)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    run = subprocess.run([edgesdk, "run", str(tiny_bundle.path), "--prompt", "The quick brown fox", "--raw",
                          "-n", "8", "--stats"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    assert "decode" in run.stderr
    version = subprocess.run([str(board_venv / "bin" / "python"), "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("Python 3.10")


def test_zlib_weights_bundle_runs_on_python310(board_venv, tiny_model_dir, tmp_path):
    """An INT4 bundle with its weights file DEFLATE-coded runs on the board install: inflated in
    memory where its onnxruntime offers that, through a temporary directory where it does not."""
    pytest.importorskip("torch")
    from tests._utils.builds import build_tiny_bundle

    recipe = ("name: tiny-int4-zlib\nstages: []\n"
              "export: {form: ort-fused, weights: int4, embedding_bits: 8, weights_codec: zlib}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=tiny_model_dir, generated_sequences=0)
    assert "weights" in bundle.manifest["graph"]
    run = subprocess.run([str(board_venv / "bin" / "edgesdk"), "run", str(bundle.path), "--prompt", "The quick",
                          "--raw", "-n", "4"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


def test_serve_on_python310(board_venv, tiny_bundle):
    """``edgesdk serve`` from the base install on Python 3.10: one chat answer over HTTP, then SIGTERM."""
    import http.client
    import json
    import signal

    process = subprocess.Popen([str(board_venv / "bin" / "edgesdk"), "serve", str(tiny_bundle.path), "--port", "0",
                                "--quiet"], stderr=subprocess.PIPE, text=True)
    try:
        address = next((line.split(" on http://", 1)[1].split("/v1", 1)[0] for line in process.stderr
                        if " on http://" in line), None)
        assert address, "the server never said where it listens"
        host, port = address.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": "The quick brown fox"}], "max_tokens": 4}))
        response = connection.getresponse()
        answer = json.loads(response.read())
        connection.close()
        assert response.status == 200, answer
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def test_python_api_on_python310(board_venv, tiny_bundle):
    """``edgesdk.load`` from the base install on Python 3.10: a chat answer whole and streamed, and an embedding,
    no torch."""
    script = ("import json, sys, edgesdk\n"
              f"with edgesdk.load({str(tiny_bundle.path)!r}, threads=1) as model:\n"
              "    whole = model.create_chat_completion([{'role': 'user', 'content': 'Hi'}], max_tokens=3)\n"
              "    chunks = list(model('The quick', max_tokens=3, stream=True))\n"
              "    vector = model.embed('The quick', normalize=True)\n"
              "print(json.dumps([whole['object'], chunks[-1]['choices'][0]['finish_reason'],\n"
              "                  sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')),\n"
              "                  sum(value * value for value in vector)]))\n")
    done = subprocess.run([str(board_venv / "bin" / "python"), "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    obj, finish, heavy, squared_norm = json.loads(done.stdout)
    assert obj == "chat.completion"
    assert squared_norm == pytest.approx(1.0, rel=1e-5)
    assert finish in ("stop", "length")
    assert heavy == []
