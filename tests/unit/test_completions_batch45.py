"""OpenAI's ``POST /v1/completions`` with several prompts (``prompt`` an array of strings or of token-id arrays), over
real HTTP against the tiny bundle: one choice per prompt in their order with its ``index``, ``usage`` summed over the
prompts, streamed chunks carrying each prompt's choice index and one ``data: [DONE]`` at the end (the usage chunk of
``stream_options.include_usage`` once, summed, before it), every prompt checked before any runs and a refusal naming
``prompt[i]`` (OpenAI's API reference, "Create completion": ``prompt``; llama-server's ``handle_completions_impl`` and
``tokenize_input_prompts``, tools/server in ggml-org/llama.cpp). edgesdk.load's ``create_completion`` answers one
prompt per call, as llama-cpp-python's does, and refuses several by name."""

from __future__ import annotations

import pytest

GREEDY = {"temperature": 0, "max_tokens": 5, "cache_prompt": False}
PROMPTS = ("Hello", "The sea is")


def alone(served, prompt) -> dict:
    status, body = served.post("/v1/completions", {"prompt": prompt, **GREEDY})
    assert status == 200, body
    return body


def test_several_prompts_answer_one_choice_each_in_order_with_usage_summed(served):
    singles = [alone(served, prompt) for prompt in PROMPTS]
    status, body = served.post("/v1/completions", {"prompt": list(PROMPTS), **GREEDY})
    assert status == 200, body
    assert body["object"] == "text_completion"
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert [choice["text"] for choice in body["choices"]] == [one["choices"][0]["text"] for one in singles]
    assert [choice["finish_reason"] for choice in body["choices"]] == ["length", "length"]
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert body["usage"][name] == sum(one["usage"][name] for one in singles), name
    # token-id arrays, one per prompt, answer as the same texts do
    tokenizer = served.completer.runtime.tokenizer
    ids = [tokenizer.encode(prompt) for prompt in PROMPTS]
    status, by_ids = served.post("/v1/completions", {"prompt": ids, **GREEDY})
    assert status == 200, by_ids
    assert [choice["text"] for choice in by_ids["choices"]] == [choice["text"] for choice in body["choices"]]
    # echo gives each choice its own prompt back
    status, echoed = served.post("/v1/completions", {"prompt": list(PROMPTS), **GREEDY, "echo": True})
    assert status == 200, echoed
    assert [choice["text"][:len(prompt)] for choice, prompt in zip(echoed["choices"], PROMPTS, strict=True)] == list(PROMPTS)
    # one prompt in an array is still one answer
    status, one = served.post("/v1/completions", {"prompt": [PROMPTS[0]], **GREEDY})
    assert [choice["text"] for choice in one["choices"]] == [singles[0]["choices"][0]["text"]]


def test_several_prompts_stream_with_their_choice_index_and_one_done(served):
    singles = [alone(served, prompt) for prompt in PROMPTS]
    chunks = served.stream("/v1/completions", {"prompt": list(PROMPTS), **GREEDY,
                                               "stream_options": {"include_usage": True}})
    assert chunks.count("[DONE]") == 1
    assert chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert len({chunk["id"] for chunk in chunks}) == 1  # one answer, one id
    *texts, last = chunks
    assert last["choices"] == []  # the usage chunk, once, for the whole request
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert last["usage"][name] == sum(one["usage"][name] for one in singles), name
    assert all(chunk["usage"] is None for chunk in texts)
    for index, one in enumerate(singles):
        mine = [chunk["choices"][0] for chunk in texts if chunk["choices"][0]["index"] == index]
        assert "".join(choice["text"] for choice in mine) == one["choices"][0]["text"]
        assert [choice["finish_reason"] for choice in mine][-1] == "length"
        assert all(choice["finish_reason"] is None for choice in mine[:-1])
    assert {chunk["choices"][0]["index"] for chunk in texts} == {0, 1}
    # without include_usage: no usage chunk, one [DONE]
    plain = served.stream("/v1/completions", {"prompt": list(PROMPTS), **GREEDY})
    assert plain.count("[DONE]") == 1
    assert all(chunk["choices"] for chunk in plain[:-1])


def test_every_prompt_is_checked_before_any_runs_and_a_refusal_names_it(served):
    limit = served.completer.runtime.backend.max_context
    tasks = served.completer.tasks
    vocabulary = served.completer.token_id_limit()
    for prompt, named in ((["Hello", ""], "'prompt[1]'"), (["Hello", [vocabulary + 5]], "'prompt[1]'"),
                          (["Hello", {"x": 1}], "'prompt[1]'"), (["Hello", "Hi", [1] * (limit + 1)], "'prompt[2]'"),
                          (["Hello", [3, True, "x"]], "'prompt[1][1]'")):
        status, body = served.post("/v1/completions", {"prompt": prompt, **GREEDY})
        assert status == 400, (prompt, body)
        assert body["error"]["param"] == "prompt"
        assert named in body["error"]["message"], body
        status, _, payload = served.request("POST", "/v1/completions", {"prompt": prompt, **GREEDY, "stream": True})
        assert status == 400, payload  # refused whole, before the stream opened
    assert served.completer.tasks == tasks  # none ran
    status, body = served.post("/v1/completions", {"prompt": list(PROMPTS), **GREEDY, "n": 2})
    assert status == 400
    assert body["error"]["param"] == "n"


def test_the_openai_client_reads_several_prompts(served):
    openai = pytest.importorskip("openai")
    singles = [alone(served, prompt)["choices"][0]["text"] for prompt in PROMPTS]
    with openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", max_retries=0) as client:
        answer = client.completions.create(model="tiny", prompt=list(PROMPTS), max_tokens=5, temperature=0)
        assert [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)] == singles
        assert answer.usage.completion_tokens == 10
        texts = ["", ""]
        usage = None
        for chunk in client.completions.create(model="tiny", prompt=list(PROMPTS), max_tokens=5, temperature=0,
                                               stream=True, stream_options={"include_usage": True}):
            for choice in chunk.choices:
                texts[choice.index] += choice.text
            usage = chunk.usage or usage
        assert texts == singles
        assert usage.completion_tokens == 10


def test_the_python_api_refuses_several_prompts_by_name(tiny_bundle):
    import edgesdk
    from edgesdk.api import RequestError

    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=4) as model:
        with pytest.raises(RequestError) as refused:
            model.create_completion(["Hello", "World"], temperature=0)
        assert refused.value.param == "prompt"
        assert "one prompt" in str(refused.value)
        assert "2 prompts" in str(refused.value)
        with pytest.raises(RequestError):
            model.create_completion([[1, 2], [3, 4]], stream=True)
        assert model.create_completion(["Hello"], temperature=0)["choices"][0]["index"] == 0


def test_llama_server_s_completion_names_the_prompt_a_refusal_is_about(served):
    vocabulary = served.completer.token_id_limit()
    tasks = served.completer.tasks
    for prompt in (["Hello", [vocabulary + 5]], ["Hello", ""]):
        status, body = served.post("/completion", {"prompt": prompt, "n_predict": 2})
        assert status == 400, body
        assert body["error"]["param"] == "prompt"
        assert "'prompt[1]'" in body["error"]["message"], body
    assert served.completer.tasks == tasks
