"""Ollama's /api/chat and /api/generate (edgesdk/serve/ollama.py):

* a sampler option this runtime lacks (``typical_p``) sent with a value of the wrong type (``"typical_p": "1"``, a
  string, as a form field's value often arrives) was refused as a sampler that is not supported, with the advice to
  set it to its off value, 1, the value the client had sent as text: the type, which Ollama's Options.FromMap refuses
  ("option \\"typical_p\\" must be of type float32"), was never named. The options Ollama has dropped
  (``mirostat``, ``tfs_z`` ...) are ignored whatever their type, as Ollama ignores them."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat, parse_generate

NAME = "tiny-host"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("name", "value", "kind"), [("typical_p", "1", "float32"), ("typical_p", True, "float32"),
                                                      ("typical_p", [1], "float32")])
@pytest.mark.parametrize("parse", [parse_chat, parse_generate])
def test_a_missing_sampler_of_the_wrong_type_is_refused_for_its_type(parse, name, value, kind):
    with pytest.raises(ApiError) as refused:
        parse({"model": NAME, "messages": MESSAGES, "prompt": "hi", "options": {name: value}}, NAME)
    assert refused.value.status == 400
    assert refused.value.param == f"options.{name}"
    assert refused.value.message.startswith(f"option \"{name}\" must be of type {kind}")
    assert "is not supported" not in refused.value.message  # the sampler is not what is wrong


@pytest.mark.parametrize(("name", "value"), [("mirostat", 0), ("mirostat", 0.0), ("typical_p", 1), ("tfs_z", 2.5)])
def test_a_missing_sampler_set_off_as_a_number_is_still_taken(name, value):
    assert parse_chat({"model": NAME, "messages": MESSAGES, "options": {name: value}}, NAME).request is not None
