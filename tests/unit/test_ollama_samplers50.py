"""Ollama's options for samplers this runtime lacks: a value llama.cpp's sampler reads as doing nothing is taken, as
the llama-server and OpenAI routes take it (serve.api.sampler_off): typical-p and tail-free sampling do nothing from 1
up. Only the one value 1.0 was taken, so ``typical_p: 1.5`` was a 400 here and answered on /completion. The options
Ollama has dropped (``mirostat``, ``tfs_z`` ...) are ignored whatever their value, as Ollama ignores them."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import _options


@pytest.mark.parametrize("options", [{"typical_p": 1.0}, {"typical_p": 1.5}, {"tfs_z": 2}, {"mirostat": 0},
                                     {"tfs_z": 0.5}, {"mirostat": 2}])
def test_a_sampler_value_that_does_nothing_is_taken(options):
    _options({"options": options})


@pytest.mark.parametrize(("options", "named"), [({"typical_p": 0.9}, "options.typical_p"),
                                                ({"typical_p": "1.5"}, "options.typical_p")])
def test_a_sampler_value_that_would_act_is_refused_by_name(options, named):
    with pytest.raises(ApiError) as caught:
        _options({"options": options})
    assert named in str(caught.value)


def test_the_python_api_takes_tail_free_sampling_from_1_up_as_off(tiny_bundle):
    """llama-cpp-python's ``tfs_z`` was taken at 1.0 alone; from 1 up the sampler does nothing (as Ollama's route
    reads it now), and below 1 it is still refused by name."""
    import edgesdk
    from edgesdk.api import RequestError

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        plain = model.create_completion("The tide", max_tokens=4)["choices"][0]["text"]
        assert model.create_completion("The tide", max_tokens=4, tfs_z=2.0)["choices"][0]["text"] == plain
        with pytest.raises(RequestError, match="tfs_z=0.5"):
            model.create_completion("The tide", max_tokens=4, tfs_z=0.5)
