"""The board runtime needs no torch and no transformers.

Each check runs the CLI in a fresh interpreter whose import system refuses ``torch`` and
``transformers`` (and their submodules), as on a board where only the base install exists.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._utils.tiny import CORPUS

HOST_ONLY = ("torch", "transformers")

BLOCKER = textwrap.dedent(
    f"""
    import sys

    BLOCKED = {HOST_ONLY!r}

    class BlockHostOnly:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {{name!r}} (blocked by test_lean_import)")
            return None

    sys.meta_path.insert(0, BlockHostOnly())
    for name in list(sys.modules):
        assert name.split(".")[0] not in BLOCKED, name
    """
)

RUN_CLI = BLOCKER + textwrap.dedent(
    """
    from edgesdk.cli import main

    main(sys.argv[1:], prog_name="edgesdk")
    """
)


def run_blocked(*args, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``edgesdk ARGS`` in a fresh interpreter that cannot import torch or transformers."""
    return subprocess.run([sys.executable, "-c", RUN_CLI, *[str(a) for a in args]], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.fixture
def bundle(tiny_bundle, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join(CORPUS), encoding="utf-8")
    return path


def test_blocker_really_blocks(tmp_path):
    """Guard for the checks below: the blocked interpreter cannot import torch or transformers."""
    code = BLOCKER + textwrap.dedent(
        """
        for name in ("torch", "transformers", "torch.nn", "transformers.models.llama"):
            try:
                __import__(name)
            except ImportError:
                continue
            raise SystemExit(f"{name} was importable")
        import numpy, onnxruntime, tokenizers  # the base install still works
        print("blocked")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert_ok(proc)
    assert proc.stdout.strip() == "blocked"


@pytest.mark.parametrize("module", ["edgesdk", "edgesdk.cli"])
def test_import_is_lean(module, tmp_path):
    """Importing the package (or the CLI module) pulls in no heavy dependency."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import {module}
        heavy = ("torch", "transformers", "onnxruntime")
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert_ok(proc)
    assert json.loads(proc.stdout) == []


def test_run_without_host_dependencies(bundle, tmp_path):
    proc = run_blocked("run", bundle, "--prompt", "hello", "-n", 4, cwd=tmp_path)
    assert_ok(proc)
    assert len(proc.stdout) > 1  # generated text, then the closing newline
    assert proc.stdout.endswith("\n")


def test_run_raw_with_stats_without_host_dependencies(bundle, tmp_path):
    proc = run_blocked("run", bundle, "--prompt", "hello", "-n", 4, "--raw", "--stats", cwd=tmp_path)
    assert_ok(proc)
    assert proc.stdout.strip()  # visible text
    assert "tok/s" in proc.stderr


def test_interactive_run_without_host_dependencies(bundle, tmp_path):
    proc = subprocess.run([sys.executable, "-c", RUN_CLI, "run", str(bundle), "-n", "3", "--raw"], cwd=tmp_path,
                          input="hello\nworld\n", capture_output=True, text=True, timeout=120)
    assert_ok(proc)
    assert len(proc.stdout.splitlines()) == 2


def test_verify_without_host_dependencies(bundle, tmp_path):
    proc = run_blocked("verify", bundle, "--target", "host", cwd=tmp_path)
    assert_ok(proc)
    assert proc.stdout.startswith("ok:")


def test_inspect_without_host_dependencies(bundle, tmp_path):
    proc = run_blocked("inspect", bundle, cwd=tmp_path)
    assert_ok(proc)
    assert "target     host" in proc.stdout
    assert "model.onnx.data" in proc.stdout


def test_targets_list_without_host_dependencies(tmp_path):
    proc = run_blocked("targets", "list", cwd=tmp_path)
    assert_ok(proc)
    assert len(proc.stdout.strip().splitlines()) == 10


def test_env_without_host_dependencies(tmp_path):
    proc = run_blocked("env", "--json", cwd=tmp_path)
    assert_ok(proc)
    info = json.loads(proc.stdout)
    assert "CPUExecutionProvider" in info["onnxruntime_providers"]
    text = run_blocked("env", cwd=tmp_path)
    assert_ok(text)
    assert "board:" in text.stdout


def test_eval_without_host_dependencies(bundle, text_file, tmp_path):
    proc = run_blocked("eval", bundle, "--text", text_file, "--max-chars", 2000, "--context", 32, "--stride", 32,
                       "--json", cwd=tmp_path)
    assert_ok(proc)
    assert json.loads(proc.stdout)["bundle"]["perplexity"] > 1


def test_eval_reference_without_host_dependencies_says_how_to_fix(bundle, text_file, tmp_path):
    proc = run_blocked("eval", bundle, "--text", text_file, "--max-chars", 2000, "--context", 32, "--stride", 32,
                       "--reference", cwd=tmp_path)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "--reference" in proc.stderr
    assert "torch" in proc.stderr
    assert "fix:" in proc.stderr
    assert "pip install 'edgesdk[host]'" in proc.stderr
    assert proc.stdout == ""  # refused before scoring anything


def test_corrupt_bundle_is_refused_before_onnxruntime_loads(bundle, tmp_path):
    """Verification comes first: a corrupt bundle is refused without even importing onnxruntime."""
    code = RUN_CLI.replace("BLOCKED = ", "BLOCKED = ('onnxruntime',) + ")
    command = [sys.executable, "-c", code, "run", str(bundle), "--prompt", "hi", "-n", "2"]
    # Control: the intact bundle does reach onnxruntime, so this interpreter cannot run it.
    control = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert control.returncode != 0
    assert "onnxruntime" in control.stderr

    data = bytearray((bundle / "model.onnx.data").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "model.onnx.data").write_bytes(bytes(data))
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "failed verification" in proc.stderr
    assert "model.onnx.data" in proc.stderr
    assert "fix:" in proc.stderr
