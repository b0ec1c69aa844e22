"""``edgesdk run``'s terminal chat: a /regen whose answer fails before it shows anything keeps the exchange it was
asked to answer again (edgesdk/cli_interactive.py ``Chat._give_back``), and the next /regen makes the same draw.

The failure is a real one, not a stand-in: under the grammar ``"a" | <|im_start|> [0-9]`` an answer either writes
"a" or takes the special token ``<|im_start|>``, which shows nothing, and then finds every digit the grammar allows
banned by --logit-bias (LogitBiasError). Which way an answer goes is the sampler's draw: --top-k 2 keeps the two
tokens the grammar allows first (each biased +100 over the rest) and --temp 1000 makes them about even, so the draw is
the seed's first uniform number: --seed 64 draws "a" (0.94), the /regen's seed 65 (a --seed moves on by the /regen
count) draws <|im_start|> (0.05), and 66 would draw "a" again (0.92)."""

from __future__ import annotations

import re
import sys

import pytest

from tests._utils.signals import default_signals as _default_signals
from tests.unit.test_cli_run_interactive37 import (
    ENV,
    _argv,
    _assistant,
    _finish,
    _prompt_tokens,
    _stats_prompts,
    _user,
)

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pseudo-terminals (Linux)")

GRAMMAR = 'root ::= "a" | <|im_start|> [0-9]'
SEED = 64  # draws "a"; SEED + 1 (the first /regen's draw) <|im_start|>; SEED + 2 "a" again
ERROR = "error: the logit_bias bans every token the constraint allows next"


def _options(runtime) -> list[str]:
    """The run's sampling: the grammar's first two tokens ("a" and <|im_start|>) about even and kept alone, and every
    digit banned, so that an answer that took <|im_start|> fails with nothing shown."""
    tokenizer = runtime.tokenizer
    vocabulary = tokenizer.token_bytes()
    first = [tokenizer.token_id("a"), tokenizer.token_id("<|im_start|>")]
    digits = [vocabulary.index(bytes([digit])) for digit in b"0123456789"]
    biases = [f"{token}=100" for token in first] + [f"{token}=-inf" for token in digits]
    return ["-n", "4", "--stats", "--seed", str(SEED), "--temp", "1000", "--top-k", "2", "--grammar", GRAMMAR,
            *(option for bias in biases for option in ("--logit-bias", bias))]


def test_a_regen_that_fails_before_showing_anything_keeps_the_exchange(tiny_bundle, runtime):
    """/regen takes the last exchange back to answer it again; its answer fails before it shows anything: the error
    is told and the session goes on with the conversation as it was before /regen. A second /regen takes the same
    exchange back and makes the same draw (it fails the same way; had the first /regen's count stayed, its seed
    would have drawn "a"), and the next line's prompt is rendered over the exchange."""
    from tests._utils.terminal import TerminalSession

    argv = _argv(tiny_bundle.path, *_options(runtime))
    with TerminalSession(argv, ENV, _default_signals) as terminal:
        def at_prompt(count: int):  # the count-th '> ', whatever the line before it did
            return lambda: (len(re.findall(r"(?:^|\n)> ", terminal.text)) >= count
                            and terminal.text.rstrip().endswith(">"))

        terminal.read_until(at_prompt(1))
        for count, line in enumerate((b"hello there", b"/regen", b"/regen", b"what next"), start=2):
            terminal.type(line + b"\n")
            terminal.read_until(at_prompt(count))
        terminal.type(b"\x04")
        _finish(terminal)
    text = terminal.text
    assert terminal.process.returncode == 0, text
    assert "Traceback" not in text
    assert re.search(r"hello there\r\na\r\n", text), repr(text)  # the first answer, which the seed drew
    # each /regen's answer showed nothing before its error, which names the banned tokens and the fix
    assert len(re.findall(r"/regen\r\n" + re.escape(ERROR) + r" \(ids ", text)) == 2, repr(text)
    assert "fix: leave those tokens' bias above -inf" in text, repr(text)
    assert "there is no answer yet to generate again" not in text, repr(text)
    assert _stats_prompts(text) == [
        _prompt_tokens(runtime, [_user("hello there")]),
        _prompt_tokens(runtime, [_user("hello there"), _assistant("a"), _user("what next")]),
    ], text
