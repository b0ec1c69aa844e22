"""GPU-side runtime review: the triton and tensorrt backends, the sparse decoder and the engine cache, as far
as a machine without a GPU or TensorRT can run them (the decoder on the kernels' PyTorch twins,
``EDGESDK_KERNELS=reference``; engine directories as the builder leaves them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def broken_torch(tmp_path: Path) -> Path:
    """A directory whose ``torch`` fails to import as a torch wheel built for another CUDA does on a Jetson:
    its import loads the CUDA libraries with ctypes and raises OSError, not ImportError."""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        'raise OSError("libcudnn.so.8: cannot open shared object file: No such file or directory")\n')
    return package.parent


def run_python(code: str, path_first: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``path_first`` ahead of the installed packages."""
    env_path = f"{path_first}:{REPO}"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "HOME": str(path_first)})


# --- a torch that cannot be imported -----------------------------------------------------------


def test_a_torch_that_fails_to_load_is_a_reason_for_the_triton_backend_not_a_traceback(tmp_path):
    """A broken torch raised its OSError out of the triton opener, and the backend chain, which moves on only
    past a RuntimeBackendError, ended 'edgesdk run' there instead of reaching ort-cpu."""
    result = run_python("""
        from types import SimpleNamespace
        from edgesdk.errors import RuntimeBackendError
        from edgesdk.runtime.session import open_backend
        from edgesdk.runtime.triton_backend import open_triton_backend
        bundle = SimpleNamespace(path="b", manifest={"sparse": {"weights": "sparse/weights.safetensors"}},
                                 file=lambda name: name)
        try:
            open_backend(bundle, ["triton"], threads=1)
        except RuntimeBackendError as exc:
            print("CHAIN", exc.problem)
        try:
            open_triton_backend(bundle, threads=1)
        except RuntimeBackendError as exc:
            print("FIX", exc.fix)
        """, broken_torch(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert ("CHAIN no backend could run bundle b: triton: PyTorch is not importable here (OSError: libcudnn.so.8: "
            "cannot open shared object file") in result.stdout
    assert "FIX install the PyTorch build for this board's CUDA" in result.stdout


def test_a_torch_that_fails_to_load_leaves_the_tensorrt_backend_to_cuda_python(tmp_path):
    """The tensorrt backend allocates device memory with torch, else cuda-python. A broken torch's OSError
    skipped cuda-python and reached the opener's catch-all as 'loading engine.plan failed: OSError ...' with
    the fix to rebuild the engine, which was never at fault."""
    result = run_python("""
        from edgesdk.errors import RuntimeBackendError
        from edgesdk.runtime.tensorrt_backend import open_device
        try:
            open_device()
        except RuntimeBackendError as exc:
            print("PROBLEM", exc.problem)
            print("FIX", exc.fix)
        """, broken_torch(tmp_path))
    assert result.returncode == 0, result.stderr
    assert ("PROBLEM no way to allocate CUDA memory from Python: torch cannot be used (OSError: libcudnn.so.8: "
            "cannot open shared object file: No such file or directory); neither torch with CUDA nor cuda-python "
            "is importable") in result.stdout
    assert "FIX pip install cuda-python" in result.stdout


# --- the engine directory ----------------------------------------------------------------------


def test_a_build_cleans_up_leftovers_that_carry_its_own_pid(tmp_path):
    """A build killed while writing (a power cut) leaves .KEY.partial-PID and .KEY.old-PID, removed by the next
    build when PID is not running. A build that ran as the same PID (a container's build is PID 1 or so every
    time; PIDs repeat after a reboot) took them for its own live files: the next one failed with
    FileExistsError on its staging directory, or 'Directory not empty' moving the engine aside, every time."""
    from edgesdk.runtime import tensorrt_engine as te

    out = tmp_path / "engines" / "id" / "key"
    out.mkdir(parents=True)
    (out / te.ENGINE_FILE).write_bytes(b"old plan")
    (out / te.INFO_FILE).write_text("{}")
    for kind in ("partial", "old"):
        left = out.with_name(f".{out.name}.{kind}-{os.getpid()}")
        left.mkdir()
        (left / te.ENGINE_FILE).write_bytes(b"half")
    te._commit(out, b"new plan", {"ok": True})
    assert (out / te.ENGINE_FILE).read_bytes() == b"new plan"
    assert json.loads((out / te.INFO_FILE).read_text()) == {"ok": True}
    assert sorted(p.name for p in out.parent.iterdir()) == ["key"]
