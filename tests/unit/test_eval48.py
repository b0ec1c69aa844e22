"""Evaluation review 48.

- ``eval --last-word`` with --max-chars read the part kept as it was, the paragraph the cut falls inside too: where
  that paragraph's head held 40-150 words and the cut fell right after one of its sentences (" ."), the head passed
  for a whole paragraph, and the task scored the word before that sentence's full stop as a paragraph's last word
  (on WikiText-2's wiki.valid.raw about 1 cut in 300). LAMBADA's cloze, and lm-evaluation-harness's lambada, score a
  passage's last word only: the paragraph the cut falls inside is now left out.
- ``eval --json`` gave no figure of the text scored: under --method llama-perplexity, where --max-chars (200,000 by
  default) cut the file, the text output says the figure is not llama-perplexity's for the file, and the JSON said
  nothing. It now gives the context and the characters of the text and of the part scored.
"""

from __future__ import annotations

import json

import pytest

from tests.unit.test_cli import assert_ok, invoke

WORDS = ("the river ran past an old mill where farmers brought grain each autumn and the miller kept a ledger of "
         "every sack that crossed his scale").split()


def _sentence(count: int, last: str) -> str:
    """``count`` words, the last one ``last``, then " ." (WikiText's form)."""
    body = [WORDS[i % len(WORDS)] for i in range(count - 1)]
    return " ".join([*body, last]) + " ."


def _text_cut_after_a_sentence() -> tuple[str, int]:
    """(text, max_chars): a whole paragraph, then a second one that --max-chars cuts right after its first
    sentence, a sentence of 45 words ending in ' .' ("alpha"), before the paragraph's own last word ("omega")."""
    first = " " + _sentence(50, "harvest")
    second_head = " " + _sentence(45, "alpha")
    second = second_head + " " + _sentence(20, "omega")
    text = f"{first}\n{second}\n"
    return text, len(first) + 1 + len(second_head)


def test_the_paragraph_the_cut_falls_inside_is_not_a_document():
    from edgesdk.cli_eval import _last_word_documents
    from edgesdk.evaluate import last_word_documents

    text, cut = _text_cut_after_a_sentence()
    assert [word for _, word in last_word_documents(text)] == ["harvest", "omega"]  # the paragraphs' last words
    assert [word for _, word in _last_word_documents(text, "text.txt", cut)] == ["harvest"]
    assert [word for _, word in _last_word_documents(text, "text.txt", None)] == ["harvest", "omega"]
    # a cut at a paragraph's end keeps it whole, with a CR LF line end too
    assert [word for _, word in _last_word_documents(text, "text.txt", len(text) - 1)] == ["harvest", "omega"]
    crlf = text.replace("\n", "\r\n")
    assert [word for _, word in _last_word_documents(crlf, "text.txt", len(crlf) - 2)] == ["harvest", "omega"]


def test_a_cut_inside_the_only_paragraph_leaves_nothing_and_says_so():
    from edgesdk.cli_eval import _last_word_documents
    from edgesdk.errors import EdgeSDKError

    paragraph = " " + _sentence(45, "alpha") + " " + _sentence(20, "omega")
    with pytest.raises(EdgeSDKError) as found:
        _last_word_documents(paragraph + "\n", "text.txt", len(" " + _sentence(45, "alpha")))
    assert "has no paragraph to score in its first" in found.value.problem
    assert "raise --max-chars" in found.value.fix


@pytest.fixture(scope="module")
def cut_text(tmp_path_factory):
    text, cut = _text_cut_after_a_sentence()
    path = tmp_path_factory.mktemp("eval48") / "wiki.txt"
    path.write_text(text, encoding="utf-8")
    return path, cut


def test_eval_last_word_scores_whole_paragraphs_only(tiny_bundle, cut_text):
    path, cut = cut_text
    found = invoke("eval", tiny_bundle.path, "--text", path, "--context", 32, "--max-chars", cut, "--last-word",
                   "--json")
    assert_ok(found)
    assert json.loads(found.stdout)["last_word"]["documents"] == 1


def test_eval_json_gives_the_text_scored(tiny_bundle, cut_text):
    path, cut = cut_text
    text = path.read_bytes().decode("utf-8")[:-1]  # as llama-perplexity -f reads it: one trailing newline dropped
    found = invoke("eval", tiny_bundle.path, "--text", path, "--context", 32, "--method", "llama-perplexity",
                   "--max-chars", cut, "--json")
    assert_ok(found)
    data = json.loads(found.stdout)
    assert (data["method"], data["context"], data["characters"], data["characters_scored"]) == (
        "llama-perplexity", 32, len(text), cut)
    whole = json.loads(invoke("eval", tiny_bundle.path, "--text", path, "--context", 32, "--max-chars", 0,
                              "--json").stdout)
    assert (whole["method"], whole["characters"], whole["characters_scored"]) == ("windows", len(text) + 1,
                                                                                   len(text) + 1)
