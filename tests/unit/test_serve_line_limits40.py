"""llama-server's code-completion limits on ``/completion`` and ``/infill``: ``n_indent`` (a line after the first new
line indented less ends the answer, cut before its text) and ``t_max_predict_ms`` (past it, a new line ends the
answer), as server-context.cpp ``process_token`` applies them; llama.vscode and llama.vim send both with every
request."""

from __future__ import annotations

import pytest

from edgesdk.serve.line_limits import LineLimits


def _run(limits: LineLimits, tokens: list[str], times: list[float] | None = None) -> str:
    """The answer ``tokens`` (each token's text) make under ``limits``, token by token."""
    text = ""
    for index, piece in enumerate(tokens):
        text += piece
        keep = limits.after_token(text, piece, (times or [0.0] * len(tokens))[index])
        if keep is not None:
            return text[:keep]
    return text


def test_a_line_indented_less_than_n_indent_ends_the_answer_cut_before_its_text():
    tokens = ["return", " x", "\n", "    ", "y", "\n", "def", " g"]
    assert _run(LineLimits(n_indent=4), tokens) == "return x\n    y\n"  # 'def' starts at column 0
    assert _run(LineLimits(n_indent=0), tokens) == "".join(tokens)  # off


def test_the_first_line_is_never_judged_and_a_blank_line_ends_the_answer():
    # the cursor's own line may be indented less; an empty line's new line comes where its text should
    assert _run(LineLimits(n_indent=8), ["x", " = 1", "\n", "        ", "y", "\n", "\n", "        z"]) == \
        "x = 1\n        y\n"
    assert _run(LineLimits(n_indent=2), ["a", "b"]) == "ab"  # no new line: nothing to judge


def test_past_t_max_predict_ms_a_new_line_ends_the_answer():
    tokens, times = ["a", "\n", "b", "c", "\n", "d"], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert _run(LineLimits(t_max_predict_ms=250), tokens, times) == "a\nbc\n"  # the new line at 0.4 s ends it
    assert _run(LineLimits(t_max_predict_ms=1000), tokens, times) == "".join(tokens)


@pytest.mark.parametrize(("field", "value"), [("n_indent", -1), ("n_indent", 2.5), ("n_indent", "4"),
                                              ("t_max_predict_ms", -5), ("t_max_predict_ms", True)])
def test_a_bad_limit_is_refused_naming_it(served, field, value):
    status, body = served.post("/completion", {"prompt": "x", "n_predict": 4, field: value})
    assert status == 400, body
    assert body["error"]["param"] == field


def test_completion_applies_n_indent_and_t_max_predict_ms(served, runtime):
    """Every token made a new line (logit_bias): n_indent 1 judges the second line, blank, and ends the answer at
    the first new line; a t_max_predict_ms far below a step ends it at the second token's new line."""
    newline = runtime.tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1
    body = {"prompt": "def f(x):", "n_predict": 8, "logit_bias": [[newline[0], 100.0]], "cache_prompt": False}
    status, plain = served.post("/completion", body)
    assert status == 200, plain
    assert (plain["content"], plain["tokens_predicted"]) == ("\n" * 8, 8)
    status, indented = served.post("/completion", {**body, "n_indent": 1})
    assert status == 200, indented
    assert (indented["content"], indented["stop_type"], indented["tokens_predicted"]) == ("\n", "limit", 3)
    status, timed = served.post("/completion", {**body, "t_max_predict_ms": 1e-6})
    assert status == 200, timed
    assert (timed["content"], timed["stop_type"], timed["tokens_predicted"]) == ("\n\n", "limit", 2)
