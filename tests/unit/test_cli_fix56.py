"""CLI review 56 (edgesdk/cli_llama.py, cli_bench.py, cli_serve.py, evaluate.py); each test failed before its change.

- A whole number was checked with every leading sign stripped, then read by ``int``: ``-c +-0``, ``-c --5`` and
  bench's ``-t --5`` crashed with a ValueError traceback, and ``-ngl +-5`` was taken where ``std::stoi`` refuses it.
  One sign at most is taken now, by one helper that run, serve and bench share.
- ``--log-colors``' variable was known by its current name alone (LLAMA_ARG_LOG_COLORS): llama.cpp's earlier
  LLAMA_LOG_COLORS, set for its older scripts, was neither read as the option nor said to be unread.
- serve refused a ``--draft-min`` above ``--draft-max`` naming '--draft-min' where LLAMA_ARG_SPEC_DRAFT_N_MIN gave
  it, without the variable (run named it).
- The last-word task took a word's letters as ``[^\\W\\d_]``: combining marks are not in it, so a Devanagari word or a
  decomposed "café" was passed over, and "²" or "Ⅻ" counted as letters.
"""

from __future__ import annotations

import pytest

from edgesdk.cli_llama import whole_number
from edgesdk.evaluate import last_word_documents
from tests.unit.test_cli import flat, invoke

BODY = " ".join(["the miller kept a ledger of every sack"] * 6)  # 48 words


@pytest.mark.parametrize("text", ["0", "+5", "-5", " 12 ", "-0"])
def test_a_whole_number_takes_one_sign_at_most(text):
    assert whole_number(text)
    int(text)  # what every caller does next


@pytest.mark.parametrize("text", ["+-0", "--5", "++5", "-+5", "²", "5-", "-", ""])
def test_a_whole_number_refuses_what_int_refuses(text):
    assert not whole_number(text)


@pytest.mark.parametrize("args", [("serve", "-c", "+-0"), ("run", "-p", "hi", "-c", "--5"),
                                  ("run", "-p", "hi", "-ngl", "+-5"), ("bench", "-t", "--5")])
def test_a_count_with_two_signs_is_refused_by_name_not_a_traceback(args, tmp_path):
    result = invoke(args[0], tmp_path / "nb", *args[1:])
    assert result.exit_code == 2, result.output  # a usage error, where a ValueError's traceback was
    assert f"'{args[-2]}'" in result.stderr, result.stderr
    assert f"{args[-1]!r} " in result.stderr, result.stderr


def test_bench_still_takes_a_signed_thread_count_and_a_signed_prompt_gen_pair(tmp_path):
    for args in (("-t", "-3"), ("-pg", "+5,3")):
        result = invoke("bench", tmp_path / "nb", *args)
        assert "does not exist" in result.output, result.output  # past the options, at the missing bundle
    refused = invoke("bench", tmp_path / "nb", "-pg", "-1,3")
    assert refused.exit_code == 2, refused.output
    assert "'-1,3' is not PP,TG" in refused.stderr


@pytest.mark.parametrize("variable", ["LLAMA_ARG_LOG_COLORS", "LLAMA_LOG_COLORS"])
def test_log_colors_variable_of_either_name_is_said_to_change_nothing(variable, tmp_path):
    result = invoke("run", tmp_path / "nb", "-p", "hi", env={variable: "on"})
    assert f"edgesdk: {variable} (llama.cpp's --log-colors) is accepted for llama.cpp's scripts" in result.stderr


def test_serve_names_the_variable_that_gave_a_draft_min_above_draft_max(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "--draft", tiny_bundle.path, "--draft-max", 2,
                    env={"LLAMA_ARG_SPEC_DRAFT_N_MIN": "5"})
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert "5 is more than --draft-max (2)" in said
    assert "read from the environment, LLAMA_ARG_SPEC_DRAFT_N_MIN='5'" in said, said


@pytest.mark.parametrize("word", ["नमस्ते", "cafe\u0301", "Москва", "o'clock", "Zürich-Nord"])
def test_a_last_word_of_letters_and_combining_marks_is_scored(word):
    assert last_word_documents(f"{BODY} {word} .") == [(BODY, word)]


@pytest.mark.parametrize("word", ["x²yz", "Ⅻab", "abc²", "\u0301abc", "-abc", "x_yz", "1990"])
def test_a_last_word_with_a_sign_that_is_no_letter_is_passed_over(word):
    assert last_word_documents(f"{BODY} {word} .") == []
