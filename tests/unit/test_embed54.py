"""Review 54 of the embeddings and prompt cache area.

- edgesdk/cli_prompt_cache.py: a Ctrl-C before the prefill of a prompt that shares nothing with the --prompt-cache
  file (the KV cache emptied, a thermal wait before the prefill) was said to have stopped the answer "inside a step":
  an empty cache was taken for one whose length no longer matches its tokens. It is "before its prompt was
  prefilled".
- edgesdk/serve/embeddings.py: an input mixing token ids and strings with something else among them (``[12, 2.5,
  "text"]``, ``[[12, "text", null]]``) was refused as ``'input[0]' must be a string or ... got int``, naming the
  array's first id, which is fine, and not the item that is wrong; a boolean in such an input named the whole array
  in the answer's ``param``.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.embeddings import parse_embedding_request, parse_native_embedding_request


@pytest.fixture
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _written(runtime, path, ids: list[int]) -> None:
    """A --prompt-cache-all file at ``path`` holding the KV cache of ``ids``."""
    from edgesdk.cli_prompt_cache import load_prompt_cache
    from edgesdk.runtime.prompt_cache import PromptCache

    cache = PromptCache(runtime.backend)
    written = load_prompt_cache(path, cache, runtime, False, "all")
    written.begin(ids)
    cache.start(ids)
    runtime.backend.prefill(np.asarray(ids[cache.reused:], dtype=np.int64))
    cache.took(ids[cache.reused:])
    written.finished()


@pytest.mark.parametrize("mode", ["all", "prompt"])
def test_a_ctrl_c_before_the_prefill_of_a_prompt_sharing_nothing_with_the_file_says_so(runtime, tmp_path, capsys,
                                                                                      mode):
    from edgesdk.cli_prompt_cache import load_prompt_cache
    from edgesdk.runtime.prompt_cache import PromptCache

    path = tmp_path / "prompt.cache"
    _written(runtime, path, [5, 6, 7, 8, 9, 10])
    before = path.read_bytes()
    runtime.backend.reset()
    cache = PromptCache(runtime.backend)
    kept = load_prompt_cache(path, cache, runtime, False, mode)
    other = [50, 51, 52, 53]
    kept.begin(other)
    cache.start(other)  # nothing shared: the KV cache is emptied, and the prefill has not begun
    assert cache.tokens == []
    assert runtime.backend.position == 0
    capsys.readouterr()
    kept.interrupted()
    said = capsys.readouterr().err
    assert "is not rewritten: the answer was stopped before its prompt was prefilled" in said
    assert "inside a step" not in said
    assert path.read_bytes() == before


@pytest.mark.parametrize(("value", "param", "shown"), [
    ([12, 2.5, "text"], "input[1]", "got 2.5"),
    (["text", 12, None], "input[2]", "got null"),
    ([[12, "text", None]], "input[0][2]", "got null"),
    ([["text", 7], [12, "text", {"a": 1}]], "input[1][2]", 'got {"a": 1}'),
])
def test_an_input_mixing_ids_and_strings_names_the_item_that_is_neither(value, param, shown):
    with pytest.raises(ApiError) as caught:
        parse_embedding_request({"input": value})
    assert caught.value.param == param
    assert f"'{param}' must be a token id (a whole number) or a string, {shown}" in str(caught.value)


def test_the_native_route_names_the_item_in_its_own_field():
    with pytest.raises(ApiError) as caught:
        parse_native_embedding_request({"content": [12, 2.5, "text"]}, "mean")
    assert caught.value.param == "content[1]"


def test_a_boolean_in_a_mixed_input_is_named_in_the_param_and_as_json():
    with pytest.raises(ApiError) as caught:
        parse_embedding_request({"input": ["text", 12, True]})
    assert caught.value.param == "input[2]"
    assert "got true" in str(caught.value)


@pytest.mark.parametrize("value", [[12, "text"], ["a", "b"], [[1, 2], "text"], [[12, "text"], [3]]])
def test_inputs_that_are_right_are_still_taken(value):
    assert parse_embedding_request({"input": value}).inputs
