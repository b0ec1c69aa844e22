"""``edgesdk serve --responses-kept N``: how many finished responses POST /v1/responses keeps for
previous_response_id and GET /v1/responses/{id}; 0 keeps none."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tests._utils.serve_command import serve_command


def _kept_after_one_answer(bundle, cwd, *options: str) -> int:
    """The status of GET /v1/responses/{id} for the response the real serve command has just answered."""
    with serve_command(bundle, cwd, *options) as url:
        body = json.dumps({"model": "m", "input": "hi", "max_output_tokens": 2}).encode()
        request = urllib.request.Request(url + "/v1/responses", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            ident = json.loads(response.read())["id"]
        try:
            with urllib.request.urlopen(f"{url}/v1/responses/{ident}", timeout=60) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code


def test_responses_kept_0_keeps_none_and_the_default_keeps_them(tiny_bundle, tmp_path):
    assert _kept_after_one_answer(tiny_bundle.path, tmp_path) == 200
    assert _kept_after_one_answer(tiny_bundle.path, tmp_path, "--responses-kept", "0") == 404
    assert _kept_after_one_answer(tiny_bundle.path, tmp_path, "--responses-kept-mib", "0") == 404
