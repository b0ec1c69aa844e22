"""The build's error for a write the disk refused (edgesdk/build/checkpoint.py disk_refused): one message for the
state file, a stage checkpoint, the export and the bundle."""

from __future__ import annotations

import errno

import pytest

from edgesdk.build.checkpoint import disk_refused
from edgesdk.errors import BuildError
from tests._utils.child_script import script_outcome

THEN = ", then run the build again"


class SafetensorError(Exception):
    """As safetensors' Rust writer names its error: no OSError, the code in its text."""


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_write_that_found_no_room_names_the_file_the_reason_the_space_left_and_frees_space(tmp_path, code):
    exc = OSError(code, "no room", str(tmp_path / ".b.partial" / "model.onnx.data"))
    error = disk_refused(exc, f"the bundle {tmp_path / 'b'}", tmp_path, THEN)
    assert isinstance(error, BuildError)
    assert error.problem.startswith(f"cannot write the bundle {tmp_path / 'b'} (its file model.onnx.data): no room (")
    assert error.problem.endswith(" free on its disk)")
    assert "[Errno" not in error.problem
    assert error.fix == f"free space on the disk holding {tmp_path}{THEN}"


def test_a_write_refused_otherwise_asks_for_the_directory_to_be_made_writable(tmp_path):
    exc = PermissionError(errno.EACCES, "Permission denied")
    error = disk_refused(exc, "the stage checkpoint /x/stages/00-smooth", tmp_path, THEN,
                         named=f"the build's work directory {tmp_path}")
    assert error.problem.startswith("cannot write the stage checkpoint /x/stages/00-smooth: Permission denied (")
    assert error.fix == f"make the build's work directory {tmp_path} writable{THEN}"


def test_the_file_written_is_not_named_twice_and_a_rust_writers_error_is_taken_as_it_reads(tmp_path):
    state = tmp_path / "state.json.tmp"
    error = disk_refused(OSError(errno.ENOSPC, "No space left on device", str(state)),
                         f"the work directory's state file {state}", tmp_path, THEN)
    assert error.problem.startswith(f"cannot write the work directory's state file {state}: No space left on device (")
    rust = SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    error = disk_refused(rust, "the stage checkpoint c", tmp_path, THEN)
    assert error.problem.startswith("cannot write the stage checkpoint c: Error while serializing: I/O error: Disk "
                                    "quota exceeded (os error 122) (")
    assert error.fix.startswith("free space on the disk holding ")


def test_a_directory_whose_space_cannot_be_read_is_said_so(tmp_path):
    error = disk_refused(OSError(errno.ENOSPC, "No space left on device"), "the bundle b", tmp_path / "gone", THEN)
    assert error.problem == "cannot write the bundle b: No space left on device (unknown space free on its disk)"


# Writes a tiny model's checkpoint as the build's stage would, in a process whose files may not grow past a few
# kilobytes (RLIMIT_FSIZE, with SIGXFSZ ignored: the write fails with EFBIG as a full disk's fails with ENOSPC).
SMALL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from edgesdk.build.checkpoint import save_checkpoint
from tests._utils.tiny import tiny_llama, tiny_tokenizer

model, tokenizer = tiny_llama(), tiny_tokenizer()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    save_checkpoint(model, tokenizer, Path(sys.argv[1]), sys.argv[2])
    print(json.dumps({"raised": None}))
except Exception as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": getattr(exc, "problem", str(exc)),
                      "fix": getattr(exc, "fix", None)}))
"""


@pytest.mark.parametrize(("terms", "resume"), [("cli", "--resume"), ("python", "resume=True")])
def test_a_checkpoint_the_disk_refuses_says_how_to_resume_in_the_callers_terms(tmp_path, terms, resume):
    """The fix said "then resume the build", naming neither --resume nor build_bundle()'s resume=True, where the
    state file's, the export's and the bundle's errors name the one the caller passes."""
    pytest.importorskip("torch")
    pytest.importorskip("resource")
    work = tmp_path / "b.build"
    stages = work / "stages"
    stages.mkdir(parents=True)
    checkpoint = stages / "00-smooth"
    outcome = script_outcome(SMALL_DISK, str(checkpoint), terms)
    assert outcome["raised"] == "BuildError", outcome
    assert outcome["problem"].startswith(f"cannot write the stage checkpoint {checkpoint}: ")
    assert "File too large" in outcome["problem"]
    assert outcome["problem"].endswith(" free on its disk)")
    assert outcome["fix"] == (f"free space on the disk holding the build's work directory {work}{THEN} with "
                              f"{resume}: the steps finished before this one are kept there")
    assert list(stages.iterdir()) == []
