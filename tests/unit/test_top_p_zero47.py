"""``top_p`` 0 is in OpenAI's range [0, 1] and, in llama.cpp's top-p sampler (min_keep 1), keeps the likeliest token
alone: a sampled answer at top_p 0 is the greedy one. It was refused with a 400 (and by ``run --top-p 0``)."""

from __future__ import annotations

import pytest

from edgesdk.runtime.generate import SamplingConfig
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_review import Served


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


def test_top_p_zero_answers_the_greedy_answer(served):
    body = {"prompt": "The quick brown fox", "max_tokens": 8, "ignore_eos": True}
    status, greedy = served.post("/v1/completions", {**body, "temperature": 0})
    assert status == 200, greedy
    for seed in (1, 2, 3):
        status, nucleus = served.post("/v1/completions", {**body, "temperature": 1.5, "top_p": 0, "seed": seed})
        assert status == 200, nucleus
        assert nucleus["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_the_range_is_zero_to_one():
    assert SamplingConfig(top_p=0.0).top_p == 0.0
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"top_p must be in \[0, 1\]"):
            SamplingConfig(top_p=bad)
