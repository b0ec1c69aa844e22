"""Review of the Python API's llama-cpp-python ``Llama`` methods (51st stop, second pass), on the tiny bundle,
against abetlen/llama-cpp-python llama_cpp/llama.py and _internals.py:

- ``tokenize(text: bytes, add_bos=True, special=False)``: bytes and the two flags (positional or named) are taken
  as llama-cpp-python takes them (they were refused: bytes with a RequestError, the flags with a TypeError);
- ``detokenize(tokens, prev_tokens=None, special=False)`` gives bytes, a special token's text only with
  ``special=True`` (it gave a str with special tokens written out, and took neither keyword);
- ``n_ctx()``, ``n_vocab()``, ``n_embd()``, ``token_bos()``, ``token_eos()``, ``token_nl()`` and ``reset()`` exist;
- ``save_state``, ``load_state`` and ``metadata`` are refused by name with what to use instead;
- ``create_completion(logprobs=True)`` is one alternative per token, as llama-cpp-python's ``[:logprobs]`` reads it
  (it was refused).
"""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=3) as loaded:
        yield loaded


def test_tokenize_takes_llama_cpp_python_s_bytes_and_flags(model):
    end = model.runtime.tokenizer.eos_token
    assert model.tokenize(b"Hello there") == model.tokenize("Hello there")
    assert model.tokenize(b"Hello there", True, False) == model.tokenize("Hello there")
    assert model.tokenize(b"Hello", add_bos=False) == model.tokenize("Hello", add_special=False)
    one = model.tokenize(end.encode(), False, True)  # special=True: the special token's text is that token
    assert one == model.tokenize(end, add_special=False, parse_special=True)
    assert len(one) == 1
    assert len(model.tokenize(end.encode(), add_bos=False, special=False)) > 1
    with pytest.raises(RequestError) as caught:
        model.tokenize("Hello", add_bos=True, add_special=False)
    assert caught.value.param == "add_bos"
    with pytest.raises(RequestError) as caught:
        model.tokenize(b"\xff\xfe")
    assert caught.value.param == "text"
    assert "expected UTF-8 bytes" in str(caught.value)
    with pytest.raises(RequestError) as caught:
        model.tokenize("Hello", special="yes")
    assert caught.value.param == "special"


def test_detokenize_gives_llama_cpp_python_s_bytes(model):
    ids = model.tokenize("Hello héllo", add_special=False)
    assert model.detokenize(ids) == "Hello héllo".encode()
    assert model.detokenize(np.array(ids), prev_tokens=ids[:1]) == "Hello héllo".encode()
    # a token that ends inside a character gives its bytes alone, as llama_token_to_piece does
    assert b"".join(model.detokenize([token]) for token in ids) == "Hello héllo".encode()
    end = model.runtime.tokenizer.eos_token
    with_end = model.tokenize(f"hi{end}", add_special=False, parse_special=True)
    assert model.detokenize(with_end) == b"hi"  # special=False: a control token gives no text
    assert model.detokenize(with_end, special=True) == f"hi{end}".encode()
    with pytest.raises(RequestError) as caught:
        model.detokenize([1], prev_tokens=[-1])
    assert caught.value.param == "prev_tokens[0]"
    with pytest.raises(RequestError) as caught:
        model.detokenize([1, model.n_vocab()])
    assert caught.value.param == "tokens[1]"


def test_the_sizes_and_special_tokens_are_llama_cpp_python_s_methods(model):
    tokenizer = model.runtime.tokenizer
    assert model.n_ctx() == model.max_context == 256
    assert model.n_vocab() == tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    assert model.n_embd() == model.manifest["model"]["after"]["hidden_size"]
    assert model.token_bos() == tokenizer.token_id(model.manifest["tokenizer"]["bos_token"])
    assert model.token_eos() == tokenizer.token_id(tokenizer.eos_token)
    assert model.detokenize([model.token_nl()]) == b"\n"


def test_reset_makes_the_next_prompt_prefill_whole(model):
    model("The quick brown fox", max_tokens=2)
    assert model("The quick brown fox", max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    model.reset()
    assert model("The quick brown fox", max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize(("name", "hint"), [("save_state", "model.save_prompt_cache(path)"),
                                            ("load_state", "model.load_prompt_cache(path)"),
                                            ("metadata", "model.manifest holds")])
def test_llama_cpp_python_s_state_and_metadata_are_refused_with_what_to_use(model, name, hint):
    with pytest.raises(AttributeError) as caught:
        getattr(model, name)
    assert f"(llama-cpp-python's Llama.{name}): " in str(caught.value)
    assert hint in str(caught.value)
    assert not hasattr(model, "no_such_thing")


def test_a_completion_s_logprobs_true_is_one_alternative(model):
    answer = model("The quick brown fox", max_tokens=2, logprobs=True)
    assert answer["choices"] == model("The quick brown fox", max_tokens=2, logprobs=1)["choices"]
    assert all(len(top) == 1 for top in answer["choices"][0]["logprobs"]["top_logprobs"])
