"""Findings of a Jetson user-journey review: what `edgesdk export` says of a Jetson bundle, the TensorRT fix for a
Jetson bundle's engine, the training's live lines under --no-progress, and `edgesdk inspect`'s file column."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from edgesdk.cli import main  # noqa: E402
from edgesdk.errors import ExportError, RuntimeBackendError  # noqa: E402
from edgesdk.runtime import tensorrt_engine as te  # noqa: E402


@pytest.fixture(scope="module")
def jetson_bundle(tiny_model_dir, tmp_path_factory):
    """A real bundle for orin-nx-16gb with the standard graph (what the jetson recipes export)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("jetson") / "b-jet"
    return build(BuildConfig(target="orin-nx-16gb", model=str(tiny_model_dir), out=out, recipe="fp32-standard",
                             export=ExportConfig(max_context=64), progress=False))


# --- 1. GGUF export of a Jetson bundle -----------------------------------------------------------------------------


def test_export_of_a_jetson_bundle_names_it_and_gives_a_build_that_runs_as_written(jetson_bundle, tmp_path,
                                                                                  tiny_model_dir):
    pytest.importorskip("gguf")
    from edgesdk.cli_build import build as build_command

    result = CliRunner().invoke(main, ["export", str(jetson_bundle.path), str(tmp_path / "b-jet.gguf")],
                                prog_name="edgesdk")
    assert result.exit_code == ExportError.exit_code, result.output
    assert "built for orin-nx-16gb (jetson) with recipe 'fp32-standard'" in result.stderr
    assert "graph form 'standard'" in result.stderr
    assert "a bundle for a CPU board (rpi5, rpi4, host)" in result.stderr
    fix = result.stderr.split("fix: ", 1)[1]
    command = fix.split("export that bundle: ", 1)[1].split(" (or", 1)[0]
    assert command == f"edgesdk build --model {shlex.quote(str(tiny_model_dir))} --target rpi5 --recipe default"
    # the command as written is one edgesdk build takes: every option known, none required left out
    args = shlex.split(command)[2:]
    with build_command.make_context("build", args) as context:
        assert (context.params["model"], context.params["target"], context.params["recipe"]) == \
            (str(tiny_model_dir), "rpi5", "default")
    assert not (tmp_path / "b-jet.gguf").exists()


def test_the_graph_form_is_refused_from_the_manifest_alone(tmp_path):
    """The check reads the manifest only, so a caller can refuse before it hashes the bundle's files."""
    from edgesdk.export.bundle_weights import check_readable_form

    manifest = {"graph": {"form": "standard"}, "target": {"name": "orin-nx-16gb", "family": "jetson"},
                "recipe": {"name": "jetson"}, "model": {"before": {"source": "smollm2-135m"}}}
    with pytest.raises(ExportError) as refused:
        check_readable_form(tmp_path / "b-jet", manifest)  # no files there at all
    assert "built for orin-nx-16gb (jetson) with recipe 'jetson'" in refused.value.problem
    assert "edgesdk build --model smollm2-135m --target rpi5 --recipe default" in refused.value.fix
    check_readable_form(tmp_path, {**manifest, "graph": {"form": "ort-fused"}})  # readable: no refusal


# --- 2. TensorRT for a Jetson bundle's engine ------------------------------------------------------------------------


def test_engine_build_of_a_jetson_bundle_without_tensorrt_says_to_build_on_the_board(jetson_bundle, monkeypatch,
                                                                                    tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError, as where it is missing
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(main, ["engine", "build", str(jetson_bundle.path)], prog_name="edgesdk")
    assert result.exit_code == RuntimeBackendError.exit_code, result.output
    assert "TensorRT's Python module 'tensorrt' cannot be imported" in result.stderr
    fix = result.stderr.split("fix: ", 1)[1]
    assert "build the engine on the orin-nx-16gb itself" in fix
    assert "'edgesdk deploy' builds it there" in fix
    assert f"run 'edgesdk engine build {jetson_bundle.path}' on the orin-nx-16gb" in fix
    assert "sudo apt install python3-libnvinfer" in fix
    assert "x86" not in fix.replace("on an x86 GPU or another Jetson module does not run", "")
    assert "pip install tensorrt" not in fix


def test_no_gpu_for_a_jetson_bundle_says_to_build_on_the_board(monkeypatch):
    monkeypatch.setattr(te, "cuda_device_sm", lambda device=0: (None, "the CUDA runtime sees 0 CUDA device(s)"))
    with pytest.raises(RuntimeBackendError, match="no CUDA device is usable here") as refused:
        te.require_sm({"name": "orin-nano-8gb", "family": "jetson", "gpu": {"sm": 87}}, "b")
    assert "'edgesdk deploy' builds it there" in refused.value.fix
    assert "pip install tensorrt" not in refused.value.fix


def test_the_x86_advice_is_kept_for_a_target_that_is_a_machine_with_a_gpu():
    gpu_host = {"name": "rtx-host", "family": "host", "gpu": {"arch": "Ada", "sm": 89}}
    assert te.tensorrt_fix(gpu_host).endswith("pip install tensorrt")
    cpu_board = te.tensorrt_fix({"name": "rpi5", "family": "rpi", "gpu": None})
    assert "rpi5 has no NVIDIA GPU" in cpu_board
    assert "pip install tensorrt" not in cpu_board
    assert te.tensorrt_fix() == te.TENSORRT_FIX  # no bundle named: both machines' ways


# --- 3. the training's lines without a bar ---------------------------------------------------------------------------


def _distill(progress: bool, interval: float = 0.0) -> list[str]:
    from edgesdk.compress.train import LoopSettings, TrainingProgress, keeping_progress, run_training
    from tests._utils.tiny import tiny_llama

    said: list[str] = []
    model = tiny_llama(seed=0)
    batches = [torch.randint(0, 320, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(6)]

    def loss_fn(batch, _):
        return model(batch, labels=batch).loss, {}

    import tempfile

    with tempfile.TemporaryDirectory() as work:
        keeper = TrainingProgress(Path(work) / "00-distill.training.pt", "distill", "build", said.append)
        settings = LoopSettings(lr=1e-3, grad_accumulation=2, checkpoint_interval_s=interval)
        with keeping_progress(keeper):
            run_training(model, loss_fn, batches, settings, desc="distill", progress=progress)
    return said


def test_without_a_bar_each_keep_of_the_training_says_its_batch():
    said = _distill(progress=False)
    assert [line for line in said if line.endswith("(kept)")] == \
        ["distill: batch 2 of 6 (kept)", "distill: batch 4 of 6 (kept)", "distill: batch 6 of 6 (kept)"]


def test_with_the_bar_no_keep_line_is_said():
    assert not [line for line in _distill(progress=True) if "(kept)" in line]


def test_without_a_bar_each_kept_power_round_is_said(tmp_path):
    from dataclasses import replace

    from edgesdk.compress.train import TrainingProgress, keeping_progress
    from edgesdk.power import train
    from tests.unit.test_power_resume62 import CONFIG, POOL, _power

    config = replace(CONFIG, rounds=3, checkpoint_interval_s=0)
    said: list[str] = []
    keeper = TrainingProgress(tmp_path / "00-power.training.pt", "power", "build", said.append)
    identity, kept = train.read_kept(keeper, config, POOL, [], 0)
    model, state, info = _power()
    with keeping_progress(keeper):
        train.train_adapters(model, state, info, POOL, config, [], 0, False, kept, identity)
    assert [line for line in said if "(kept)" in line] == \
        ["power: round 1 of 3 (kept)", "power: round 2 of 3 (kept)", "power: round 3 of 3 (kept)"]


QAT_RECIPE = """name: tiny-live-log
stages:
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 8, batch_size: 2,
             sequence_length: 16, observer_batches: 1, checkpoint_interval_s: 0}
export: {form: standard, weights: int8}
"""


def test_a_build_with_no_progress_says_each_kept_batch(tiny_model_dir, tmp_path, monkeypatch):
    from tests._utils.tiny import CORPUS

    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    recipe, text = tmp_path / "recipe.yaml", tmp_path / "train.txt"
    recipe.write_text(QAT_RECIPE)
    text.write_text("\n".join(CORPUS * 3))
    result = CliRunner().invoke(main, ["build", "-t", "host", "-m", str(tiny_model_dir), "-o", str(tmp_path / "b"),
                                       "--recipe", str(recipe), "--data", str(text), "--generated-sequences", "0",
                                       "--max-context", "64", "--no-progress"], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    kept = [line for line in result.stderr.splitlines() if line.endswith("(kept)")]
    # 8 batches in 2 updates of 4 (qat's gradient accumulation): kept after each (checkpoint_interval_s 0)
    assert kept == ["edgesdk build: qat: batch 4 of 8 (kept)", "edgesdk build: qat: batch 8 of 8 (kept)"], \
        result.stderr


# --- 4. inspect's file column ----------------------------------------------------------------------------------------


def test_inspect_sizes_the_name_column_to_the_longest_name(tiny_bundle, tmp_path):
    import hashlib
    import shutil

    bundle = tmp_path / "b"
    shutil.copytree(tiny_bundle.path, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    long_name = "kernels/sm_87/bsr_gemm_plain_32x32_fp16.cubin"
    manifest["files"][long_name] = {"size": 20576, "sha256": "ab" * 32}
    text = json.dumps(manifest)
    (bundle / "manifest.json").write_text(text)
    (bundle / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")  # inspect checks it
    result = CliRunner().invoke(main, ["inspect", str(bundle)], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("  ") and line.strip()]
    rows = [row for row in rows if row.strip().split()[0] in manifest["files"]]
    assert len(rows) == len(manifest["files"])
    assert f"  {long_name} " in result.output
    assert len({len(row) for row in rows}) == 1, rows  # names padded to one width: sizes and digests in columns
    assert f"  {long_name} {20576:>14,}  {'ab' * 8}" in rows


def test_export_refuses_a_jetson_bundle_before_hashing_its_files(jetson_bundle, tmp_path, monkeypatch):
    """The refusal came after verify_bundle had hashed every file (6-8 s on a real bundle): the manifest alone
    says the graph form."""
    import edgesdk.bundle
    from edgesdk.export.gguf_export import export_gguf

    def hashed(path):
        raise AssertionError("verify_bundle ran before the graph form was checked")

    monkeypatch.setattr(edgesdk.bundle, "verify_bundle", hashed)
    with pytest.raises(ExportError, match="its graph form 'standard' is the standard-op ONNX graph"):
        export_gguf(jetson_bundle.path, tmp_path / "out.gguf")
