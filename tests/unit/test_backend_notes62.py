"""Which backend ran, said without --stats where it is not the bundle's first choice (edgesdk/runtime/session.py
open_runtime, fallback_line), and the triton backend refused without importing PyTorch where the machine shows no
GPU (edgesdk/runtime/triton_backend.py cuda_device_seen), on real bundles whose runtime chain starts with backends
this host cannot open."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgesdk.runtime.session import fallback_line
from edgesdk.runtime.triton_backend import cuda_device_seen
from tests.unit.test_cli import assert_ok, invoke

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = not cuda_device_seen()
TEXT = "Small language models run on boards at the edge of a network. " * 20


@pytest.fixture(scope="module")
def jetson_chain(tiny_bundle, tmp_path_factory):
    """The tiny bundle asking, as a Jetson bundle does, for tensorrt, then triton, then ort-cpu, with a block-sparse
    record (its weights file a stand-in no backend reaches here), its hashes rewritten to match."""
    out = tmp_path_factory.mktemp("chain") / "b-jet"
    shutil.copytree(tiny_bundle.path, out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    weights = b"\x08\x00\x00\x00\x00\x00\x00\x00{not json"
    (out / "sparse").mkdir()
    (out / "sparse" / "weights.safetensors").write_bytes(weights)
    manifest["files"]["sparse/weights.safetensors"] = {"sha256": hashlib.sha256(weights).hexdigest(),
                                                        "size": len(weights)}
    manifest["sparse"] = {"weights": "sparse/weights.safetensors"}
    manifest["runtime"].update({"backend": "tensorrt", "fallbacks": ["triton", "ort-cpu"]})
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    (out / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    return out


@pytest.fixture
def no_kernel_mode(monkeypatch):
    monkeypatch.delenv("EDGESDK_KERNELS", raising=False)
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)


def _fallback_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("edgesdk: backend ")]


def test_run_says_the_backend_it_fell_back_to_without_stats(jetson_chain, no_kernel_mode):
    """It showed only with --stats: a Jetson bundle on a board without its engine ran at CPU speed without a word."""
    result = invoke("run", jetson_chain, "--prompt", "Hello", "-n", 4, "--threads", 1)
    assert_ok(result)
    lines = _fallback_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgesdk: backend ort-cpu (tensorrt: "), lines[0]
    assert "; triton: " in lines[0]
    if NO_GPU:
        assert "triton: no CUDA device" in lines[0]


def test_a_backend_chosen_with_the_option_is_not_said(jetson_chain, no_kernel_mode):
    result = invoke("run", jetson_chain, "--prompt", "Hello", "-n", 4, "--threads", 1, "--backend", "ort-cpu")
    assert_ok(result)
    assert _fallback_lines(result.stderr) == [], result.stderr
    assert "tensorrt" not in result.stderr


def test_stats_keeps_the_full_notes_and_no_second_line(jetson_chain, no_kernel_mode):
    result = invoke("run", jetson_chain, "--prompt", "Hello", "-n", 4, "--threads", 1, "--stats")
    assert_ok(result)
    assert "edgesdk: tensorrt: " in result.stderr
    assert "edgesdk: ort-cpu: used" in result.stderr
    assert _fallback_lines(result.stderr) == [], result.stderr


def test_eval_says_it_too(jetson_chain, no_kernel_mode, tmp_path):
    """eval's figures are the backend's: one from ort-cpu in place of tensorrt was given without a word."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    result = invoke("eval", jetson_chain, "-f", text, "--context", 32, "--stride", 32, "-t", 1, "--json")
    assert_ok(result)
    lines = _fallback_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edgesdk: backend ort-cpu (tensorrt: "), lines[0]
    json.loads(result.stdout)  # stdout keeps the figures alone
    chosen = invoke("eval", jetson_chain, "-f", text, "--context", 32, "--stride", 32, "-t", 1, "--json",
                    "--backend", "ort-cpu")
    assert_ok(chosen)
    assert _fallback_lines(chosen.stderr) == [], chosen.stderr


def test_the_python_api_keeps_it_in_notes_and_prints_nothing(jetson_chain, no_kernel_mode, capfd):
    import edgesdk

    with edgesdk.load(jetson_chain, threads=1) as model:
        notes = list(model.notes)
    assert "ort-cpu: used" in notes
    assert any(note.startswith("tensorrt: ") for note in notes), notes
    assert capfd.readouterr().err == ""


def test_the_line_names_only_a_fallback():
    assert fallback_line("ort-cpu", ["ort-cpu"], ["ort-cpu: used"]) is None
    assert fallback_line("tensorrt", ["tensorrt", "ort-cpu"], ["tensorrt: used"]) is None
    assert fallback_line("ort-cpu", ["ort-cuda", "ort-cpu"], ["ort-cuda: no CUDA provider", "ort-cpu: used"]) == \
        "backend ort-cpu (ort-cuda: no CUDA provider)"


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU refuses the triton backend before importing torch")
def test_the_triton_refusal_does_not_import_torch(jetson_chain):
    """Probing triton imported PyTorch before learning there was no CUDA device: seconds and ~190 MB more for a run
    that ends on ort-cpu. In a fresh interpreter, as a command runs."""
    script = ("import sys\n"
              "from edgesdk.runtime.session import open_runtime\n"
              f"runtime = open_runtime({str(jetson_chain)!r}, threads=1)\n"
              "print(runtime.backend.name, 'torch' in sys.modules)\n")
    env = {key: value for key, value in os.environ.items() if key not in ("EDGESDK_KERNELS", "EDGESDK_KERNEL_TUNING")}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ort-cpu", "False"], done.stdout + done.stderr
    assert "edgesdk: backend ort-cpu (" in done.stderr
    assert "triton: no CUDA device" in done.stderr


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_an_explicit_triton_backend_is_told_what_is_missing_and_the_fix(jetson_chain, no_kernel_mode):
    """"no CUDA device (the CPU backends are faster here)" read as a preference under --backend triton."""
    result = invoke("run", jetson_chain, "--prompt", "Hello", "-n", 2, "--threads", 1, "--backend", "triton")
    assert result.exit_code != 0
    assert "triton: no CUDA device" in result.stderr
    assert "the Triton kernels run on one" in result.stderr
    assert "faster" not in result.stderr
    assert "EDGESDK_KERNELS=reference to run the kernels' PyTorch reference twin" in result.stderr


def test_a_gpu_is_seen_by_its_device_nodes(tmp_path):
    assert cuda_device_seen(str(tmp_path)) is False
    for node in ("dev/nvidia3", "dev/nvhost-ctrl-gpu", "dev/nvgpu/igpu0/ctrl", "proc/driver/nvidia/gpus"):
        root = tmp_path / node.replace("/", "_")
        (root / node).parent.mkdir(parents=True)
        (root / node).touch()
        assert cuda_device_seen(str(root)) is True, node


def test_the_host_note_reads_a_bundle_for_the_target():
    from edgesdk.board import detect_board
    from edgesdk.runtime.session import check_target

    board = detect_board()
    if board.family != "host":
        pytest.skip("the note is for a board bundle run on a development host")
    note = check_target(SimpleNamespace(target="orin-nx-16gb", path=Path("b-jet")), None, False)
    assert note == f"running a bundle for 'orin-nx-16gb' on a development host ({board.architecture})"
