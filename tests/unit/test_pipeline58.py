"""Review of the build's work directory (edgesdk/build/checkpoint.py, edgesdk/build/pipeline.py): a stage
checkpoint or an export the disk has no room for."""

from __future__ import annotations

import json

import pytest

from tests._utils.child_script import script_outcome

pytest.importorskip("torch")
pytest.importorskip("resource")

# Writes a tiny model's checkpoint in a process whose files may not grow past a few kilobytes (RLIMIT_FSIZE, with
# SIGXFSZ ignored: the write fails with EFBIG as a full disk's fails with ENOSPC), and prints what it raised.
SMALL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.checkpoint import save_checkpoint
from tests._utils.tiny import tiny_llama, tiny_tokenizer

model, tokenizer = tiny_llama(), tiny_tokenizer()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    save_checkpoint(model, tokenizer, Path(sys.argv[1]))
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None)}))
"""

# A build of a tiny random model with no stages, run in a process whose files may not grow past a few kilobytes: the
# export's weights file is the first file past that.
SMALL_DISK_BUILD = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.pipeline import BuildConfig, build
from edgesdk.export.onnx_export import ExportConfig
from tests._utils.tiny import save_tiny_model_dir

root = Path(sys.argv[1])
save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
(root / "recipe.yaml").write_text("name: tiny-fp32\\nstages: []\\nexport: {form: ort-fused, weights: fp32}\\n")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    build(BuildConfig(target="host", model=str(root / "model"), out=root / "b", recipe=str(root / "recipe.yaml"),
                      export=ExportConfig(max_context=64), progress=False, terms=sys.argv[2]))
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None)}))
"""


def test_a_checkpoint_the_disk_refuses_is_a_build_error_naming_it_and_leaves_no_half_of_it(tmp_path):
    stages = tmp_path / "b.build" / "stages"
    stages.mkdir(parents=True)
    checkpoint = stages / "00-smooth"
    outcome = script_outcome(SMALL_DISK, str(checkpoint))
    assert outcome["raised"] == "BuildError", outcome
    assert f"cannot write the stage checkpoint {checkpoint}" in outcome["problem"]
    assert "File too large" in outcome["problem"]
    assert "free on its disk" in outcome["problem"]
    assert str(tmp_path / "b.build") in outcome["fix"]
    assert "resume" in outcome["fix"]
    assert list(stages.iterdir()) == []  # no half-written .partial checkpoint keeps the space taken


@pytest.mark.parametrize(("terms", "out"), [("cli", "--out"), ("python", "out")])
def test_an_export_the_disk_refuses_is_a_build_error_naming_the_export_and_the_option(tmp_path, terms, out):
    """It was a bare ``OSError: [Errno 27] File too large`` (``[Errno 28] No space left on device`` on a full disk)
    traceback, naming no file."""
    outcome = script_outcome(SMALL_DISK_BUILD, str(tmp_path), terms)
    assert outcome["raised"] == "BuildError", outcome
    assert f"cannot write the exported model in {tmp_path / 'b.build' / 'export'}: File too large (" in outcome["problem"]
    assert "free on its disk" in outcome["problem"]
    assert f"free space on the disk holding the build's work directory {tmp_path / 'b.build'}" in outcome["fix"]
    assert f"or pass {out} a path on a disk with more room" in outcome["fix"]
    assert not (tmp_path / "b.build").exists()  # nothing finished: neither the work directory nor half an export kept

# Records a step in a work directory whose state file can no longer grow (RLIMIT_FSIZE 0, SIGXFSZ ignored).
FULL_STATE = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.checkpoint import WorkDir

work = WorkDir(Path(sys.argv[1]), {"model": "m"}, resume=False)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
try:
    work.mark_done("baseline", {"perplexity": 12.5})
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None), "done": list(work.state["done"])}))
"""


def test_a_state_file_the_disk_refuses_names_it_and_records_no_step(tmp_path):
    """It was a bare ``OSError: [Errno 28] No space left on device`` traceback, and the build's farewell named the
    step as kept for --resume though the state file on disk does not hold it."""
    work = tmp_path / "b.build"
    outcome = script_outcome(FULL_STATE, str(work))
    assert outcome["raised"] == "BuildError", outcome
    assert f"cannot write the work directory's state file {work / 'state.json.tmp'}: File too large (" in \
        outcome["problem"]
    assert outcome["fix"] == f"free space on the disk holding {work}, then run the build again"  # none recorded
    assert outcome["done"] == []
    assert json.loads((work / "state.json").read_text(encoding="utf-8"))["done"] == {}
    assert not (work / "state.json.tmp").exists()

# Records a second step, or starts a fresh build, where the state file can no longer grow.
FULL_STATE_AFTER = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.checkpoint import WorkDir

work = None
if sys.argv[2] == "second step":
    work = WorkDir(Path(sys.argv[1]), {"model": "m"}, resume=False)
    work.mark_done("baseline", {"perplexity": 12.5})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
try:
    if work is None:
        WorkDir(Path(sys.argv[1]), {"model": "m"}, resume=False)
    else:
        work.mark_done("smooth", {"alpha": 0.5})
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None)}))
"""


@pytest.mark.parametrize(("when", "fix"), [
    ("second step", ", then run the build again with --resume to go on from the steps it recorded before"),
    ("fresh build", ", then run the build again")])
def test_a_state_file_the_disk_refuses_offers_resume_only_for_recorded_steps_and_leaves_no_half_of_it(
        tmp_path, when, fix):
    """The fix offered --resume "to go on from the steps it recorded" where a fresh build's first state file failed
    (nothing recorded), and the half-written state.json.tmp was left taking the space."""
    work = tmp_path / "b.build"
    outcome = script_outcome(FULL_STATE_AFTER, str(work), when)
    assert outcome["raised"] == "BuildError", outcome
    assert f"cannot write the work directory's state file {work / 'state.json.tmp'}" in outcome["problem"]
    assert outcome["fix"] == f"free space on the disk holding {work}{fix}"
    assert not (work / "state.json.tmp").exists()
