"""Review of the generation loop and its log-probabilities (57th stop): the end-of-text token a complete grammar
leaves, which llama-server samples as any token and lists with its probabilities."""

from __future__ import annotations

import json

import numpy as np

from edgesdk.runtime.gbnf import parse_grammar
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.grammar import GrammarConstraint
from edgesdk.runtime.logprobs import LogprobRecorder, log_softmax

GRAMMAR = 'root ::= "a" "b"'


def _grammar(runtime):
    tokenizer = runtime.tokenizer
    return GrammarConstraint(tokenizer.token_bytes(), parse_grammar(GRAMMAR), tokenizer.eos_token_ids)


# ------------------------------------------------------------------ a complete grammar's end-of-text token


def test_a_complete_grammar_records_the_end_token_it_leaves(runtime):
    tokenizer = runtime.tokenizer
    prompt = tokenizer.encode_plain("Hello")
    recorder = LogprobRecorder(top=2)
    answer, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=5), tokenizer.eos_token_ids,
                             constraint=_grammar(runtime), logprobs=recorder)
    assert tokenizer.decode(answer) == "ab"
    assert stats.stop_reason == "complete"
    assert [entry.token for entry in recorder.answer] == answer  # one entry per answer token, the end apart
    end = recorder.end
    assert end is not None
    assert end.token == stats.stop_token
    assert end.token in tokenizer.eos_token_ids
    # the model's own distribution after the answer (llama-server's n_probs without post_sampling_probs)
    runtime.backend.reset()
    rows = runtime.backend.prefill(np.asarray(prompt + answer, np.int64), keep_logits=1)
    scores = log_softmax(rows[-1])
    assert np.isclose(end.logprob, scores[end.token], atol=1e-5)
    # greedy: the most likely end-of-text token, the only tokens the grammar allows there
    assert end.token == max(sorted(tokenizer.eos_token_ids), key=lambda token: scores[token])
    assert [token for token, _ in end.top] == list(np.argsort(-scores, kind="stable")[:2])


def test_a_complete_grammar_without_logprobs_costs_no_further_step(runtime):
    tokenizer = runtime.tokenizer
    answer, stats = generate(runtime.backend, tokenizer.encode_plain("Hello"), SamplingConfig(max_new_tokens=5),
                             tokenizer.eos_token_ids, constraint=_grammar(runtime))
    assert tokenizer.decode(answer) == "ab"
    assert (stats.stop_reason, stats.stop_token, len(stats.token_latencies_s)) == ("complete", None, 1)


def test_a_grammar_complete_at_the_token_limit_picks_no_end_token(runtime):
    tokenizer = runtime.tokenizer
    recorder = LogprobRecorder(top=2)
    answer, stats = generate(runtime.backend, tokenizer.encode_plain("Hello"), SamplingConfig(max_new_tokens=2),
                             tokenizer.eos_token_ids, constraint=_grammar(runtime), logprobs=recorder)
    assert tokenizer.decode(answer) == "ab"
    assert (stats.stop_reason, stats.stop_token, recorder.end) == ("complete", None, None)
    assert len(recorder.answer) == 2


def test_completion_probabilities_list_the_end_token_of_a_complete_grammar(served):
    body = {"prompt": "Hello", "n_predict": 5, "grammar": GRAMMAR, "n_probs": 2, "return_tokens": True}
    status, whole = served.post("/completion", body)
    assert status == 200, whole
    assert (whole["content"], whole["stop_type"]) == ("ab", "eos")
    probabilities = whole["completion_probabilities"]
    assert len(probabilities) == len(whole["tokens"]) == whole["tokens_predicted"] == 3
    assert [entry["id"] for entry in probabilities] == whole["tokens"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in probabilities)
    # streamed: the end-of-text token's event carries its entry
    status, _, payload = served.request("POST", "/completion", {**body, "stream": True})
    assert status == 200, payload
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    streamed = [entry for event in events for entry in event.get("completion_probabilities", [])]
    assert [entry["id"] for entry in streamed] == whole["tokens"]


def test_openai_logprobs_of_a_complete_grammar_list_the_answer_s_tokens_only(served):
    status, body = served.post("/v1/completions", {"prompt": "Hello", "max_tokens": 5, "grammar": GRAMMAR,
                                                   "logprobs": 2})
    assert status == 200, body
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("ab", "stop")
    assert len(choice["logprobs"]["tokens"]) == 2
