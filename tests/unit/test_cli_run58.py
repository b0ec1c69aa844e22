"""``edgesdk run``: a process started with stdin closed, an empty option value that named the current directory, and
warnings that name the option the user typed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.unit.test_cli import assert_ok, invoke


def run_with_stdin_closed(bundle, *options: str) -> subprocess.CompletedProcess:
    """``edgesdk run BUNDLE OPTIONS <&-``: Python's ``sys.stdin`` is None there."""
    return subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle), "--threads", "1", "-n", "2", *options],
                          preexec_fn=lambda: os.close(0), capture_output=True, text=True, timeout=300)


def test_prompts_from_a_closed_stdin_are_refused_by_name(tiny_bundle):
    """Without --prompt the prompts come from stdin; with stdin closed run ended in an AttributeError traceback
    ('NoneType' object has no attribute 'isatty') once the bundle had loaded."""
    result = run_with_stdin_closed(tiny_bundle.path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "the prompts are read from stdin, and this process has none (it was closed)" in result.stderr
    assert "fix: pass -p TEXT or -f FILE" in result.stderr


@pytest.mark.parametrize("mode", ["-cnv", "-i"])
def test_a_chat_after_the_prompt_ends_at_a_closed_stdin(tiny_bundle, mode):
    """-cnv / -i answer --prompt, then read stdin: with stdin closed that chat ends at once, as at the end of its
    input, instead of a traceback before the prompt was even answered."""
    result = run_with_stdin_closed(tiny_bundle.path, "-p", "hi", mode, "--ignore-eos", "--stats")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count(" new tok,") == 1, result.stderr  # the prompt's answer, and no other
    assert " 2 new tok," in result.stderr, result.stderr


@pytest.mark.parametrize(("option", "hint"), [("-f", "'--file' / '-f'"),
                                               ("-sysf", "'--system-prompt-file' / '-sysf'"),
                                               ("--grammar-file", "'--grammar-file'"),
                                               ("-jf", "'--json-schema-file' / '-jf'"),
                                               ("--prompt-cache", "'--prompt-cache'")])
def test_an_empty_file_option_is_refused_as_empty(tmp_path, option, hint):
    """``-f "$FILE"`` with the variable unset: Path("") is the current directory, and the refusal said "'.' is not a
    file (it is a directory)", a path the user never typed."""
    extra = () if option == "-f" else ("-p", "hi")
    result = invoke("run", tmp_path, option, "", *extra)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"Invalid value for {hint}: an empty path names no" in result.stderr
    assert "'.'" not in result.stderr


def test_an_empty_json_schema_is_refused_as_empty(tmp_path):
    """``-j ""`` was read as the path '.', and refused as a directory."""
    result = invoke("run", tmp_path, "-j", "", "-p", "hi")
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Invalid value for '--json-schema': is empty: an empty path names no schema file" in result.stderr
    assert "'.'" not in result.stderr


@pytest.mark.parametrize(("options", "named"), [(("-sysf", "FILE"), "--system-prompt-file"),
                                                (("--system", "Be brief."), "--system")])
def test_an_unused_system_message_is_told_under_the_option_given(tiny_bundle, tmp_path, options, named):
    """-sysf with --raw was told as "--system is not used", an option the user never typed."""
    system_file = tmp_path / "system.txt"
    system_file.write_text("Be brief.\n", encoding="utf-8")
    options = tuple(str(system_file) if value == "FILE" else value for value in options)
    result = invoke("run", tiny_bundle.path, "-p", "hi", "-n", 2, "--threads", 1, "--raw", *options)
    assert_ok(result)
    assert f"edgesdk: {named} is not used: --raw feeds the prompt as it is" in result.stderr
