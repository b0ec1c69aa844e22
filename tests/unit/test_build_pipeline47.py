"""Review of the build pipeline's orchestration (edgesdk/build/pipeline.py): how a build that stops early leaves its
output directory and work directory, and which options it takes.

Stopped builds are real ``edgesdk build`` processes: a PEP 578 audit hook pauses the process (SIGSTOP) when it is
about to open a given file, the test sends it the signal, then lets it go on (SIGCONT), so the signal lands at that
moment and no timing is involved (as tests/unit/test_build_kill37.py does for SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._utils.builds import QDQ_RECIPE
from tests._utils.signals import default_signals
from tests.unit.test_build_kill37 import DRIVER as KILL_DRIVER

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs POSIX signals (SIGSTOP, SIGTERM)")

# the build command under kill37's audit hook, which pauses it (SIGSTOP) at the first open / rename / mkdir whose
# "event path" matches the regular expression in EDGESDK_TEST_STOP_AT (the event fires before the call does its work)
DRIVER = KILL_DRIVER


class Builds:
    """``edgesdk build`` of a tiny random model for the host, with a recipe without stages or with two."""

    def __init__(self, root: Path):
        from tests._utils.tiny import CORPUS, save_tiny_model_dir

        self.root = root
        self.model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
        self.qdq = root / "qdq.yaml"
        self.qdq.write_text(QDQ_RECIPE)
        self.text = root / "train.txt"
        self.text.write_text("\n".join(CORPUS * 3))
        self.driver = root / "driver.py"
        self.driver.write_text(DRIVER)
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                    "EDGESDK_CACHE": str(root / "cache"), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def args(self, out: Path, recipe: str, resume: bool = False) -> list[str]:
        data = ["--data", str(self.text), "--data-skip-chars", "2000"] if recipe != "fp32-fused" else []
        return [sys.executable, str(self.driver), "build", "-t", "host", "-m", str(self.model), "-o", str(out),
                "--recipe", recipe, *data, "--generated-sequences", "0", "--max-context", "64", "--no-progress",
                *(["--resume"] if resume else [])]

    def run(self, out: Path, recipe: str, resume: bool = False) -> subprocess.CompletedProcess:
        done = subprocess.run(self.args(out, recipe, resume), env=self.env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        return done

    def stopped(self, out: Path, recipe: str, stop_at: str, signum: int) -> tuple[int, str]:
        """Start the build, wait until it pauses at ``stop_at``, send ``signum``, let it go on; (exit code, log)."""
        env = {**self.env, "EDGESDK_TEST_STOP_AT": stop_at}
        process = subprocess.Popen(self.args(out, recipe), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, preexec_fn=default_signals)
        try:
            _, status = os.waitpid(process.pid, os.WUNTRACED)
            if not os.WIFSTOPPED(status):
                process.returncode = os.waitstatus_to_exitcode(status)
                raise AssertionError(f"the build ended ({process.returncode}) before its stop:\n"
                                     f"{process.stdout.read()}")
            os.kill(process.pid, signum)
            os.kill(process.pid, signal.SIGCONT)
            log = process.communicate(timeout=600)[0]
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return process.returncode, log


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    pytest.importorskip("torch")
    return Builds(tmp_path_factory.mktemp("pipeline47"))


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.mark.slow
def test_sigterm_while_packaging_discards_the_staged_copy_keeps_the_earlier_bundle_and_resumes(builds, tmp_path):
    """SIGTERM (``timeout``, ``docker stop``, a CI job cancelled) while the new bundle is staged: the process was
    killed where it stood, leaving the hidden staging directory ``.b.partial`` (a copy of the weights) beside the
    bundle and saying nothing of the finished steps, where Ctrl-C discards the copy and names them. Now it unwinds
    as Ctrl-C does: the copy goes, the earlier bundle at --out stays whole, the log says how to resume, the exit
    code is SIGTERM's (the shell's 128 + 15: the process ends by the signal once the build has unwound), and
    --resume finishes the build from its export."""
    from edgesdk.bundle import verify_bundle

    out = tmp_path / "b"
    builds.run(out, str(builds.qdq))  # the earlier bundle the stopped build would replace
    earlier = _manifest(out)

    code, log = builds.stopped(out, str(builds.qdq), r"open .*/\.b\.partial/report\.md$", signal.SIGTERM)
    assert code == -signal.SIGTERM, log  # ended by the signal, as a shell's 143
    assert not (tmp_path / ".b.partial").exists(), "the staged copy of the bundle was left behind"
    assert "edgesdk build: stopped (SIGTERM)" in log
    assert "the finished steps (baseline, stage:smooth, stage:qat, export) are kept in" in log, log
    assert "run the same command with --resume" in log
    assert "Traceback" not in log
    verify_bundle(out)
    assert _manifest(out)["bundle_id"] == earlier["bundle_id"]

    resumed = builds.run(out, str(builds.qdq), resume=True)
    assert "export: done in an earlier run" in resumed.stderr
    verify_bundle(out)
    assert _manifest(out)["files"] == earlier["files"]
    assert not (tmp_path / ".b.partial").exists()
    assert not (tmp_path / "b.build").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_build_stopped_before_any_step_finished_leaves_no_work_directory(builds, tmp_path, name):
    """A recipe without stages (the host's default, fp32-fused) has no finished step until its export is recorded:
    stopped while exporting, the build left ``b.build`` with a half-written export (the size of the weights) that
    no --resume can use (it starts over and deletes it) and that no message named. Now it is removed, as it is when
    the model fails to load."""
    signum = getattr(signal, name)
    out = tmp_path / "b"
    code, log = builds.stopped(out, "fp32-fused", r"open .*/b\.build/export/model\.onnx$", signum)
    assert code == {"SIGINT": 130, "SIGTERM": -signal.SIGTERM}[name], log
    assert "exporting ONNX" in log, log
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the build left files beside its --out"


def test_a_failed_export_with_no_finished_step_leaves_no_work_directory(tiny_model_dir, tmp_path):
    """The export's check against PyTorch fails (a tolerance no graph meets) in a build without stages: the error
    is raised as it was, and no work directory with the rejected export is left at ``b.build``."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.errors import EdgeSDKError
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.export.validate import ValidationConfig

    out = tmp_path / "b"
    with pytest.raises(EdgeSDKError, match="differs from PyTorch"):
        build(BuildConfig(target="host", model=str(tiny_model_dir), out=out, export=ExportConfig(max_context=64),
                          validation=ValidationConfig(prompts=1, decode_steps=1, atol=1e-30), progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_build_config_export_settings_are_built_not_replaced_by_the_recipes(tiny_model_dir, tmp_path):
    """``BuildConfig(export=ExportConfig(form=..., weights=...))``: the recipe's export section replaced every field
    but max_context, so the host's default recipe (fp32-fused) built float32 weights where INT8 ones were asked
    for, silently. They now act as ``--set export.FIELD=...``, and an override given too still wins over them."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    asked = ExportConfig(max_context=64, form="ort-fused", weights="int8")
    bundle = build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "int8", export=asked,
                               progress=False))
    assert (bundle.manifest["graph"]["form"], bundle.manifest["graph"]["dtype"]) == ("ort-fused", "int8")

    bundle = build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "set", export=asked,
                               overrides=("export.weights=fp32",), progress=False))
    assert bundle.manifest["graph"]["dtype"] == "fp32"


def test_without_out_a_bundle_of_another_model_in_a_same_named_directory_is_not_replaced(tmp_path, monkeypatch):
    """Without --out the bundle goes to bundles/<directory name>-<target>: a second model in a directory of the same
    name (two ``checkpoint-500`` or ``merged`` folders) replaced the first one's bundle there, unasked. It is
    refused, before the model loads; the same model rebuilds in place, and --out given still replaces."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.bundle import verify_bundle
    from edgesdk.errors import BuildError
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    first = save_tiny_model_dir(tmp_path / "a" / "merged", seed=1)
    second = save_tiny_model_dir(tmp_path / "b" / "merged", seed=2)
    monkeypatch.chdir(tmp_path)

    def run(model: Path, out: Path | None = None):
        return build(BuildConfig(target="host", model=str(model), out=out, export=ExportConfig(max_context=64),
                                 progress=False))

    bundle = run(first)
    assert bundle.path == (tmp_path / "bundles" / "merged-host").resolve()
    with pytest.raises(BuildError, match="holds the bundle of another model") as refused:
        run(second)
    assert str(first.resolve()) in str(refused.value)
    assert "pass --out" in refused.value.fix
    assert verify_bundle(bundle.path).bundle_id == bundle.bundle_id
    assert sorted(p.name for p in bundle.path.parent.iterdir()) == ["merged-host"]

    assert run(first).bundle_id == bundle.bundle_id  # the same model: rebuilt in place
    replaced = run(second, bundle.path)  # asked for
    assert replaced.manifest["model"]["before"]["source"] == str(second.resolve())
