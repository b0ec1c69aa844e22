"""Repetition penalties (llama.cpp's penalties sampler, OpenAI's presence and frequency penalties):
the formula on known logits, their window, and their effect through generate, run and serve."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.generate import SamplingConfig, generate, penalized


def test_the_penalties_follow_llama_cpp_s_formula():
    logits = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    config = SamplingConfig(repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5, repeat_last_n=-1)
    out = penalized(logits, [0, 0, 1, 9], config)  # token 9 is past the vocabulary: ignored
    np.testing.assert_allclose(out, [2.0 / 2 - 2 * 0.25 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 3.0])
    assert logits[0] == 2.0  # the input is left as it was


def test_the_window_is_the_last_repeat_last_n_tokens():
    logits = np.zeros(4, np.float32)
    config = SamplingConfig(presence_penalty=1.0, repeat_last_n=2)
    np.testing.assert_array_equal(penalized(logits, [0, 1, 2], config), [0, -1, -1, 0])
    assert penalized(logits, [0, 1, 2], SamplingConfig(presence_penalty=1.0, repeat_last_n=0)) is logits
    assert penalized(logits, [0, 1], SamplingConfig()) is logits  # the defaults change nothing


@pytest.mark.parametrize(("history", "last_n", "penalised"), [
    ([0, 1, 2, 3, 4], 8, [0, 1, 2, 3, 4]),  # fewer tokens than the window: every one (it cut to the last 3)
    ([0, 1, 2, 3, 4], 5, [0, 1, 2, 3, 4]),
    ([0, 1, 2, 3, 4], 11, [0, 1, 2, 3, 4]),
    ([0, 1, 2, 3, 4], 3, [2, 3, 4]),
])
def test_a_window_longer_than_the_history_penalises_all_of_it(history, last_n, penalised):
    out = penalized(np.zeros(8, np.float32), history, SamplingConfig(presence_penalty=1.0, repeat_last_n=last_n))
    assert np.flatnonzero(out).tolist() == penalised


@pytest.mark.parametrize(("field", "value"), [("repeat_penalty", 0.0), ("repeat_penalty", float("nan")),
                                              ("presence_penalty", float("nan")), ("frequency_penalty", float("-inf")),
                                              ("repeat_last_n", -2), ("repeat_last_n", 1.5)])
def test_bad_penalties_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _repeats(tokens: list[int]) -> int:
    return len(tokens) - len(set(tokens))


def test_a_frequency_penalty_makes_a_greedy_answer_repeat_less(runtime):
    prompt = runtime.tokenizer.encode("The quick brown fox")
    plain, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=40), set())
    penalized_answer, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=40, frequency_penalty=2.0,
                                                                           repeat_last_n=-1), set())
    assert _repeats(plain) > 0, "the tiny model's greedy answer must repeat itself for this check"
    assert _repeats(penalized_answer) < _repeats(plain)


def test_run_and_serve_take_the_penalties(tiny_bundle, runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_cli import assert_ok, invoke
    from tests.unit.test_serve import Served

    tokenizer = runtime.tokenizer
    config = SamplingConfig(max_new_tokens=12, repeat_penalty=1.5, frequency_penalty=1.0)
    prompt = tokenizer.prompt_ids("hello", raw=True)
    expected, _ = generate(runtime.backend, prompt, config, tokenizer.eos_token_ids)
    plain, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=12), tokenizer.eos_token_ids)
    assert expected != plain, "the penalties must change this answer, or a run or serve that drops them passes"
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "--raw", "-n", 12, "--repeat-penalty", 1.5,
                    "--frequency-penalty", 1.0, "--threads", 1)
    assert_ok(result)
    assert result.stdout == tokenizer.decode(expected) + "\n"
    server = Served(runtime, ServeDefaults(max_tokens=12))
    try:
        status, body = server.post("/v1/completions", {"prompt": "hello", "repeat_penalty": 1.5,
                                                        "frequency_penalty": 1.0})
        assert status == 200, body
        assert body["choices"][0]["text"] == tokenizer.decode(expected)
        status, body = server.post("/v1/completions", {"prompt": "hello", "presence_penalty": 3})
        assert (status, body["error"]["param"]) == (400, "presence_penalty")
        status, body = server.post("/v1/completions", {"prompt": "hello", "repeat_penalty": 0})
        assert (status, body["error"]["param"]) == (400, "repeat_penalty")
    finally:
        server.close()
    bad = invoke("run", tiny_bundle.path, "--prompt", "hi", "--presence-penalty", "nan")  # any finite, as llama-cli
    assert bad.exit_code == 2
    assert "'--presence-penalty'" in bad.stderr
