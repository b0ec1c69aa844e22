"""Ollama's /api/chat, /api/generate and /api/embed (edgesdk/serve/ollama.py):

* the options Ollama has dropped (``tfs_z``, then ``mirostat``, ``mirostat_tau``, ``mirostat_eta`` and
  ``penalize_newline``; its api/types.go ``Options`` has none of them) were refused with a 400 as samplers this
  runtime lacks, where Ollama answers the request and logs "invalid option provided" naming each
  (``Options.FromMap``). SillyTavern, langflow and codecompanion.nvim send them: they are ignored here too, whatever
  their value, with that warning in the server's log. ``typical_p``, which Ollama still has, is refused below 1 as
  before."""

from __future__ import annotations

import logging

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat, parse_embed, parse_generate

NAME = "tiny-host:latest"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
DROPPED = {"mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "tfs_z": 0.5, "penalize_newline": True}
PLAIN = {"num_predict": 8, "temperature": 0, "seed": 1, "top_k": 1}


def _warned(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "edgesdk.serve.ollama" and record.levelno == logging.WARNING]


@pytest.mark.parametrize(("path", "body"), [("/api/chat", {"messages": MESSAGES}),
                                            ("/api/generate", {"prompt": "The tide"})])
def test_mirostat_and_tfs_z_are_answered_as_without_them_and_warned_of(served, caplog, path, body):
    status, plain = served.post(path, {"model": NAME, **body, "stream": False, "options": PLAIN})
    assert status == 200, plain
    assert _warned(caplog) == []
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.ollama"):
        status, answer = served.post(path, {"model": NAME, **body, "stream": False,
                                            "options": {**PLAIN, "mirostat": 2, "tfs_z": 0.5}})
    assert status == 200, answer
    key = "message" if path == "/api/chat" else "response"
    assert answer[key] == plain[key]
    assert answer["eval_count"] == plain["eval_count"]
    warned = _warned(caplog)
    assert len(warned) == 2, warned
    assert any("invalid option provided" in line and "option=mirostat " in line for line in warned), warned
    assert any("invalid option provided" in line and "option=tfs_z " in line for line in warned), warned


@pytest.mark.parametrize("value", [0, 1, 2, -1, 0.5, "2", True, [0], {"on": 1}, None])
@pytest.mark.parametrize("parse", [parse_chat, parse_generate])
def test_every_dropped_option_is_ignored_whatever_its_value(caplog, parse, value):
    plain = parse({"model": NAME, "messages": MESSAGES, "prompt": "hi", "options": PLAIN}, NAME)
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.ollama"):
        asked = parse({"model": NAME, "messages": MESSAGES, "prompt": "hi",
                       "options": {**PLAIN, **{name: value for name in DROPPED}}}, NAME)
    assert asked == plain
    warned = _warned(caplog)
    assert [line.split("option=")[1].split()[0] for line in warned] == list(DROPPED), warned


def test_the_embed_route_ignores_them_with_the_warning_too(caplog):
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.ollama"):
        asked = parse_embed({"model": NAME, "input": "hi", "options": {"num_ctx": 64, **DROPPED}}, NAME)
    assert asked.num_ctx == 64
    assert len(_warned(caplog)) == len(DROPPED)


@pytest.mark.parametrize("value", [0.5, 0, -1])
def test_typical_p_below_1_is_still_refused_by_name(value):
    with pytest.raises(ApiError) as refused:
        parse_chat({"model": NAME, "messages": MESSAGES, "options": {"typical_p": value}}, NAME)
    assert refused.value.status == 400
    assert refused.value.param == "options.typical_p"
