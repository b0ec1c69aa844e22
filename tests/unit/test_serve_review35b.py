"""``edgesdk serve``: the Messages API's and the chat routes' answers against the tiny bundle, as clients meet them
over real HTTP."""

from __future__ import annotations

import pytest

from tests.unit.test_serve_reasoning import ASK


def test_an_answer_s_thinking_block_sent_back_in_the_next_turn_is_taken(terse):
    """Anthropic's clients send an answer's content back whole as the assistant turn (the tool-use loop's
    ``messages.append({"role": "assistant", "content": response.content})``), its thinking block included; that
    turn was refused as a 'thinking' block this server does not read, though it wrote the block itself. Anthropic
    strips earlier turns' thinking from the context, so the prompt is the one without the block."""
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{terse.port}", api_key="none", max_retries=0)
    first = client.messages.create(model="m", max_tokens=10, messages=ASK)
    assert [block.type for block in first.content] == ["thinking"]
    sent_back = [block.model_dump() for block in first.content] + [{"type": "text", "text": "It runs."}]
    redacted = {"type": "redacted_thinking", "data": "opaque"}
    turns = [*ASK, {"role": "assistant", "content": [redacted, *sent_back]}, {"role": "user", "content": "And then?"}]
    second = client.messages.create(model="m", max_tokens=10, messages=turns)
    assert second.stop_reason in ("end_turn", "max_tokens")
    plain = [*ASK, {"role": "assistant", "content": "It runs."}, {"role": "user", "content": "And then?"}]
    assert client.messages.count_tokens(model="m", messages=turns).input_tokens == \
        client.messages.count_tokens(model="m", messages=plain).input_tokens
    status, body = terse.post("/v1/messages", {"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "thinking", "thinking": "mine", "signature": ""}]}]})
    assert status == 400, body  # a user's turn holds no thinking
    assert '"thinking" block in a user turn' in body["error"]["message"]


def test_the_thinking_switch_holds_beside_a_null_chat_template_kwargs(terse):
    """``chat_template_kwargs`` null is none given, as for every other field; beside it ``thinking`` disabled was
    dropped (the switch went only into an object), so the template opened its block and the model thought."""
    base = {"model": "m", "max_tokens": 10, "messages": ASK, "thinking": {"type": "disabled"}}
    status, counted = terse.post("/v1/messages/count_tokens", {**base, "chat_template_kwargs": None})
    assert status == 200, counted
    status, closed = terse.post("/v1/messages/count_tokens", base)
    assert counted == closed
    status, answer = terse.post("/v1/messages", {**base, "chat_template_kwargs": None})
    assert status == 200, answer
    assert [block["type"] for block in answer["content"]] == ["text"]


def test_an_echoed_prompt_of_token_ids_keeps_its_special_tokens(served, runtime):
    """A prompt sent as token ids came back from ``echo`` decoded with its special tokens left out, while its
    logprobs listed them and ``text_offset`` counted them, so the offsets pointed past the text they index (a
    harness' prompt starting with BOS); the text holds them, as the same prompt sent as text gives it back."""
    text = "<|im_start|>user\nHello there"
    ids = runtime.tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == runtime.tokenizer.token_id("<|im_start|>")
    base = {"max_tokens": 2, "echo": True, "logprobs": 0, "temperature": 0}
    status, by_ids = served.post("/v1/completions", {**base, "prompt": ids})
    assert status == 200, by_ids
    status, by_text = served.post("/v1/completions", {**base, "prompt": text})
    assert status == 200, by_text
    choice = by_ids["choices"][0]
    assert choice["text"].startswith(text)
    assert choice["text"] == by_text["choices"][0]["text"]
    assert choice["logprobs"] == by_text["choices"][0]["logprobs"]
    listed = choice["logprobs"]
    for token, offset in zip(listed["tokens"][:len(ids)], listed["text_offset"], strict=False):
        assert choice["text"][offset:].startswith(token), (token, offset)


def test_llama_server_s_completion_gives_a_prompt_of_token_ids_back_with_its_special_tokens(served, runtime):
    """``POST /completion``'s "prompt" is the prompt's tokens detokenized with their special tokens, as
    llama-server writes it (server.cpp: ``tokens.detokenize(ctx, true)``); a BOS sent as an id was dropped."""
    text = "<|im_start|>user\nHello there"
    ids = runtime.tokenizer.encode(text, add_special_tokens=False)
    status, answer = served.post("/completion", {"prompt": ids, "n_predict": 1, "temperature": 0})
    assert status == 200, answer
    assert answer["prompt"] == text
