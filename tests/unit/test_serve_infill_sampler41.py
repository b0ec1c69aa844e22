"""llama.cpp's infill sampler on ``edgesdk serve``'s ``POST /infill``, in the chain llama.vscode and llama.vim send
(``"samplers": ["top_k", "top_p", "infill"]``, ``top_k`` 40, ``top_p`` 0.99), on the tiny FIM bundle of
tests/unit/test_serve_infill40.py. A logit bias sets up candidates where the infill sampler picks otherwise than the
chain without it (the expected picks are worked from llama_sampler_infill_apply, src/llama-sampler.cpp).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit import test_serve_infill40 as infill40

pytest.importorskip("torch")
pytest.importorskip("transformers")

qwen_bundle, qwen_runtime, fim_served = infill40.qwen_bundle, infill40.qwen_runtime, infill40.fim_served
CHAIN = ["top_k", "top_p", "infill"]


def _body(samplers, bias, **extra) -> dict:
    return {"input_prefix": infill40.PREFIX, "input_suffix": infill40.SUFFIX, "prompt": "", "n_predict": 1,
            "top_k": 40, "top_p": 0.99, "samplers": samplers, "logit_bias": [[token, value] for token, value in bias],
            "cache_prompt": False, **extra}


def _ids(runtime):
    """A token "a", three tokens it begins ("al", "an", "ar" ...), and a text token neither beginning nor begun by
    any of them."""
    table = runtime.tokenizer.token_bytes()
    head = table.index(b"a")
    group = [token for token, text in enumerate(table) if text and text != b"a" and text.startswith(b"a")][:3]
    other = next(token for token, text in enumerate(table)
                 if text and not text.startswith(b"a") and not any(table[t].startswith(text) for t in [head, *group]))
    return head, group, other


def _levelled(served, targets: dict[int, float]) -> list[tuple[int, float]]:
    """The logit bias that puts each token of ``targets`` at its logit there for the infill prompt of
    :func:`_body` (the model's own logits, read first, taken off), so that the tiny random model's logits
    (spread about 1 around 0) leave those tokens where the test puts them, far above every other."""
    from edgesdk.serve.infill import parse_infill_request

    ids = served.completer.prompt_ids(parse_infill_request(_body(CHAIN, []), served.completer))
    backend = served.completer.runtime.backend
    backend.reset()
    logits = backend.prefill(np.asarray(ids, np.int64), keep_logits=1)[-1]
    return [(token, target - float(logits[token])) for token, target in targets.items()]


def _prefix_bias(served):
    # "other" at 50, "a" and its three at 49.5: p(other) = 1/(1 + 4e^-.5) = .29, each of the four .18; with infill
    # "a" gathers the three (.71) and "other" leaves at 1/(2 + 1)
    head, group, other = _ids(served.completer.runtime)
    return _levelled(served, {other: 50.0, **{token: 49.5 for token in (head, *group)}}), head, other


def test_the_infill_sampler_runs_in_the_chain_the_plugins_send(fim_served, qwen_runtime):
    bias, head, other = _prefix_bias(fim_served)
    text = qwen_runtime.tokenizer.decode
    status, without = fim_served.post("/infill", _body(["top_k", "top_p"], bias, temperature=0.0))
    assert status == 200, without
    assert without["content"] == text([other])
    status, answer = fim_served.post("/infill", _body(CHAIN, bias, temperature=0.0))
    assert status == 200, answer
    assert answer["generation_settings"]["samplers"] == CHAIN
    assert answer["content"] == text([head])
    # the letters, as llama.cpp's common_sampler_types_from_chars reads them ('i': infill)
    status, letters = fim_served.post("/infill", _body("kpi", bias, temperature=0.0))
    assert status == 200, letters
    assert (letters["generation_settings"]["samplers"], letters["content"]) == (CHAIN, text([head]))


def test_sampled_as_the_plugins_sample_only_what_the_infill_sampler_kept_is_drawn(fim_served, qwen_runtime):
    bias, head, other = _prefix_bias(fim_served)
    text = qwen_runtime.tokenizer.decode
    # llama.vscode sends no temperature: the server's; each seed a draw
    drawn = set()
    for seed in range(6):
        status, answer = fim_served.post("/infill", _body(CHAIN, bias, seed=seed, temperature=0.8))
        assert status == 200, answer
        drawn.add(answer["content"])
    assert drawn == {text([head])}
    without = set()
    for seed in range(6):
        status, answer = fim_served.post("/infill", _body(["top_k", "top_p"], bias, seed=seed, temperature=0.8))
        without.add(answer["content"])
    assert len(without) > 1


def test_likely_end_of_generation_tokens_end_the_infill(fim_served, qwen_runtime):
    # a text token at 50 and an end-of-generation one at 49: p(eog) = .27, top-p 0.99 keeps the two, and
    # 3 * .27 * 2 > .73, so the infill sampler keeps the EOG token alone and the answer ends there; without it greedy
    # decoding takes the text
    eog = min(qwen_runtime.tokenizer.eos_token_ids)
    _, _, other = _ids(qwen_runtime)
    bias = _levelled(fim_served, {other: 50.0, eog: 49.0})
    status, without = fim_served.post("/infill", _body(["top_k", "top_p"], bias, temperature=0.0, n_predict=3))
    assert status == 200, without
    assert without["tokens_predicted"] >= 1
    status, answer = fim_served.post("/infill", _body(CHAIN, bias, temperature=0.0, n_predict=3))
    assert status == 200, answer
    # the end-of-generation token is the one token sampled: llama-server's n_decoded (tokens_predicted) counts it
    assert (answer["content"], answer["tokens_predicted"], answer["stop_type"]) == ("", 1, "eos")


def test_generate_takes_the_vocabulary_it_is_given(fim_served, qwen_runtime):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.serve.infill import parse_infill_request

    bias, head, other = _prefix_bias(fim_served)
    tokenizer = qwen_runtime.tokenizer
    prompt = fim_served.completer.prompt_ids(parse_infill_request(_body(CHAIN, []), fim_served.completer))
    sampling = SamplingConfig(max_new_tokens=1, samplers="kpi", top_k=40, top_p=0.99, logit_bias=bias)
    picked, _ = generate(qwen_runtime.backend, prompt, sampling, tokenizer.eos_token_ids, vocabulary=tokenizer)
    assert picked == [head]
    plain = SamplingConfig(max_new_tokens=1, samplers="kp", top_k=40, top_p=0.99, logit_bias=bias)
    assert generate(qwen_runtime.backend, prompt, plain, tokenizer.eos_token_ids)[0] == [other]


def test_generate_without_a_vocabulary_refuses_the_infill_sampler_by_name(runtime):
    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.infill_sampler import infill_apply, vocabulary_of

    ids, stop = runtime.tokenizer.encode("hello"), runtime.tokenizer.eos_token_ids
    sampling = SamplingConfig(max_new_tokens=1, samplers=["infill"])
    with pytest.raises(EdgeSDKError) as caught:
        generate(runtime.backend, ids, sampling, set())
    assert "infill sampler" in caught.value.problem
    assert "vocabulary=" in caught.value.fix
    # given one: greedy decoding takes the most likely of the tokens infill_apply keeps of the whole vocabulary
    picked, _ = generate(runtime.backend, ids, sampling, set(), vocabulary=runtime.tokenizer)
    runtime.backend.reset()
    logits = runtime.backend.prefill(np.asarray(ids, np.int64), keep_logits=1)[-1]
    vocabulary = vocabulary_of(runtime.tokenizer)
    kept, kept_logits, _ = infill_apply(np.arange(logits.shape[0]), logits, vocabulary.texts, stop, vocabulary.eot)
    assert picked == [int(kept[np.argmax(kept_logits)])]


def test_every_route_runs_the_infill_sampler_it_is_given(fim_served, qwen_runtime):
    """llama-server takes ``infill`` in the chain of any completion route; the completer hands the served tokenizer
    to the chain, so /completion and /v1/completions run it too (not only /infill)."""
    from edgesdk.serve.infill import parse_infill_request

    bias, head, other = _prefix_bias(fim_served)
    text = qwen_runtime.tokenizer.decode
    ids = fim_served.completer.prompt_ids(parse_infill_request(_body(CHAIN, []), fim_served.completer))
    common = {"prompt": ids, "top_k": 40, "top_p": 0.99, "temperature": 0.0, "cache_prompt": False,
              "logit_bias": [[token, value] for token, value in bias]}
    status, native = fim_served.post("/completion", {**common, "n_predict": 1, "samplers": CHAIN})
    assert status == 200, native
    assert native["content"] == text([head])
    status, plain = fim_served.post("/completion", {**common, "n_predict": 1, "samplers": ["top_k", "top_p"]})
    assert (status, plain["content"]) == (200, text([other]))
    status, openai = fim_served.post("/v1/completions", {**common, "max_tokens": 1, "samplers": "kpi"})
    assert status == 200, openai
    assert openai["choices"][0]["text"] == text([head])


def test_run_takes_the_infill_sampler(qwen_bundle):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["run", str(qwen_bundle.path), "--prompt", "def add(a, b):", "-n", "3",
                                       "--sampling-seq", "kpi", "--temperature", "0", "--raw"], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
