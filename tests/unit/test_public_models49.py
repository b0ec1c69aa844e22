"""Under an API key the model list stays open, as llama-server leaves it (tools/server/server-http.cpp,
``get_public_endpoints``: ``/health``, ``/v1/health``, ``/models``, ``/v1/models`` and ``/``): a client that lists
the models before it sends a key got a 401. A model's card under the list and every other route still want the
key."""

from __future__ import annotations

import json

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served


def test_the_model_list_is_open_under_an_api_key_and_the_rest_is_not(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="secret")
    try:
        listed = [server.request("GET", path) for path in ("/v1/models", "/models")]
        card_status, _, _ = server.request("GET", "/v1/models/tiny-host")
        props_status, _, _ = server.request("GET", "/props")
        chat_status, _, _ = server.request("POST", "/v1/chat/completions",
                                           {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    finally:
        server.close()
    for status, _, payload in listed:
        assert status == 200, payload
        assert [model["id"] for model in json.loads(payload)["data"]] == ["tiny-host"]
    assert (card_status, props_status, chat_status) == (401, 401, 401)
