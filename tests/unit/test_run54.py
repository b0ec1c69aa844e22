"""``edgesdk run`` against llama-cli / llama-completion, through the real command line with the tiny random
bundle."""

from __future__ import annotations

import re

import pytest

from tests._utils.signals import default_signals
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


def answers(stderr: str) -> list[tuple[int, int]]:
    """Each answer's (prompt tokens, new tokens), from --stats' lines, in order."""
    return [(int(prompt), int(new)) for prompt, new in re.findall(r"prompt (\d+) tok.*? (\d+) new tok", stderr)]


def tokens(bundle, text: str) -> int:
    """The tokens of ``text`` as plain text, no special token added."""
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(bundle.path / "tokenizer.json")).encode(text, add_special_tokens=False).ids)


def test_a_prompt_ending_in_the_reverse_prompt_hands_control_back_unanswered(tiny_bundle):
    """llama-completion checks -r once the -p prompt is in and, where the prompt's text ends in it (a transcript
    file ending in 'User:'), reads the user's line before sampling anything; run answered the -p prompt first, the
    model writing the user's part."""
    prompt = "Transcript of a dialog between a User and an Assistant.\nUser:"
    result = invoke("run", tiny_bundle.path, "-no-cnv", "-i", "-p", prompt, "-r", "User:", "-n", 16, "--ignore-eos",
                    "--threads", 1, "--stats", input=" hello\n")
    assert_ok(result)
    assert "ends in the reverse prompt 'User:'" in result.stderr
    found = answers(result.stderr)
    assert len(found) == 1, result.stderr  # the typed line's answer only
    # the typed line goes on the -p prompt, which is in its prompt though it was never answered
    assert found[0][0] > tokens(tiny_bundle, prompt), result.stderr


def test_ctrl_c_in_the_answer_to_the_prompt_of_an_interactive_session_stops_only_that_answer(tiny_bundle, tmp_path):
    """llama-completion -i -p: a Ctrl-C while the -p prompt is answered hands control to the user (its
    ``sigint_handler`` exits 130 only where it is already waiting for input), as a Ctrl-C in any later answer does;
    run ended the whole session with 130 there. The answer never ends by itself (-n -1 with --context-shift and
    --ignore-eos), so the Ctrl-C, sent once it has begun, always lands in it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    leader, follower = os.openpty()  # stdin a terminal: the interactive session
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "run", str(tiny_bundle.path), "-i", "-p",
                                    "Hello", "-n", "-1", "--context-shift", "--ignore-eos", "--threads", "1"],
                                   stdin=follower, stdout=stdout, stderr=stderr,
                                   env={**os.environ, "EDGESDK_HUGE_PAGES": "0"},
                                   preexec_fn=default_signals)  # a suite started in the background ignores SIGINT
    os.close(follower)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang only: the answer has no end of its own
        while out.stat().st_size == 0 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, err.read_text()
        process.send_signal(signal.SIGINT)
        os.write(leader, b"/exit\n")
        process.wait(timeout=120)
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err.read_text()
    assert "answer stopped" in err.read_text()
