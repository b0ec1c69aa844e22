"""``edgesdk run`` as its pieces hand it on (edgesdk/cli_run.py: RunSettings, the unused-option warnings,
Answerer; edgesdk/cli_interactive.py: Chat): what each piece decides, seen from the command line."""

from __future__ import annotations

import sys

import pytest

from tests.unit.test_cli import assert_ok, invoke


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " is not used: " in line]


def test_each_option_that_does_nothing_is_named_once_in_the_order_run_checks_them(tiny_bundle):
    """Sampling options beside greedy decoding, a penalty window without penalties, a thermal option without its
    mode, then the prompt's options that --raw or --prompt leave without effect: one line each, the run goes on."""
    result = invoke("run", tiny_bundle.path, "-p", "Hello", "-n", "2", "--top-p", "0.5", "--top-k", "3",
                    "--min-p", "0.1", "--seed", "1", "--repeat-last-n", "10", "--ambient", "30", "--raw",
                    "--system", "S", "--history", "--in-prefix", "X", "--in-suffix", "Y",
                    "--chat-template-kwargs", '{"a": 1}')
    assert_ok(result)
    greedy = "--temperature 0 decodes greedily (pass a temperature > 0 to sample)"
    assert _warnings(result.stderr) == [
        f"edgesdk: --top-p is not used: {greedy}",
        f"edgesdk: --top-k is not used: {greedy}",
        f"edgesdk: --min-p is not used: {greedy}",
        f"edgesdk: --seed is not used: {greedy}",
        "edgesdk: --repeat-last-n is not used: it is the window of the penalties, and none is on (pass "
        "--repeat-penalty other than 1, or a --presence-penalty or --frequency-penalty)",
        "edgesdk: --ambient is not used: it works with --simulate-thermal",
        "edgesdk: --system is not used: --raw feeds the prompt as it is",
        "edgesdk: --history is not used: --prompt answers one prompt (leave it out to chat)",
        "edgesdk: --in-prefix is not used: it goes with each prompt read from stdin, and --prompt is answered as "
        "it is",
        "edgesdk: --in-suffix is not used: it goes with each prompt read from stdin, and --prompt is answered as "
        "it is",
        "edgesdk: --chat-template-kwargs is not used: --raw feeds the prompt as it is",
    ]


def test_options_that_are_used_draw_no_warning(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "Hello", "-n", "2", "--temperature", "0.7", "--top-p", "0.5",
                    "--top-k", "3", "--min-p", "0.1", "--seed", "1", "--repeat-penalty", "1.1",
                    "--repeat-last-n", "10", "--system", "S", "--chat-template-kwargs", '{"a": 1}')
    assert_ok(result)
    assert _warnings(result.stderr) == []


def test_piped_input_ends_at_the_first_bad_line_after_answering_the_lines_before(tiny_bundle):
    """Without a terminal an error ends the session (exit 1), as a script expects: the lines before it are
    answered, each on its own, and the lines after it are not read."""
    alone = invoke("run", tiny_bundle.path, "-p", "Hello", "-n", "3")
    assert_ok(alone)
    result = invoke("run", tiny_bundle.path, "-n", "3", input="Hello\n/read\nAfter\n")
    assert result.exit_code == 1, result.output
    assert "error: /read names no file" in result.stderr
    assert result.stdout == alone.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals (Linux)")
def test_a_prompt_from_a_file_at_a_terminal_is_answered_once_without_a_chat(tiny_bundle, tmp_path):
    """-f gives the prompt as -p does: at a terminal too the run answers it and ends, showing no '> ' prompt
    and reading nothing from the terminal."""
    from tests._utils.terminal import TerminalSession
    from tests.unit.test_cli_run_interactive37 import ENV, _argv, _default_signals, _finish

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Edge boards run", encoding="utf-8")
    with TerminalSession(_argv(tiny_bundle.path, "-n", "3", "--stats", "-f", prompt), ENV,
                         _default_signals) as terminal:
        _finish(terminal)  # the process ends by itself: nothing is typed
        assert terminal.process.returncode == 0, terminal.text
    assert "> " not in terminal.text
    assert terminal.text.count("[ort-cpu] prompt ") == 1, terminal.text
