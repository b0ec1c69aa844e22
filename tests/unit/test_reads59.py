"""Review 59 of reading text as given (edgesdk/errors.py read_utf8, edgesdk/cli_eval.py) and of a refused --resume's
fix (edgesdk/build/checkpoint.py).

- read_utf8 took no way to keep a file's line breaks, so ``eval --method llama-perplexity``, which reads the bytes as
  ``llama-perplexity -f`` does (a CRLF file keeps its CR), had a copy of its reading and of its refusals. read_utf8
  now takes ``newlines=False``, and the llama-perplexity reading goes through it.
- A --resume refused after an edgesdk upgrade said to "pass the same arguments as the killed build and put back what
  changed (edgesdk: "1.0" then, "1.1" now)": no argument puts back a version. The fix now names the edgesdk that made
  the work directory, to start over or to install. Where a part that a resume cannot make again (the model) caused
  the refusal, the fix asked to put back a stage's settings too, which the resume makes again under their new values.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.build.checkpoint import WorkDir
from edgesdk.errors import BuildError, EdgeSDKError, read_utf8

LINES = "the river ran past the old mill\r\nwhere seven ravens sat\ron a gate\n"


def test_read_utf8_keeps_the_line_breaks_of_the_bytes_with_newlines_false(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(LINES.encode("utf-8"))
    assert read_utf8(path, "--text", newlines=False) == LINES
    assert read_utf8(path, "--text") == LINES.replace("\r\n", "\n").replace("\r", "\n")  # as read_text reads it


@pytest.mark.parametrize(("data", "said"), [("café\r\n".encode("latin-1"), "is not UTF-8 text (invalid"),
                                            (LINES.encode("utf-16-le"), "bytes are NUL, where utf-16le text")])
def test_read_utf8_with_newlines_false_refuses_what_it_refuses_by_default(tmp_path, data, said):
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    refusals = []
    for newlines in (True, False):
        with pytest.raises(EdgeSDKError, match="--text .* is not UTF-8 text") as refused:
            read_utf8(path, "--text", newlines=newlines)
        refusals.append((refused.value.problem, refused.value.fix))
    assert refusals[0] == refusals[1]
    assert said in refusals[1][0]
    assert "iconv" in refusals[1][1]


def test_the_llama_perplexity_reading_keeps_crlf_and_drops_one_trailing_newline(tmp_path):
    from edgesdk.cli_eval import _text_as_llama_perplexity_reads

    path = tmp_path / "text.txt"
    path.write_bytes(b"first line\r\nsecond line\r\n")
    assert _text_as_llama_perplexity_reads(path) == "first line\r\nsecond line\r"  # as llama-perplexity -f reads it
    path.write_bytes("café\r\n".encode("latin-1"))
    with pytest.raises(EdgeSDKError, match=r"--text .* is not UTF-8 text \(invalid") as refused:
        _text_as_llama_perplexity_reads(path)
    assert "iconv -f" in refused.value.fix
    with pytest.raises(EdgeSDKError, match="cannot be read"):
        _text_as_llama_perplexity_reads(tmp_path / "gone.txt")


def test_eval_llama_perplexity_scores_a_crlf_text_with_its_carriage_returns(tiny_bundle, tmp_path):
    """The figure's character count is the text's as llama-perplexity reads it: every CR kept."""
    text = "".join(f"line {i} of the river text and the mill\r\n" for i in range(20))
    path = tmp_path / "crlf.txt"
    path.write_bytes(text.encode("utf-8"))
    run = subprocess.run([sys.executable, "-m", "edgesdk", "eval", str(tiny_bundle.path), "-f", str(path), "-c", "32",
                          "--method", "llama-perplexity", "--max-chars", "0", "--chunks", "1", "--json"],
                         capture_output=True, timeout=300)
    assert run.returncode == 0, run.stderr.decode()
    assert json.loads(run.stdout)["characters"] == len(text) - 1  # the CRs kept, one trailing \n dropped


KEY = {"model": "m1", "recipe": ["smooth", "qat"], "stage:smooth": {"alpha": 0.5},
       "stage:qat": {"alpha": 0.5, "steps": 2}, "context": 64, "edgesdk": "1.0"}


def _killed(tmp_path: Path) -> Path:
    """A work directory of KEY's build, as a killed build leaves it."""
    work = WorkDir(tmp_path / "b.build", KEY, resume=False)
    work.release()
    return work.path


@pytest.mark.parametrize(("terms", "start_over"), [("cli", "drop --resume"), ("python", "pass resume=False")])
def test_a_resume_after_an_edgesdk_upgrade_names_the_version_that_made_the_work_directory(tmp_path, terms,
                                                                                         start_over):
    path = _killed(tmp_path)
    before = (path / "state.json").read_bytes()
    with pytest.raises(BuildError, match="belongs to a different build") as refused:
        WorkDir(path, {**KEY, "edgesdk": "1.1"}, resume=True, terms=terms)
    assert refused.value.problem.endswith("the edgesdk version changed since it was written")
    fix = refused.value.fix
    assert fix.startswith(f"the work directory was made by edgesdk 1.0 (this is edgesdk 1.1): {start_over} to start "
                          "over, or install edgesdk 1.0 (pip install edgesdk==1.0)"), fix
    assert "put back" not in fix  # no argument puts back a version
    assert "edgesdk:" not in fix
    assert (path / "state.json").read_bytes() == before


def test_a_resume_after_an_upgrade_and_another_model_names_the_version_and_the_model(tmp_path):
    path = _killed(tmp_path)
    with pytest.raises(BuildError) as refused:
        WorkDir(path, {**KEY, "edgesdk": "1.1", "model": "m2"}, resume=True)
    fix = refused.value.fix
    assert "made by edgesdk 1.0" in fix
    assert fix.endswith('pass the same arguments as the killed build and put back what changed (model: "m1" then, '
                        '"m2" now)'), fix


def test_a_resume_refused_for_the_model_does_not_ask_to_put_back_stage_settings_it_makes_again(tmp_path):
    path = _killed(tmp_path)
    changed = {**KEY, "model": "m2", "stage:smooth": {"alpha": 0.8}, "stage:qat": {"alpha": 0.8, "steps": 2},
               "context": 128}
    with pytest.raises(BuildError) as refused:
        WorkDir(path, changed, resume=True)
    fix = refused.value.fix
    assert fix.startswith("drop --resume to start over, or pass the same arguments as the killed build and put back "
                          'what changed (model: "m1" then, "m2" now)'), fix
    assert "alpha" not in fix
    assert "context:" not in fix
    assert "the settings of the smooth stage or a stage before it" in fix
    assert "can stay as now (a resume makes the steps that read them again)" in fix
    # as it says: the model put back, the resume goes on, making the changed stages and the export again
    work = WorkDir(path, {**changed, "model": "m1"}, resume=True)
    work.release()
    assert sorted(work.redone) == ["context", "stage:qat", "stage:smooth"]


def test_a_resume_with_another_edgesdk_and_other_stage_settings_asks_for_the_version_only(tmp_path):
    path = _killed(tmp_path)
    with pytest.raises(BuildError) as refused:
        WorkDir(path, {**KEY, "edgesdk": "1.1", "stage:qat": {"alpha": 0.5, "steps": 3}}, resume=True)
    fix = refused.value.fix
    assert "install edgesdk 1.0" in fix
    assert "put back" not in fix
    assert "qat.steps" not in fix
    assert "the settings of the qat stage or a stage before it" in fix
