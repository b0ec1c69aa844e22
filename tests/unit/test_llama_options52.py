"""llama-cli's long options --log-disable, --no-perf, --perf, --chat-template and --chat-template-file are read by
name: the first two change nothing here and are taken with a note, the others refused with what to do instead
(--verbose-prompt, refused here once, prints the prompt's tokens: test_llama_accepts62). Each got click's bare "No such option", so a script passing --log-disable failed."""

from __future__ import annotations

import pytest

from tests.unit.test_cli import assert_ok
from tests.unit.test_clis2_50 import run


@pytest.mark.parametrize("flag", ["--log-disable", "--no-perf"])
def test_a_llama_option_that_changes_nothing_here_is_taken_with_a_note(tiny_bundle, flag):
    result = run(tiny_bundle, "-p", "hi", flag)
    assert_ok(result)
    assert flag in result.stderr


@pytest.mark.parametrize(("args", "fix"), [
    (("--perf",), "pass --stats"),
    (("--chat-template", "chatml"), "pass --raw"), (("--chat-template-file", "t.jinja"), "pass --raw"),
])
def test_a_llama_option_edgesdk_lacks_is_refused_by_its_own_name(tiny_bundle, args, fix):
    result = run(tiny_bundle, "-p", "hi", *args)
    assert result.exit_code == 2
    said = " ".join(result.stderr.split())
    assert f"{args[0]} is llama.cpp's" in said or f"{args[0]} (llama.cpp's" in said, said
    assert fix in said
    assert "No such option" not in said
