"""README.md's refusals and acceptances on serve's routes, checked against the code they describe (the request parsers
of edgesdk/serve, nothing mocked), so that a change of either fails here.

The Ollama section said "Images, a custom `template` and samplers the board lacks (mirostat, typical_p, tfs_z) are
refused by name": since d4a0ed6 a typical_p or tfs_z of 1 or more (which llama.cpp's samplers read as off, as the
other routes' ``serve.api.sampler_off`` does) is taken, and a ``template`` is refused on /api/generate only (Ollama's
ChatRequest has no such field, and /api/chat leaves it unread, as Ollama does an unknown field). The options Ollama
has dropped (mirostat, tfs_z ...) are ignored, as Ollama ignores them, and no longer refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import _options, parse_chat, parse_generate

ROOT = Path(__file__).resolve().parents[2]
ONE_LINE = re.sub(r"\s*\n\s*", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
SERVED = "tiny-host:latest"
MESSAGES = [{"role": "user", "content": "hi"}]


def _ollama_refusals() -> str:
    """The Ollama section's sentence on what its routes refuse by name."""
    found = re.search(r"Images, a custom `template`(.*?) are refused by name in Ollama's", ONE_LINE)
    assert found, "README.md no longer says what Ollama's routes refuse by name: update this test with it"
    return found[1]


def _refused(options: dict) -> str | None:
    """The 400's message where Ollama's ``options`` are refused, None where they are taken."""
    try:
        _options({"options": options})
    except ApiError as exc:
        return f"{exc.status} {exc}"
    return None


def test_the_ollama_samplers_the_readme_says_are_refused_are_and_those_it_says_are_taken_are():
    """Only a value that turns a missing sampler on is refused: typical_p below 1; from 1 up typical-p does nothing
    in llama.cpp and the request is taken. The options Ollama has dropped are ignored whatever their value."""
    sentence = _ollama_refusals()
    assert "typical_p, a sampler the board lacks" in sentence, sentence
    assert "below 1; from 1 up" in sentence, sentence
    assert "is taken" in sentence, sentence
    assert "mirostat" not in sentence, sentence
    assert "tfs_z" not in sentence, sentence
    dropped = re.search(r"every option Ollama does not know is ignored, as Ollama ignores it, the request answered, "
                        r"with Ollama's warning in the server's log naming each .*?, the options Ollama has dropped "
                        r"too \((.*?)\), whatever their value", ONE_LINE)
    assert dropped, "README.md no longer says the options Ollama has dropped are ignored: update this test with it"
    for name in ("mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "penalize_newline"):
        assert name in dropped[1], dropped[1]
    for options in ({"typical_p": 0.9},):
        refusal = _refused(options)
        assert refusal is not None, options
        assert refusal.startswith("400 "), refusal
        assert f"options.{next(iter(options))}" in refusal, refusal  # by name
    for options in ({"mirostat": 0}, {"typical_p": 1}, {"typical_p": 1.5}, {"tfs_z": 1.0}, {"tfs_z": 2},
                    {"mirostat": 1}, {"mirostat": 2}, {"tfs_z": 0.5}, {"mirostat_eta": "x"}, {"penalize_newline": 1}):
        assert _refused(options) is None, options


def test_a_custom_template_is_refused_where_the_readme_says():
    """`template` is a field of Ollama's GenerateRequest alone: refused on /api/generate, left unread on /api/chat."""
    assert _ollama_refusals().startswith(" on `/api/generate`"), _ollama_refusals()
    with pytest.raises(ApiError) as caught:
        parse_generate({"model": SERVED, "prompt": "hi", "template": "{{ .Prompt }}"}, SERVED)
    assert caught.value.status == 400
    assert "'template'" in str(caught.value)
    asked = parse_chat({"model": SERVED, "messages": MESSAGES, "template": "{{ .Prompt }}"}, SERVED)
    assert asked.request is not None
