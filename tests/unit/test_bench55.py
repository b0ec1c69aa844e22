"""``edgesdk bench`` against llama-bench (ggml-org/llama.cpp tools/llama-bench/llama-bench.cpp), review 55: the
record's model_size is the weights the backend that ran the tests loaded, and the clock warnings are of the cores
the bench may run on."""

from __future__ import annotations

import json
import os

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def sparse_bundle(tmp_path_factory):
    """A tiny block-sparse INT8 bundle: the ONNX graph and its weights, and the triton backend's sparse weights."""
    pytest.importorskip("triton", reason="the bundle's AOT kernels need Triton's compiler")
    from tests._utils.builds import build_tiny_jetson_bundle

    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("sparse"))


def test_model_size_is_the_sparse_weights_where_the_triton_backend_ran(sparse_bundle, monkeypatch):
    """The triton backend loads sparse/weights.safetensors alone; model_size counted the ONNX graph and its dense
    weights, which it never reads (182323 bytes against the 91448 it loaded)."""
    from edgesdk.runtime.bench import bench_model_facts

    files = sparse_bundle.manifest["files"]
    sparse_weights = sparse_bundle.manifest["sparse"]["weights"]
    graph_bytes = files["model.onnx"]["size"] + files["model.onnx.data"]["size"]
    assert files[sparse_weights]["size"] != graph_bytes
    facts = bench_model_facts(sparse_bundle.path, sparse_bundle.manifest, "ort-cpu", "edgesdk")
    assert facts["model_size"] == graph_bytes
    facts = bench_model_facts(sparse_bundle.path, sparse_bundle.manifest, "triton", "edgesdk")
    assert facts["model_size"] == files[sparse_weights]["size"]

    monkeypatch.setenv("EDGESDK_KERNELS", "reference")  # the kernels' PyTorch twins, on this CPU
    result = invoke("bench", sparse_bundle.path, "--backend", "triton", "--ignore-target", "-p", 4, "-n", 0, "-r", 1,
                    "-t", 1, "-o", "jsonl")
    assert_ok(result)
    record = json.loads(result.stdout.splitlines()[0])
    assert record["backends"] == "triton"
    assert record["model_size"] == files[sparse_weights]["size"]


def _cluster(root, index: int, governor: str, max_khz: int):
    """A cpufreq policy driving CPU ``index`` alone, at ``max_khz`` of 2.4 GHz, under ``governor``."""
    from tests._utils.sysfs import make_cpufreq_policy

    policy = make_cpufreq_policy(root, index, max_khz, 600_000, available=(600_000, 1_200_000, 2_400_000))
    (policy / "scaling_governor").write_text(governor + "\n")
    (policy / "scaling_driver").write_text("cpufreq-dt\n")
    (policy / "affected_cpus").write_text(f"{index}\n")
    return policy


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to pin the process to one of them")
def test_a_pinned_bench_is_not_warned_of_the_clocks_of_cores_it_does_not_run_on(tmp_path):
    """taskset -c keeps the bench on one cluster: the other cluster's powersave governor and capped clock slowed
    nothing it ran, and were warned of as if they had (the CPU time was already counted over its own cores)."""
    from edgesdk.runtime.bench_conditions import snapshot, warnings

    allowed = sorted(os.sched_getaffinity(0))
    idle, used = allowed[:2]
    _cluster(tmp_path, idle, "powersave", 1_200_000)
    _cluster(tmp_path, used, "schedutil", 2_400_000)
    free = snapshot([], tmp_path / "none", tmp_path, use_jtop=False)
    found = warnings(free, free, cores=len(allowed))
    assert any(f"policy{idle} (cpus {idle}) runs the powersave governor" in w for w in found)
    assert any(f"policy{idle} (cpus {idle}) is capped at 1200 of 2400 MHz" in w for w in found)
    os.sched_setaffinity(0, {used})
    try:
        pinned = snapshot([], tmp_path / "none", tmp_path, use_jtop=False)
    finally:
        os.sched_setaffinity(0, allowed)
    assert pinned["cpus"] == [used]
    assert not [w for w in warnings(pinned, pinned, cores=len(allowed)) if "policy" in w]
    _cluster(tmp_path, used, "powersave", 1_800_000)  # its own cluster's are still said
    os.sched_setaffinity(0, {used})
    try:
        pinned = snapshot([], tmp_path / "none", tmp_path, use_jtop=False)
    finally:
        os.sched_setaffinity(0, allowed)
    found = warnings(pinned, pinned, cores=len(allowed))
    assert [w for w in found if "policy" in w] == [
        f"policy{used} (cpus {used}) runs the powersave governor, which holds the lowest clock (echo performance or "
        f"schedutil to its scaling_governor)",
        f"policy{used} (cpus {used}) is capped at 1800 of 2400 MHz (scaling_max_freq: nvpmodel, a thermal guard's "
        f"--clock-cap or a user)"]


def test_a_cluster_whose_cores_are_all_offline_is_not_warned_of(tmp_path):
    """nvpmodel's low-power modes take a Jetson's second cluster offline: its policy stays in sysfs with an empty
    affected_cpus, and its clock slowed nothing the bench ran (no online CPU, so none of its affinity)."""
    from edgesdk.runtime.bench_conditions import snapshot, warnings

    online = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if online is None:
        pytest.skip("the platform does not say which CPUs the process may run on")
    offline = max(online) + 1
    _cluster(tmp_path, online[0], "schedutil", 2_400_000)
    (_cluster(tmp_path, offline, "powersave", 1_200_000) / "affected_cpus").write_text("\n")
    taken = snapshot([], tmp_path / "none", tmp_path, use_jtop=False)
    assert [clock["cpus"] for clock in taken["clocks"]] == [str(online[0]), ""]
    assert not [w for w in warnings(taken, taken, cores=len(online)) if "policy" in w]
