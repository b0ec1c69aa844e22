"""Review 61 of the build work directory (edgesdk/build/checkpoint.py): a refused --resume names a training text
file added to or dropped from --data by its path, and a work directory whose first state file the disk refuses is
not left behind empty. Each test fails on the code before its fix."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from edgesdk.build.checkpoint import WorkDir, file_fingerprint
from edgesdk.compress.data import DataConfig
from edgesdk.errors import BuildError
from tests._utils.child_script import script_outcome


def _build_key(texts: list[Path]) -> dict:
    """A build key whose training text part is the pipeline's (edgesdk/build/pipeline.py build): the data settings
    and a fingerprint of each --data file."""
    data = DataConfig(files=tuple(str(text) for text in texts), generated_sequences=0)
    return {"model": {"path": "/models/tiny", "files": {"model.safetensors": [10, 1]}}, "recipe": ["smooth"],
            "stage:smooth": [["smooth", {}]], "export": {"form": "standard"}, "context": 64, "edgesdk": "0",
            "data": {**asdict(data), "files": [file_fingerprint(text) for text in data.files]}}


def _texts(tmp_path: Path, *names: str) -> list[Path]:
    texts = []
    for name in names:
        text = tmp_path / "some-long-directory-name-for-training-text" / name
        text.parent.mkdir(exist_ok=True)
        if not text.exists():
            text.write_text(f"training text of {name}\n" * 20, encoding="utf-8")
        texts.append(text)
    return texts


@pytest.mark.parametrize(("then", "now", "said"), [
    (["wiki.txt"], ["wiki.txt", "extra.txt"], "{extra.txt} given now, not to the killed build"),
    (["wiki.txt", "extra.txt"], ["wiki.txt"], "{extra.txt} given to the killed build, not now"),
    (["wiki.txt", "extra.txt"], ["extra.txt", "wiki.txt"], "in the order {wiki.txt}, {extra.txt} then, {extra.txt}, "
                                                           "{wiki.txt} now"),
])
@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_resume_with_a_data_file_added_dropped_or_reordered_names_the_file_by_its_path(tmp_path, then, now, said,
                                                                                      terms):
    """A --data file added since the killed build was named as the start of the two lists of fingerprints, cut at 60
    characters (``data.files: [{"files": {"wiki.txt": [...]}, "path": "/tmp/...`` then, ...), which hid which file it
    was; it is named by its path, as a dropped one and a new order are."""
    work = tmp_path / "b.build"
    WorkDir(work, _build_key(_texts(tmp_path, *then)), resume=False).release()
    with pytest.raises(BuildError) as refused:
        WorkDir(work, _build_key(_texts(tmp_path, *now)), resume=True, terms=terms)
    paths = {f"{{{name}}}": str(path) for name, path in zip(now + then, _texts(tmp_path, *now, *then), strict=True)}
    for name, path in paths.items():
        said = said.replace(name, path)
    assert f"put back what changed (data.files: {said})" in refused.value.fix
    assert "the training text" in refused.value.problem


# Starts a build's work directory, as the pipeline does, in a process whose files may not grow (RLIMIT_FSIZE 0, with
# SIGXFSZ ignored: the state file's write fails with EFBIG, as on a full disk with ENOSPC).
NO_ROOM = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.checkpoint import WorkDir
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
try:
    WorkDir(Path(sys.argv[1]), {"model": "m", "edgesdk": "0"}, resume=False)
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc))}))
"""


def test_a_work_directory_whose_first_state_file_the_disk_refuses_is_not_left_behind(tmp_path):
    """The refusal named the state file, and the empty ``<out>.build`` directory made for it stayed beside the
    bundle's place after the build had failed."""
    work = tmp_path / "b.build"
    outcome = script_outcome(NO_ROOM, str(work))
    assert outcome["raised"] == "BuildError", outcome
    assert "cannot write the work directory's state file" in outcome["problem"]
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_a_resume_whose_state_file_the_disk_refuses_keeps_the_finished_steps(tmp_path):
    """The clean-up is a fresh start's: a resumed build whose state file cannot be written keeps the work directory
    and the steps it recorded (what the resume goes on from once there is room)."""
    work = tmp_path / "b.build"
    first = WorkDir(work, {"model": "m", "context": 64, "edgesdk": "0"}, resume=False)
    first.mark_done("export", {})
    first.release()
    script = NO_ROOM.replace('{"model": "m", "edgesdk": "0"}, resume=False',
                             '{"model": "m", "context": 128, "edgesdk": "0"}, resume=True')
    outcome = script_outcome(script, str(work))
    assert outcome["raised"] == "BuildError", outcome
    assert json.loads((work / "state.json").read_text(encoding="utf-8"))["done"] == {"export": {}}
