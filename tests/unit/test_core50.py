"""llama-server's completion routes as its clients use them, against a real server of the tiny bundle.

- A llama.cpp sampler this runtime lacks is off not only at the one value edgesdk named but wherever llama.cpp's own
  sampler does nothing (src/llama-sampling.cpp): top-n-sigma at ``n <= 0``, typical-p at ``p >= 1``, the plain
  temperature at a ``dynatemp_range`` of 0 or below, XTC at a probability of 0 or below or a threshold above 0.5, DRY
  at a ``dry_penalty_last_n`` of 0. SillyTavern sends ``top_n_sigma: 0`` by default, and its default llama.cpp chain
  ends in ``adaptive_p`` beside ``adaptive_target`` -0.01 (negative: llama.cpp's adaptive-p only picks from the
  distribution as it is); every such request was a 400.
- ``POST /completion``'s ``completion_probabilities`` list the end-of-text token the answer stopped at, as
  llama-server lists every token it sampled there (server-context.cpp: process_token adds it to
  generated_token_probs, send_final_response lists them all but a stop word's): one entry per token of ``tokens`` and
  of ``tokens_predicted``; a stream's event for that token carries its entry. It was left out, so a client zipping
  the probabilities with ``tokens`` (return_tokens) got lists of different lengths.
"""

from __future__ import annotations

import json

import pytest

PROMPT = "Hello there"  # the tiny bundle answers it with "e" after "e", never an end-of-text token of its own

# SillyTavern's llama.cpp text completion request at its default settings (public/scripts/textgen-settings.js:
# LLAMACPP_DEFAULT_ORDER, nsigma 0, xtc_probability 0, adaptive_target -0.01, typical_p 1, dry_multiplier 0)
SILLYTAVERN = {"samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                            "temperature", "adaptive_p"],
               "top_n_sigma": 0, "nsigma": 0, "xtc_threshold": 0.1, "xtc_probability": 0, "typical_p": 1,
               "dry_multiplier": 0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 0,
               "adaptive_target": -0.01, "adaptive_decay": 0.9, "min_keep": 0, "mirostat": 0, "dynatemp_range": 0,
               "temperature": 0.7, "top_k": 40, "top_p": 0.5, "min_p": 0, "repeat_penalty": 1.2, "seed": 3}


@pytest.mark.parametrize("path", ["/completion", "/v1/completions"])
def test_sillytavern_s_default_llama_cpp_request_is_answered(served, path):
    status, answer = served.post(path, {"prompt": PROMPT, "n_predict": 3, **SILLYTAVERN})
    assert status == 200, answer
    assert (answer["tokens_predicted"] if path == "/completion" else answer["usage"]["completion_tokens"]) == 3


@pytest.mark.parametrize("fields", [
    {"top_n_sigma": 0}, {"top_n_sigma": -2.5}, {"typical_p": 1.5}, {"dynatemp_range": -1.0},
    {"xtc_probability": -0.1}, {"xtc_probability": 0.5, "xtc_threshold": 0.6},
    {"dry_multiplier": 0.8, "dry_penalty_last_n": 0},
    {"samplers": "kpmta", "adaptive_target": -1}, {"samplers": ["top_k", "adaptive_p"], "adaptive_target": -0.5},
])
def test_a_sampler_llama_cpp_reads_as_off_is_taken(served, fields):
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, **fields})
    assert status == 200, answer
    status, answer = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 2, **fields})
    assert status == 200, answer


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_n_sigma": 1.0}, "top_n_sigma"), ({"typical_p": 0.9}, "typical_p"), ({"dynatemp_range": 0.5}, "dynatemp_range"),
    ({"xtc_probability": 0.5, "xtc_threshold": 0.1}, "xtc_probability"),
    ({"dry_multiplier": 0.8, "dry_penalty_last_n": -1}, "dry_multiplier"), ({"mirostat": 2}, "mirostat"),
    ({"top_n_sigma": "off"}, "top_n_sigma"),
    ({"samplers": ["top_k", "adaptive_p"], "adaptive_target": 0.5}, "adaptive_target"),
    ({"samplers": "ka", "adaptive_target": 0}, "adaptive_target"),
])
def test_a_sampler_llama_cpp_would_run_is_still_refused_by_name(served, fields, param):
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 2, **fields})
    assert status == 400, answer
    assert answer["error"]["param"] == param
    assert f"'{param}' = " in answer["error"]["message"]
    assert "is not supported" in answer["error"]["message"]


def _eos(runtime) -> int:
    return min(runtime.tokenizer.eos_token_ids)


def test_completion_probabilities_list_the_end_of_text_token_the_answer_stopped_at(served, runtime):
    eos = _eos(runtime)
    # the bias makes the end-of-text token the first pick (llama-server's logit_bias: [[id, bias]])
    body = {"prompt": PROMPT, "n_predict": 8, "n_probs": 2, "return_tokens": True, "temperature": 0}
    status, answer = served.post("/completion", {**body, "logit_bias": [[eos, 100]]})
    assert status == 200, answer
    assert answer["stop_type"] == "eos"
    probabilities = answer["completion_probabilities"]
    assert answer["tokens"] == [eos]
    assert len(probabilities) == len(answer["tokens"]) == answer["tokens_predicted"] == 1
    assert probabilities[0]["id"] == eos
    assert len(probabilities[0]["top_logprobs"]) == 2


def test_a_streamed_answer_s_end_of_text_event_carries_its_probabilities(served, runtime):
    eos = _eos(runtime)
    events = served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 8, "n_probs": 1, "stream": True,
                                                    "logit_bias": [[eos, 100]]})[2].decode().split("\n\n")
    events = [json.loads(event[len("data: "):]) for event in events if event]
    partial = [event for event in events if not event["stop"]]
    assert [event["tokens"] for event in partial] == [[eos]]
    assert [entry["id"] for entry in partial[0]["completion_probabilities"]] == [eos]
    assert events[-1]["stop"] is True
    assert events[-1]["stop_type"] == "eos"
    assert "completion_probabilities" not in events[-1]


def test_a_stop_string_s_tokens_and_a_limit_list_no_end_of_text_entry(served):
    status, answer = served.post("/completion", {"prompt": PROMPT, "n_predict": 3, "n_probs": 1,
                                                 "return_tokens": True})
    assert status == 200, answer
    assert answer["stop_type"] == "limit"
    assert len(answer["completion_probabilities"]) == len(answer["tokens"]) == answer["tokens_predicted"] == 3
