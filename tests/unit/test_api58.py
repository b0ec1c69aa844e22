"""edgesdk/api.py and edgesdk/api_checks.py: load() reads its arguments as ``edgesdk serve`` / ``edgesdk run`` read
the options of those names: a temperature below 0 is greedy (``--temp -1``, llama-server's std::max(temp, 0)), and
threads of 0 or below are the profile's count (``--threads 0`` / ``-t -1``, llama.cpp's default)."""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError

PROMPT = "The night train"


@pytest.mark.parametrize("temperature", [-1.0, -0.5, -1, np.float32(-2.0)])
def test_load_reads_a_temperature_below_zero_as_greedy(tiny_bundle, temperature):
    with edgesdk.load(tiny_bundle.path, threads=1, temperature=0.0) as greedy:
        expected = greedy.create_completion(PROMPT, max_tokens=6, seed=3)["choices"][0]["text"]
    with edgesdk.load(tiny_bundle.path, threads=1, temperature=temperature) as loaded:
        assert loaded._completer.defaults.temperature == 0.0
        assert loaded.create_completion(PROMPT, max_tokens=6, seed=3)["choices"][0]["text"] == expected


def test_load_still_refuses_a_temperature_serve_refuses(tiny_bundle):
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\): temperature must be a finite number >= 0, got inf"):
        edgesdk.load(tiny_bundle.path, threads=1, temperature=float("inf"))


@pytest.mark.parametrize("threads", [0, -1, np.int64(-1)])
def test_load_reads_threads_of_zero_or_below_as_the_profiles_count(tiny_bundle, threads):
    with edgesdk.load(tiny_bundle.path) as default:
        expected = default.runtime.threads
    with edgesdk.load(tiny_bundle.path, threads=threads) as loaded:
        assert loaded.runtime.threads == expected
        assert loaded.create_completion(PROMPT, max_tokens=2)["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize("threads", [1.5, "2", True])
def test_load_still_refuses_threads_that_are_no_whole_number(tiny_bundle, threads):
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\): threads=.*: expected a whole number") as refused:
        edgesdk.load(tiny_bundle.path, threads=threads)
    assert "0 or below" in refused.value.fix


@pytest.mark.parametrize(("text", "chain"), [
    ("top_k;temperature", ("top_k", "temperature")),  # edgesdk serve --samplers, llama.cpp's
    ("temperature", ("temperature",)),  # one name: was read as letters and blamed on 'a' (adaptive_p)
    ("top_k;;temp", ("top_k", "temperature")),  # llama.cpp's alias; an empty name between two ';' left out
    ("kt", ("top_k", "temperature")),  # letters, as --sampling-seq
])
def test_load_reads_a_samplers_string_of_names_as_serve_samplers_option(tiny_bundle, text, chain):
    with edgesdk.load(tiny_bundle.path, threads=1, samplers=text) as loaded:
        assert loaded._completer.defaults.samplers == chain


@pytest.mark.parametrize(("text", "chain"), [
    ("temp", ("temperature",)),  # llama.cpp's alias, all sampler letters: was read as t, e, m, p
    ("typ", ("typ_p",)),  # was t, y, p
    ("TEMP", ("temperature",)),
    ("tmp", ("temperature", "min_p", "top_p")),  # no name: letters
])
def test_a_samplers_string_that_is_one_name_of_letters_is_read_as_that_name(text, chain):
    from edgesdk.api_checks import sampler_text
    from edgesdk.runtime.generate import sampler_chain

    assert sampler_chain(sampler_text(text)) == chain


def test_load_reads_samplers_temp_as_temperature_alone(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, samplers="temp") as loaded:
        assert loaded._completer.defaults.samplers == ("temperature",)


@pytest.mark.parametrize(("threads", "read"), [(None, None), (-1, None), (0, None), (1, 1), (4, 4)])
def test_load_and_the_cli_read_threads_by_one_rule(threads, read):
    from edgesdk.api_checks import load_threads
    from edgesdk.cli_options import _threads_or_default

    assert _threads_or_default(None, None, threads) == load_threads(threads) == read


def test_a_samplers_string_of_letters_still_names_adaptive_p(tiny_bundle):
    with pytest.raises(edgesdk.EdgeSDKError, match=r"samplers 'ka' holds 'a', which is llama.cpp's adaptive_p"):
        edgesdk.load(tiny_bundle.path, threads=1, samplers="ka")
    with pytest.raises(edgesdk.EdgeSDKError, match=r"samplers holds 'tempreature', which is no sampler"):
        edgesdk.load(tiny_bundle.path, threads=1, samplers="top_k;tempreature")


@pytest.mark.parametrize(("name", "value", "choices"), [
    ("pooling", 5, "last, mean, cls, none"),
    ("pooling", "average", "last, mean, cls, none"),
    ("reasoning_format", True, "auto, none, deepseek, deepseek-legacy"),
    ("reasoning_format", ["deepseek"], "auto, none, deepseek, deepseek-legacy"),
])
def test_a_setting_of_a_few_names_refused_names_them(tiny_bundle, name, value, choices):
    with pytest.raises(edgesdk.EdgeSDKError, match=rf"load\(\): {name}=.*: expected one of {choices}") as refused:
        edgesdk.load(tiny_bundle.path, threads=1, **{name: value})
    assert f"pass {name}=" in refused.value.fix


@pytest.mark.parametrize("method", ["save_prompt_cache", "load_prompt_cache"])
def test_an_empty_prompt_cache_path_is_refused_naming_it(tiny_bundle, method):
    with edgesdk.load(tiny_bundle.path, threads=1) as loaded:
        loaded.create_completion(PROMPT, max_tokens=2)
        with pytest.raises(RequestError, match=rf"{method} \(path\): path is ''; expected a file path") as refused:
            getattr(loaded, method)("")
        assert refused.value.param == "path"
        assert "prompt.cache" in refused.value.fix
