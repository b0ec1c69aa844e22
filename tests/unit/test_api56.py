"""edgesdk/api.py and edgesdk/api_checks.py: build_bundle refuses a negative data_skip_chars or generated_sequences
naming its own argument; load() reads top_k below 0 as off, as ``edgesdk serve --top-k`` and a request's top_k do; a
max_tokens the Python API cannot take is refused with what it means here (0 is no limit, not "the prompt only");
NumPy bools are taken by tokenize's flags and embed's normalize, as by the other methods' flags."""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError

CHAT = [{"role": "user", "content": "Which platform does the night train leave from?"}]


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        yield loaded


@pytest.mark.parametrize("name", ["data_skip_chars", "generated_sequences"])
def test_build_bundle_refuses_a_negative_count_naming_its_argument(name):
    with pytest.raises(edgesdk.EdgeSDKError, match=rf"build_bundle\(\): {name}=-5: expected a whole number >= 0") \
            as caught:
        edgesdk.build_bundle("host", **{name: -5})
    assert f"pass {name}=0 or more" in caught.value.fix
    assert "--" not in caught.value.fix  # no command-line option named to a Python caller


def test_load_reads_a_negative_top_k_as_off(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, top_k=-1) as loaded:
        assert loaded._completer.defaults.top_k == 0
        off = loaded.create_completion("The night train", max_tokens=4, temperature=0.8, seed=7)
    with edgesdk.load(tiny_bundle.path, threads=1, top_k=0) as loaded:
        assert loaded.create_completion("The night train", max_tokens=4, temperature=0.8,
                                        seed=7)["choices"] == off["choices"]


@pytest.mark.parametrize("method", ["create_completion", "create_chat_completion"])
@pytest.mark.parametrize("value", [-5, 2.5, True, "8"])
def test_a_max_tokens_refusal_says_what_it_means_in_python(model, method, value):
    call = getattr(model, method)
    with pytest.raises(RequestError, match=rf"{method} \(max_tokens\): max_tokens is ") as caught:
        call("Once" if method == "create_completion" else CHAT, max_tokens=value)
    assert "None, 0 or -1 for no limit but the context" in caught.value.problem
    assert "prompt only" not in caught.value.problem  # the HTTP route's 0, which is no limit here


def test_max_tokens_whole_floats_and_numpy_integers_are_taken(model):
    assert model.create_completion("Once", max_tokens=2.0)["usage"]["completion_tokens"] <= 2
    assert model.create_chat_completion(CHAT, max_tokens=np.int64(2))["usage"]["completion_tokens"] <= 2


def test_numpy_bools_are_taken_by_tokenize_and_embed(model):
    text = "the night train"
    assert model.tokenize(text, add_special=np.False_, parse_special=np.True_) == \
        model.tokenize(text, add_special=False, parse_special=True)
    assert model.embed(text, normalize=np.True_) == model.embed(text, normalize=True)
    assert model.embed(text, normalize=np.False_) == model.embed(text, normalize=False)


def test_numpy_override_values_are_the_numbers_they_hold():
    """build_bundle(overrides={...}) wrote a NumPy scalar through json.dumps' default=str: the string "100", which
    the recipe kept as text for an int setting."""
    from edgesdk.api import override_items
    from edgesdk.build.recipes import load_recipe

    items = override_items({"qat.steps": np.int64(100), "qat.lr": np.float32(0.5), "qat.train_embedding": np.False_})
    recipe = load_recipe("default").with_overrides(items, terms="python")
    config = next(entry.config for entry in recipe.stages if entry.stage == "qat")
    assert (config["steps"], config["lr"], config["train_embedding"]) == (100, 0.5, False)
    assert [type(config[name]) for name in ("steps", "lr", "train_embedding")] == [int, float, bool]
