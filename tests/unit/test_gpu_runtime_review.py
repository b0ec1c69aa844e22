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

import pytest

from tests._utils.tensorrt_standin import TensorRTModule

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
        from edgesdk.runtime import triton_backend
        from edgesdk.runtime.session import open_backend
        from edgesdk.runtime.triton_backend import open_triton_backend
        triton_backend.cuda_device_seen = lambda root="/": True  # a Jetson: its GPU device node is there
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


# --- the sparse decoder on the kernels' PyTorch twins --------------------------------------------


@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    """(model, tensors, record): a tiny Llama on the per-row INT8 grid exported block-sparse, max_context 300
    (past the decoder's first cache capacity of 256, so a long sequence grows the cache)."""
    pytest.importorskip("torch")
    from tests._utils.tiny import export_tiny_sparse

    return export_tiny_sparse(tmp_path_factory.mktemp("sparse"), max_context=300)


def twin_backend(tiny_sparse):
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    _, tensors, record = tiny_sparse
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


def test_a_second_generation_after_a_long_first_one_matches_a_fresh_backend(tiny_sparse):
    """reset() keeps the grown cache and its stale rows; the next request must read none of them."""
    import numpy as np

    from edgesdk.runtime.generate import SamplingConfig, generate

    rng = np.random.default_rng(0)
    long_prompt, prompt = rng.integers(3, 320, 280).tolist(), rng.integers(3, 320, 9).tolist()
    used = twin_backend(tiny_sparse)
    first, stats = generate(used, long_prompt, SamplingConfig(max_new_tokens=50), stop_ids=set())
    assert (len(first), stats.stop_reason, used.decoder.capacity) == (21, "max_context", 300)
    second, _ = generate(used, prompt, SamplingConfig(max_new_tokens=12), stop_ids=set())
    fresh = twin_backend(tiny_sparse)
    assert second == generate(fresh, prompt, SamplingConfig(max_new_tokens=12), stop_ids=set())[0]
    for backend in (used, fresh):
        backend.reset()
    np.testing.assert_array_equal(used.prefill(np.array(prompt), keep_logits=9),
                                  fresh.prefill(np.array(prompt), keep_logits=9))
    for token in second[:4]:
        np.testing.assert_array_equal(used.decode(token), fresh.decode(token))


def test_the_cache_grows_to_max_context_and_a_prompt_of_exactly_max_context_runs(tiny_sparse):
    """Decode steps past the first capacity (256) grow the cache keeping its rows; a prompt of max_context
    tokens fills it in one prefill; both match the model, and a token past max_context is refused."""
    import numpy as np
    import torch

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.generate import SamplingConfig, generate

    model = tiny_sparse[0]
    prompt = np.random.default_rng(1).integers(3, 320, 300)
    with torch.no_grad():
        expected = model(torch.as_tensor(prompt)[None]).logits[0].numpy()
    atol = 1e-2  # the float16 embedding: about 2e-3 apart; a cache that lost its rows on growing: 5e-2
    backend = twin_backend(tiny_sparse)
    backend.prefill(prompt[:250])
    stepped = np.stack([backend.decode(int(token)) for token in prompt[250:]])
    assert (backend.position, backend.decoder.capacity) == (300, 300)
    np.testing.assert_allclose(stepped, expected[250:], atol=atol)
    with pytest.raises(RuntimeBackendError, match="sequence of 301 tokens exceeds the bundle's max_context 300"):
        backend.decode(5)
    backend.reset()
    np.testing.assert_allclose(backend.prefill(prompt, keep_logits=4), expected[-4:], atol=atol)
    tokens, stats = generate(backend, prompt.tolist(), SamplingConfig(max_new_tokens=8), stop_ids=set())
    assert (len(tokens), stats.stop_reason) == (1, "max_context")


# --- the tensorrt backend, on a stand-in for TensorRT (not installed here) --------------------------


class StandInTensorRT(TensorRTModule):
    """The part of the ``tensorrt`` module TensorRTBackend uses, for an engine of the standard decoder graph
    (``deserialize_cuda_engine`` gives None for a plan TensorRT cannot read). Real engines:
    tests/gpu/test_tensorrt.py."""

    def __init__(self, graph: dict, readable: bool = True):
        from edgesdk.runtime import tensorrt_engine as te

        names = te.io_names(graph)
        inputs, outputs = [names["ids"], names["keep"], *names["past"]], [names["logits"], *names["present"]]
        modes = {**dict.fromkeys(inputs, self.TensorIOMode.INPUT), **dict.fromkeys(outputs, self.TensorIOMode.OUTPUT)}
        dtypes = {name: "float32" for name in modes} | {names["ids"]: "int64", names["keep"]: "int64"}

        class Engine:
            num_io_tensors = len(modes)

            def create_execution_context(self):
                return object()

            def get_tensor_name(self, index):
                return list(modes)[index]

            def get_tensor_mode(self, name):
                return modes[name]

            def get_tensor_profile_shape(self, name, profile):
                return [(1, 1), (1, 1), (1, 4)]

            def get_tensor_dtype(self, name):
                return dtypes[name]

            def is_shape_inference_io(self, name):
                return name == names["keep"]

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, plan: bytes):
                return Engine() if readable else None

        self.Runtime = Runtime


class CountingDevice:
    """Device memory as cuda-python gives it: each buffer lives until close() frees it; ``fail_at`` makes that
    allocation fail as cudaMalloc does when the GPU's memory is taken."""

    handle = 0

    def __init__(self, fail_at: int | None = None):
        self.live, self.allocations, self.fail_at, self.closed = set(), 0, fail_at, False

    def alloc(self, nbytes):
        from edgesdk.errors import RuntimeBackendError
        from edgesdk.runtime.tensorrt_backend import _Buffer

        self.allocations += 1
        if self.allocations == self.fail_at:
            raise RuntimeBackendError("CUDA call cudaMalloc failed: cudaErrorMemoryAllocation",
                                      "check the GPU with 'edgesdk env'")
        self.live.add(self.allocations)
        return _Buffer(0x1000 * self.allocations, nbytes)

    def close(self):
        self.live.clear()
        self.closed = True


GRAPH = {"kv_heads": [1, 1], "head_dim": 4, "max_context": 8, "vocab_size": 16}


@pytest.mark.parametrize(("readable", "fail_at", "message"), [
    (False, None, "TensorRT 10.3.0 could not deserialize"),
    (True, 4, "cudaMalloc failed"),  # ids, logits, then the first KV buffers; the next one fails
])
def test_a_tensorrt_backend_that_fails_to_load_frees_its_device_memory(tmp_path, monkeypatch, readable, fail_at,
                                                                       message):
    """The device buffers (cudaMalloc through cuda-python) and the stream of a backend that failed to load were
    never freed: the backend chain then opened ort-trt, ort-cuda or triton on a Jetson whose memory (shared with
    the CPU) still held the failed one's KV cache."""
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    monkeypatch.setitem(sys.modules, "tensorrt", StandInTensorRT(GRAPH, readable=readable))
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    device = CountingDevice(fail_at)
    with pytest.raises(RuntimeBackendError, match=message):
        TensorRTBackend(plan, GRAPH, device=device)
    assert device.closed
    assert device.live == set()
    monkeypatch.setitem(sys.modules, "tensorrt", StandInTensorRT(GRAPH))
    sound = CountingDevice()
    backend = TensorRTBackend(plan, GRAPH, device=sound)  # the stand-in loads when nothing fails
    assert (backend.max_seq, sound.allocations, sound.closed) == (4, 10, False)
