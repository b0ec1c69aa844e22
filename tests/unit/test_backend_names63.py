"""Which backend ran, told per bundle and in eval's figures: the line a fallback prints names its bundle where a
process opens more than one (a draft bundle, a server's several models; edgesdk/runtime/session.py open_runtime),
``eval --json`` records the backend and why the ones before it did not open (edgesdk/evaluate.py backend_record),
and a TensorRT that cannot be used is told the fix of the bundle's own target (edgesdk/runtime/tensorrt_backend.py
open_tensorrt_backend, edgesdk/runtime/tensorrt_engine.py newer_tensorrt_fix). Real bundles whose runtime chain
starts with backends this host cannot open."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys

import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from tests.unit.test_cli import assert_ok, invoke

TEXT = "Small language models run on boards at the edge of a network. " * 20
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None


def _rewrite_manifest(path, change) -> None:
    """``change`` applied to the bundle's manifest, its hash rewritten to match."""
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / "manifest.json").write_text(text, encoding="utf-8")
    (path / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")


@pytest.fixture(scope="module")
def jetson_chain(tiny_bundle, tmp_path_factory):
    """The tiny bundle asking, as a Jetson bundle does, for tensorrt, then triton, then ort-cpu."""
    out = tmp_path_factory.mktemp("chain") / "b-jet"
    shutil.copytree(tiny_bundle.path, out)
    _rewrite_manifest(out, lambda m: m["runtime"].update({"backend": "tensorrt", "fallbacks": ["triton", "ort-cpu"]}))
    return out


@pytest.fixture
def no_kernel_mode(monkeypatch):
    monkeypatch.delenv("EDGESDK_KERNELS", raising=False)
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)


def _fallback_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("edgesdk: ") and "backend " in line
            and " (tensorrt: " in line]


# --- 1. the line names its bundle where there are two ----------------------------------------------------------------


def test_run_with_a_draft_bundle_names_the_bundle_the_line_is_about(jetson_chain, no_kernel_mode):
    """With --model-draft two bundles open: "edgesdk: backend ort-cpu (...)" did not say whose backend it was."""
    result = invoke("run", jetson_chain, "--model-draft", jetson_chain, "--prompt", "Hello", "-n", 4, "-t", 1)
    assert_ok(result)
    lines = _fallback_lines(result.stderr)
    assert len(lines) == 1, result.stderr  # the draft opened on the target's ort-cpu: its first choice
    assert lines[0].startswith(f"edgesdk: {jetson_chain}: backend ort-cpu (tensorrt: "), result.stderr
    alone = invoke("run", jetson_chain, "--prompt", "Hello", "-n", 4, "-t", 1)  # one bundle: the line as before
    assert_ok(alone)
    assert _fallback_lines(alone.stderr)[0].startswith("edgesdk: backend ort-cpu (tensorrt: "), alone.stderr


@pytest.fixture(scope="module")
def sparse_bundle(tmp_path_factory):
    """A tiny block-sparse Jetson bundle, which the triton backend runs (its kernels' PyTorch twins here)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton", reason="the bundle's AOT kernels need Triton's compiler")
    from tests._utils.builds import build_tiny_jetson_bundle

    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("sparse"))


def test_the_draft_bundles_line_says_it_is_the_drafts(sparse_bundle, jetson_chain, monkeypatch):
    """The target runs on triton, which the draft bundle (no block-sparse weights) cannot take, so the draft opens
    on its own chain and falls back to ort-cpu: two unnamed lines told of two bundles' backends."""
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)
    result = invoke("run", sparse_bundle.path, "--ignore-target", "--model-draft", jetson_chain, "--prompt", "Hello",
                    "-n", 4, "-t", 1)
    assert_ok(result)
    lines = [line for line in result.stderr.splitlines() if "backend " in line and " (tensorrt: " in line]
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"edgesdk: {sparse_bundle.path}: backend triton (tensorrt: "), lines[0]
    assert lines[1].startswith(f"edgesdk: draft {jetson_chain}: backend ort-cpu (tensorrt: "), lines[1]


def test_a_server_of_several_models_names_the_one_it_loads(jetson_chain, no_kernel_mode, capfd):
    from edgesdk.cli_serve import _model_pool
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults

    defaults = ServeDefaults(max_tokens=2)
    runtime = open_runtime(jetson_chain, threads=1, name="first")
    runtime.tokenizer.template_kwargs = {}
    completer = Completer(runtime, defaults)
    capfd.readouterr()
    pool = _model_pool([("first", jetson_chain), ("second", jetson_chain)], runtime, completer, defaults, None, {}, 0,
                       backend=None, threads=1, target=None, ignore_target=False)
    try:
        lease = pool.acquire("second")  # the first unloaded, the second loaded through the CLI's loader
        pool.release(lease)
    finally:
        pool.stop()
    lines = _fallback_lines(capfd.readouterr().err)
    assert lines == [line for line in lines if line.startswith("edgesdk: second: backend ort-cpu (tensorrt: ")]
    assert len(lines) == 1, lines


# --- 2. eval --json records the backend ------------------------------------------------------------------------------


def test_eval_json_records_the_backend_and_why_the_others_were_not_used(jetson_chain, no_kernel_mode, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    result = invoke("eval", jetson_chain, "-f", text, "--context", 32, "--stride", 32, "-t", 1, "--json")
    assert_ok(result)
    data = json.loads(result.stdout)
    assert data["backend"] == "ort-cpu"
    assert list(data["backend_reasons"]) == ["tensorrt", "triton"]
    assert data["backend_reasons"]["tensorrt"].startswith("TensorRT needs the standard graph form")
    line = _fallback_lines(result.stderr)[0]
    assert all(reason in line for reason in data["backend_reasons"].values()), (line, data)
    chosen = invoke("eval", jetson_chain, "-f", text, "--context", 32, "--stride", 32, "-t", 1, "--json",
                    "--backend", "ort-cpu")
    assert_ok(chosen)
    data = json.loads(chosen.stdout)
    assert (data["backend"], data["backend_reasons"]) == ("ort-cpu", {})


def test_an_accuracy_task_records_it_too(jetson_chain, no_kernel_mode, tmp_path):
    from tests.unit.test_eval_accuracy_cli39 import HELLASWAG_TEXT

    tasks = tmp_path / "hellaswag.txt"
    tasks.write_text(HELLASWAG_TEXT, encoding="utf-8")
    result = invoke("eval", jetson_chain, "--hellaswag", "-f", tasks, "-t", 1, "--json")
    assert_ok(result)
    data = json.loads(result.stdout)
    assert data["backend"] == "ort-cpu"
    assert list(data["backend_reasons"]) == ["tensorrt", "triton"]


# --- 3. TensorRT's fix for the bundle's target -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def standard_jetson(tiny_model_dir, tmp_path_factory):
    """A float standard-form bundle for the Orin NX: what TensorRT builds engines from."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="orin-nx", model=str(tiny_model_dir), recipe="fp32-standard",
                             out=tmp_path_factory.mktemp("std") / "b-orin", export=ExportConfig(max_context=64),
                             progress=False))


@pytest.mark.skipif(HAS_TENSORRT, reason="tells the fix where TensorRT cannot be imported")
def test_run_on_tensorrt_without_it_is_told_the_targets_install(standard_jetson, no_kernel_mode):
    """run's opener imported TensorRT without the bundle's target: a Jetson bundle was told both machines' ways,
    'pip install tensorrt' among them, which has no wheel for a Jetson, where TensorRT comes with JetPack."""
    result = invoke("run", standard_jetson.path, "--backend", "tensorrt", "--ignore-target", "--prompt", "Hi",
                    "-n", 2, "-t", 1)
    assert result.exit_code == RuntimeBackendError.exit_code, result.output
    fix = result.stderr.split("fix: ", 1)[1]
    assert "orin-nx-16gb" in fix
    assert "python3-libnvinfer" in fix
    assert "pip install tensorrt" not in fix


@pytest.fixture
def old_tensorrt(tmp_path, monkeypatch):
    """A 'tensorrt' module of version 8.4 first on sys.path (JetPack 5.0's)."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.py").write_text('__version__ = "8.4.1.5"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    yield
    sys.modules.pop("tensorrt", None)


def test_a_tensorrt_too_old_is_told_the_targets_way_to_a_newer_one(standard_jetson, old_tensorrt):
    """It said "use JetPack 6 (TensorRT 10) on the Jetson, or pip install 'tensorrt>=10' on an x86 machine" to every
    bundle: a Jetson's user was offered pip, an x86 GPU machine's the Jetson, and the board was not named."""
    from edgesdk.bundle import verify_bundle
    from edgesdk.runtime.tensorrt_backend import open_tensorrt_backend

    with pytest.raises(RuntimeBackendError, match="older than 8.5") as info:
        open_tensorrt_backend(verify_bundle(standard_jetson.path))
    assert "flash the orin-nx-16gb with JetPack 6" in info.value.fix
    assert "python3-libnvinfer" in info.value.fix
    assert "pip" not in info.value.fix
    gpu_host = {"name": "rtx-host", "family": "host", "gpu": {"arch": "Ada", "sm": 89}}
    with pytest.raises(RuntimeBackendError) as info:
        te.import_tensorrt(gpu_host)
    assert info.value.fix.startswith("on the rtx-host")
    assert info.value.fix.endswith("pip install --upgrade 'tensorrt>=10'")
    assert "JetPack" not in info.value.fix
    with pytest.raises(RuntimeBackendError) as info:
        te.import_tensorrt()  # no bundle: both machines' ways
    assert "on a Jetson: flash the Jetson with JetPack 6" in info.value.fix
    assert "on an x86 machine with an NVIDIA GPU: pip install --upgrade 'tensorrt>=10'" in info.value.fix
