"""Review 53 of the build work directory and the sparsity block checks: a test of a fix fails on the code before it;
the resume-path case and the lock kept after a start guard what already held."""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import replace

import pytest

from edgesdk.build.checkpoint import STATE, WorkDir
from edgesdk.errors import BuildError


def _lock_is_free(path) -> bool:
    """Whether another open of ``path`` can take the exclusive lock a build takes (flock locks belong to the open
    file, so one held by this process refuses this open as it refuses another process)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _foreign_dir(tmp_path):
    work = tmp_path / "b.build"
    work.mkdir()
    (work / "notes.txt").write_text("the user's", encoding="utf-8")
    return work


def _other_builds_dir(tmp_path):
    work = tmp_path / "b.build"
    work.mkdir()
    (work / STATE).write_text(json.dumps({"build_key": "another", "done": {}}), encoding="utf-8")
    return work


@pytest.mark.parametrize(("make", "resume", "said"), [
    (_foreign_dir, False, "is taken: a directory that is not an edgesdk work directory"),
    (_other_builds_dir, True, "belongs to a different build"),
])
def test_a_refused_work_directory_is_not_left_locked(tmp_path, make, resume, said):
    """Starting over took the lock on an existing work directory before check_work_dir refused it (a directory of
    the user's files there): the refusal left the lock and its descriptor held until the process ended, so every
    other build to the same --out was told another build was using it, long after this one had failed."""
    work = make(tmp_path)
    with pytest.raises(BuildError) as refused:
        WorkDir(work, {"model": "m"}, resume=resume)
    assert said in refused.value.problem
    assert _lock_is_free(work)
    assert (work / ("notes.txt" if not resume else STATE)).is_file()  # nothing of the user's was touched


def test_a_started_work_directory_stays_locked_until_released(tmp_path):
    """The lock a build holds while it runs (the fix above gives it up only on failure)."""
    work = WorkDir(tmp_path / "b.build", {"model": "m"}, resume=False)
    assert not _lock_is_free(work.path)
    work.release()
    assert _lock_is_free(work.path)


def _early_checks(profile, overrides: list[str], model, terms: str) -> None:
    """The pipeline's checks before any stage runs, for the jetson-sparse recipe with ``overrides``."""
    from edgesdk.build.pipeline import check_sparse_block, check_stage_sizes, check_target_support, recipe_for
    from edgesdk.export.onnx_export import ExportConfig

    recipe = recipe_for("jetson-sparse", profile, terms).with_overrides(overrides, terms)
    stages = recipe.validated(terms)
    export = replace(ExportConfig(), **recipe.export.model_dump())
    check_target_support(recipe, stages, export, profile, terms)
    check_sparse_block(stages, export, profile, terms)
    check_stage_sizes(stages, model, profile, terms)


@pytest.mark.parametrize(("terms", "combined"), [
    ("cli", "--set sparsify.block_size=8 --set export.sparse=false"),
    ("python", "overrides=['sparsify.block_size=8', 'export.sparse=false']"),
])
def test_a_profile_block_over_a_small_model_names_a_fix_the_sparse_export_accepts(terms, combined):
    """A profile's sparsity_block (32) covering a small model's weight (16 x 16) was refused with the fix "--set
    sparsify.block_size=8 or less" alone; under the jetson-sparse recipe (export.sparse) that override was then
    refused in turn, the sparse export taking the profile's block only. The fix names the override with the
    sparse export off, and a build given exactly those overrides passes every check before the stages."""
    pytest.importorskip("torch")
    from edgesdk.profile import get_profile
    from tests._utils.tiny import tiny_llama

    profile = get_profile("orin-nano-8gb", terms)
    model = tiny_llama(hidden=16, heads=2, kv_heads=1, intermediate=32)  # q_proj 16 x 16, below the 32 x 32 block
    with pytest.raises(BuildError) as refused:
        _early_checks(profile, [], model, terms)
    assert "the target profile orin-nano-8gb's sparsity_block is 32" in refused.value.problem
    assert combined in refused.value.fix
    overrides = re.findall(r"'([^']+)'", combined) if terms == "python" else re.findall(r"--set (\S+)", combined)
    _early_checks(profile, overrides, model, terms)  # the fix as given: nothing refused
