"""Runtime backends and the session (edgesdk/runtime/session.py, ort_backend.py, ort_fused_backend.py): the cores a
cgroup CPU quota leaves, and token ids outside the vocabulary, on real sessions of tiny exported models."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import session


def _cgroup_tree(tmp_path, proc_lines: list[str], files: dict[str, str]):
    """(proc_cgroup, root): a /proc/self/cgroup and a /sys/fs/cgroup tree holding ``files`` (path -> text)."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("".join(line + "\n" for line in proc_lines))
    return proc, root


def test_cgroup_v2_cpu_max_of_the_container_root(tmp_path):
    """``docker run --cpus 1.5``: the container's own cgroup is mounted at the root and /proc/self/cgroup names a path
    that is not there; cpu.max "150000 100000" is 1.5 CPUs."""
    proc, root = _cgroup_tree(tmp_path, ["0::/docker/abc"], {"cpu.max": "150000 100000\n"})
    assert session.cgroup_cpu_limit(proc, root) == 1.5


def test_cgroup_v2_the_tightest_quota_on_the_path_holds(tmp_path):
    proc, root = _cgroup_tree(tmp_path, ["0::/system.slice/edgesdk.service"],
                              {"system.slice/cpu.max": "100000 100000\n",
                               "system.slice/edgesdk.service/cpu.max": "max 100000\n"})
    assert session.cgroup_cpu_limit(proc, root) == 1.0


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, root = _cgroup_tree(tmp_path, ["12:pids:/x", "4:cpu,cpuacct:/docker/abc", "3:cpuset:/docker/abc"],
                              {"cpu,cpuacct/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert session.cgroup_cpu_limit(proc, root) == 2.0


@pytest.mark.parametrize("files", [{"cpu.max": "max 100000\n"},
                                   {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, {}])
def test_no_cgroup_quota_is_no_limit(tmp_path, files):
    proc, root = _cgroup_tree(tmp_path, ["0::/", "2:cpu:/"], files)
    assert session.cgroup_cpu_limit(proc, root) is None


def test_the_profile_threads_are_clamped_to_a_cgroup_quota(tiny_bundle, tmp_path, monkeypatch):
    """The profile's threads were clamped to the CPU affinity only: in a container limited to one CPU on a bigger
    board ('docker run --cpus 1'), the affinity still lists every core, and as many spinning intra-op threads ran
    throttled by the CFS quota. The quota counts as usable cores, as the JVM and .NET count it."""
    affinity = len(os.sched_getaffinity(0))
    if affinity < 2 or int(tiny_bundle.manifest["runtime"]["threads"]) < 2:
        pytest.skip("needs 2 cores and a profile of 2 threads to show a clamp to 1")
    proc, root = _cgroup_tree(tmp_path, ["0::/docker/abc"], {"cpu.max": "100000 100000\n"})
    monkeypatch.setattr(session, "PROC_CGROUP", proc)
    monkeypatch.setattr(session, "CGROUP_ROOT", root)
    assert session.usable_cores() == 1
    runtime = session.open_runtime(tiny_bundle.path, backend="ort-cpu")
    assert runtime.threads == 1
    assert f"1 threads (profile {tiny_bundle.manifest['runtime']['threads']}, 1 usable cores)" in runtime.notes


@pytest.fixture(scope="module", params=["standard", "ort-fused"])
def backend(request, tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from tests._utils.tiny import tiny_llama

    out = tmp_path_factory.mktemp(request.param)
    spec = export_model(tiny_llama(heads=4, kv_heads=2), out, ExportConfig(form=request.param, max_context=64))
    backend_class = OrtFusedBackend if request.param == "ort-fused" else OrtBackend
    return backend_class(out / "model.onnx", spec.to_json(), threads=1)


@pytest.mark.parametrize("bad", [-1, "vocab", "vocab+5"])
def test_a_token_id_outside_the_vocabulary_is_refused_by_name(backend, bad):
    """ONNX Gather takes indices in [-s, s-1]: a prefill of -1 ran the last embedding row and answered, and an id
    past the rows failed with onnxruntime's own RuntimeError. llama.cpp's llama_decode refuses both ("invalid
    token"). The cache is left as it was."""
    token = {"vocab": backend.vocab_size, "vocab+5": backend.vocab_size + 5}.get(bad, bad)
    backend.reset()
    backend.prefill(np.array([5, 6]))
    with pytest.raises(RuntimeBackendError, match=rf"prefill with token id {token} at position 1: expected an id "
                                                  rf"from 0 to {backend.vocab_size - 1}"):
        backend.prefill(np.array([7, token, 8]))
    with pytest.raises(RuntimeBackendError, match=rf"decode with token id {token} at position 0"):
        backend.decode(token)
    with pytest.raises(RuntimeBackendError, match=rf"hidden states with token id {token} at position 0"):
        backend.hidden_states(np.array([token]))
    assert backend.position == 2
    assert backend.decode(9).shape == (backend.vocab_size,)


def test_a_fractional_token_id_is_refused_not_cut(backend):
    """np.asarray(ids, dtype=np.int64) cut 7.9 to 7 and ran it."""
    backend.reset()
    with pytest.raises(RuntimeBackendError, match=r"prefill with token ids of dtype float64 \(\[1\.0, 7\.9\]\): "
                                                  r"expected whole numbers"):
        backend.prefill(np.array([1.0, 7.9]))
    with pytest.raises(RuntimeBackendError, match=r"decode with token ids of dtype float64"):
        backend.decode(7.9)
    assert backend.position == 0


def test_whole_number_ids_of_any_integer_type_run_alike(backend):
    backend.reset()
    expected = backend.prefill(np.array([3, 4, 5], np.int64), keep_logits=3)
    for ids in ([3, 4, 5], np.array([3, 4, 5], np.int32), np.array([3, 4, 5], np.uint16)):
        backend.reset()
        np.testing.assert_array_equal(backend.prefill(ids, keep_logits=3), expected)
    backend.reset()
    backend.prefill([3, 4])
    np.testing.assert_allclose(backend.decode(np.uint8(5)), expected[-1], atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3), (1, 2, 3)])
def test_a_batch_of_sequences_is_refused_not_run_as_one(backend, shape):
    """A (2, 3) array of two sequences was reshaped to (1, 6) and run as one sequence of six tokens."""
    backend.reset()
    with pytest.raises(RuntimeBackendError, match=rf"prefill with token ids of shape {re.escape(str(shape))}: "
                                                  r"expected one sequence"):
        backend.prefill(np.arange(1, 7).reshape(shape))
    assert backend.position == 0
    assert backend.prefill(np.array([[1, 2, 3]])).shape == (1, backend.vocab_size)
