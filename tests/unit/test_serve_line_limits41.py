"""``n_indent`` and ``t_max_predict_ms`` read each token's text once (:meth:`LineLimits.push`), with the answers of
llama-server's ``process_token`` (tools/server/server-context.cpp), which scans the judged line again on every token
and finds the next new line from ``last_nl_pos``, one line a token."""

from __future__ import annotations

import random

import pytest

from edgesdk.serve.line_limits import LineLimits


def _llama_server(n_indent: int, t_max_predict_ms: float, tokens: list[str], times: list[float]) -> tuple[int, str]:
    """server-context.cpp ``process_token``'s two checks over the whole text so far, token by token: (the token that
    ended the answer, or len(tokens), and the answer's text)."""
    text, has_new_line, last_nl_pos = "", False, 0
    for index, piece in enumerate(tokens):
        text += piece
        if has_new_line and n_indent > 0:
            if last_nl_pos > 0:
                pos = last_nl_pos
                while pos < len(text) and text[pos] in (" ", "\t"):
                    pos += 1
                if pos < len(text) and pos - last_nl_pos < n_indent:
                    return index, text[:pos]
            found = text.find("\n", last_nl_pos)
            if found != -1:
                last_nl_pos = found + 1
        if "\n" in piece:
            has_new_line = True
            if t_max_predict_ms > 0 and (times[index] - times[0]) * 1e3 > t_max_predict_ms:
                return index, text
    return len(tokens), text


def _pushed(limits: LineLimits, tokens: list[str], times: list[float]) -> tuple[int, str]:
    """The same through :meth:`LineLimits.push`, which sees each token's text only."""
    pieces: list[str] = []
    for index, piece in enumerate(tokens):
        pieces.append(piece)
        keep = limits.push(piece, times[index])
        if keep is not None:
            return index, "".join(pieces)[:keep]
    return len(tokens), "".join(pieces)


PIECES = [" ", "\t", "  ", "    ", "\n", "\n\n", "\n  ", "\n    x", "a", "bc", "d\n", "  e\n\t f\n", " \n", "g\n\n  h"]


@pytest.mark.parametrize("seed", range(40))
def test_push_ends_every_answer_where_llama_server_ends_it(seed):
    chosen = random.Random(seed)
    for _ in range(25):
        tokens = [chosen.choice(PIECES) for _ in range(chosen.randint(1, 40))]
        times = [0.01 * index for index in range(len(tokens))]
        n_indent, t_max = chosen.choice([0, 1, 2, 3, 4, 6]), chosen.choice([0, 0, 50, 150])
        want = _llama_server(n_indent, t_max, tokens, times)
        assert _pushed(LineLimits(n_indent, t_max), tokens, times) == want, (tokens, n_indent, t_max)


def test_a_long_answer_ends_at_the_first_line_indented_less():
    """Ten thousand lines of a function's body, then its end: the answer is cut before the next function's text at
    the token that follows that line's new line, as in llama-server."""
    body = [piece for line in range(10_000) for piece in ("    ", f"x{line} = {line}", "\n")]
    tokens = ["return 0", "\n", *body, "def", " g():", "\n", "    pass", "\n"]
    times = [0.0] * len(tokens)
    ended_at, text = _pushed(LineLimits(n_indent=4), tokens, times)
    assert ended_at == tokens.index("def")
    assert text == "return 0\n" + "".join(body)
    assert (ended_at, text) == _llama_server(4, 0, tokens, times)
    # the same lines indented by tabs pass: a tab counts as one character of indentation, as in llama-server
    tabbed = [piece.replace("    ", "\t\t\t\t") for piece in tokens]
    assert _pushed(LineLimits(n_indent=4), tabbed, times)[0] == tokens.index("def")


def test_a_token_holding_several_lines_has_them_judged_one_a_token():
    """llama-server judges a line from the token after the one that found its new line, and finds one new line a
    token: of a token holding three, the first line is judged two tokens later, the last four tokens later, so an
    under-indented line waits for its turn."""
    tokens = ["a", "\n  b\n    c\nd", "    e", "f", "g", "h"]
    times = [0.0] * len(tokens)
    assert _pushed(LineLimits(n_indent=4), tokens, times) == (3, "a\n  ")  # '  b' judged at 'f'
    assert _pushed(LineLimits(n_indent=2), tokens[:5], times[:5]) == (5, "a\n  b\n    c\nd    efg")  # 'd' not yet
    assert _pushed(LineLimits(n_indent=2), tokens, times) == (5, "a\n  b\n    c\n")  # 'd' judged at 'h'
    assert _llama_server(2, 0, tokens, times) == (5, "a\n  b\n    c\n")


def test_past_t_max_predict_ms_the_answer_is_kept_whole_at_its_new_line():
    limits = LineLimits(t_max_predict_ms=100)
    assert [limits.push(piece, now) for piece, now in [("a", 0.0), ("\n", 0.05), ("b", 0.2), ("c\nd", 0.3)]] == \
        [None, None, None, 6]
    assert limits.length == 6
