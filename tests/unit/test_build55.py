"""Review of the build's work directory (edgesdk/build/checkpoint.py) and bundle packaging."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from edgesdk.build.checkpoint import WorkDir
from edgesdk.errors import BuildError


def _lock_from_another_process(work) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from edgesdk.build.checkpoint import lock_work_dir\n"
                           f"lock_work_dir({str(work)!r})"], capture_output=True, text=True)


def test_a_second_build_in_another_thread_is_refused_and_leaves_the_first_its_lock(tmp_path):
    """lock_work_dir gave up any lock this process held on the path before taking it: a second build_bundle() to
    the same out in another thread took the running build's lock and deleted its checkpoints under it."""
    work = tmp_path / "out.build"
    first = WorkDir(work, {"build": 1}, resume=False)
    checkpoint = first.stage_checkpoint(0, "qat")
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    first.mark_done("stage:qat", {"stage": "qat"})
    outcome = {}

    def second_build():
        try:
            WorkDir(work, {"build": 2}, resume=False)
            outcome["second"] = "took the work directory"
        except BuildError as exc:
            outcome["second"] = exc.problem

    thread = threading.Thread(target=second_build)
    thread.start()
    thread.join()
    assert "another edgesdk build is using the work directory" in outcome["second"]
    assert (checkpoint / "model.safetensors").read_bytes() == b"weights"
    assert first.done("stage:qat") == {"stage": "qat"}
    # the refused build gave up no lock of the first one's: a build from a shell is refused too
    assert _lock_from_another_process(work).returncode != 0
    first.release()
    assert _lock_from_another_process(work).returncode == 0, "free once the first build has ended"


def test_a_resume_that_found_no_directory_to_lock_first_locks_the_one_it_resumes(tmp_path):
    """WorkDir locked the work directory only where it found one (a real directory) before reading the state: a
    --resume that looked between another build's mkdir and its lock, or through a link to a work directory, read
    the state and went on building there unlocked, beside the build that held it."""
    work = tmp_path / "out.build"
    first = WorkDir(work, {"build": 1}, resume=False)
    first.mark_done("baseline", {"parameters": 1})
    link = tmp_path / "link.build"
    link.symlink_to(work, target_is_directory=True)
    try:
        with pytest.raises(BuildError, match="another edgesdk build is using the work directory"):
            WorkDir(link, {"build": 1}, resume=True)
    finally:
        first.release()
    resumed = WorkDir(link, {"build": 1}, resume=True)  # once the first build has ended, it resumes there
    assert resumed.done("baseline") == {"parameters": 1}
    assert _lock_from_another_process(work).returncode != 0  # and holds the lock while it runs
    resumed.release()
