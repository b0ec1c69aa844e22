"""A rendered chat's token ids carry exactly one leading BOS where the tokenizer adds BOS, as llama.cpp tokenizes a
chat prompt (common/chat.cpp cuts the BOS text the template wrote off the front where the vocabulary adds BOS, then
llama-server / llama-cli tokenize the rendering with add_special and parse_special true), and ids as before where it
adds none. Every path that encodes a rendered chat goes through ``ChatTokenizer.chat_ids``: ``edgesdk run``'s one-shot
prompt (``prompt_ids``) and conversation (``Conversation.prompt_ids``, whose turns keep sharing their prefix), and the
server's chat, Anthropic, Responses and Ollama routes (and with them the Python API, which runs the server's
Completer)."""

from __future__ import annotations

import pytest

from edgesdk.runtime.conversation import Conversation
from edgesdk.runtime.text import ChatTokenizer
from tests._utils import tiny

pytest.importorskip("transformers")

GEMMA_FACTS = {"bos_token": "<bos>", "eos_token": "<eos>"}
LLAMA2_FACTS = {"bos_token": "<s>", "eos_token": "</s>"}
BYTE_FACTS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
KINDS = {  # (tokenizer, its facts, the id of BOS where it adds one)
    "llama2": (tiny.tiny_llama2_tokenizer, LLAMA2_FACTS, 1),  # TinyLlama's: a template that writes no bos_token
    "gemma": (tiny.tiny_gemma_tokenizer, GEMMA_FACTS, 2),  # a template that writes {{ bos_token }}
    "byte-level": (tiny.tiny_tokenizer, BYTE_FACTS, None),  # SmolLM2's: no BOS added
}


def _chat_tokenizer(folder, kind: str) -> ChatTokenizer:
    make, facts, _ = KINDS[kind]
    made = make()
    made.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(made.chat_template, encoding="utf-8")
    return ChatTokenizer(folder / "tokenizer.json", facts, folder / "chat_template.jinja")


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def chat_tokenizer(kind, tmp_path_factory):
    return _chat_tokenizer(tmp_path_factory.mktemp(kind), kind)


def test_the_one_shot_chat_prompt_has_one_bos_where_the_tokenizer_adds_it(kind, chat_tokenizer):
    bos = KINDS[kind][2]
    assert chat_tokenizer.added_bos() == bos
    ids = chat_tokenizer.prompt_ids("Hello there", raw=False, system="Be brief.")
    rendered = chat_tokenizer.render_chat([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hello there"}])
    if bos is None:  # byte-identical to the rendering's ids as they were
        assert ids == chat_tokenizer.encode(rendered, add_special_tokens=False)
        return
    assert ids[0] == bos
    assert ids.count(bos) == 1
    # the rest is the rendering past the BOS text the template wrote (Gemma's) or the whole of it (TinyLlama's)
    rest = rendered.removeprefix(chat_tokenizer.tokenizer.id_to_token(bos))
    assert ids[1:] == chat_tokenizer.encode(rest, add_special_tokens=False)


def test_transformers_renders_the_same_text_and_llama_cpp_puts_bos_in_front(kind, chat_tokenizer):
    """transformers' apply_chat_template writes the same text; its ids (add_special_tokens False) lack the BOS for
    TinyLlama's template, which the ids here have; for Gemma's and SmolLM2's they are the same."""
    make, _, bos = KINDS[kind]
    messages = [{"role": "user", "content": "Hello there"}]
    reference = make()
    text = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == chat_tokenizer.render_chat(messages)
    theirs = reference(text, add_special_tokens=False)["input_ids"]
    ours = chat_tokenizer.prompt_ids("Hello there", raw=False)
    if kind == "llama2":
        assert theirs[:1] != [bos]
        assert ours == [bos, *theirs]
    else:
        assert ours == theirs


def test_conversation_turns_share_their_prefix_bos_first(kind, chat_tokenizer):
    bos = KINDS[kind][2]
    chat = Conversation(chat_tokenizer, "Be brief.", max_context=4096, answer_room=16)
    first = chat.prompt_ids("Hi there")
    chat.answered("Hi there", "Hello.")
    second = chat.prompt_ids("How are you?")
    if bos is not None:
        assert first[0] == second[0] == bos
        assert first.count(bos) == second.count(bos) == 1
    else:
        assert first == chat_tokenizer.encode(chat_tokenizer.render_chat(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]),
            add_special_tokens=False)
    # the KV cache keeps the earlier turn: all of the first prompt but its last few tokens (the generation prompt,
    # which the answer's text follows in the second rendering) is the second prompt's start
    shared = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
    assert shared >= len(first) - 4


@pytest.fixture(scope="module")
def llama2_runtime(tmp_path_factory):
    """A tiny bundle built with TinyLlama's kind of tokenizer (SentencePiece, BOS added, a template without
    bos_token), opened."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime

    root = tmp_path_factory.mktemp("llama2-bundle")
    tokenizer = tiny.tiny_llama2_tokenizer()
    model_dir = root / "model"
    tiny.tiny_llama(hidden=32, heads=2, kv_heads=1, layers=1, vocab_size=len(tokenizer) + 2).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=root / "b",
                               export=ExportConfig(max_context=256), progress=False))
    return open_runtime(bundle.path, threads=1)


@pytest.fixture(scope="module")
def llama2_served(llama2_runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(llama2_runtime, ServeDefaults(max_tokens=1))
    yield server
    server.close()


MESSAGES = [{"role": "user", "content": "Hello there"}]


def test_the_bundle_records_bos_and_its_one_shot_prompt_starts_with_it(llama2_runtime):
    tokenizer = llama2_runtime.tokenizer
    assert tokenizer.bos_token == "<s>"
    assert tokenizer.added_bos() == 1
    ids = tokenizer.prompt_ids("Hello there", raw=False)
    assert ids[0] == 1
    assert ids[1:] == tokenizer.encode(tokenizer.render_chat(MESSAGES), add_special_tokens=False)


def test_every_served_chat_route_counts_the_bos(llama2_served, llama2_runtime):
    """/v1/chat/completions, /v1/messages (and its count_tokens), /v1/responses (and input_tokens), Ollama's
    /api/chat and /api/generate: the prompt each runs is the rendered chat with BOS in front."""
    from edgesdk.serve.api import parse_chat_request

    tokenizer = llama2_runtime.tokenizer
    expected = [1, *tokenizer.encode(tokenizer.render_chat(MESSAGES), add_special_tokens=False)]
    assert llama2_served.completer.prompt_ids(parse_chat_request({"messages": MESSAGES})) == expected
    status, body = llama2_served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(expected)
    status, body = llama2_served.post("/v1/messages/count_tokens", {"model": "tiny-host", "messages": MESSAGES})
    assert (status, body) == (200, {"input_tokens": len(expected)})
    status, body = llama2_served.post("/v1/messages", {"model": "tiny-host", "messages": MESSAGES, "max_tokens": 1})
    assert status == 200, body
    usage = body["usage"]  # the prompt's tokens the cache held apart from those prefilled, as Anthropic counts them
    assert usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) == len(expected)
    status, body = llama2_served.post("/v1/responses/input_tokens", {"input": "Hello there"})
    assert status == 200, body
    assert body["input_tokens"] == len(expected)
    status, body = llama2_served.post("/api/chat", {"model": "tiny-host", "messages": MESSAGES, "stream": False,
                                                   "options": {"num_predict": 1}})
    assert status == 200, body
    assert body["prompt_eval_count"] == len(expected)
    status, body = llama2_served.post("/api/generate", {"model": "tiny-host", "prompt": "Hello there", "stream": False,
                                                       "options": {"num_predict": 1}})
    assert status == 200, body
    assert body["prompt_eval_count"] == len(expected)


def test_counts_past_the_context_and_ollama_s_trim_count_the_bos(llama2_served, llama2_runtime):
    """A prompt past the context is counted by the count routes with its BOS, and Ollama's truncate false refuses
    it with the count that has the BOS."""
    tokenizer = llama2_runtime.tokenizer
    long = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 12}]
    expected = 1 + len(tokenizer.encode(tokenizer.render_chat(long), add_special_tokens=False))
    assert expected > llama2_runtime.backend.max_context
    status, body = llama2_served.post("/v1/messages/count_tokens", {"model": "tiny-host", "messages": long})
    assert (status, body) == (200, {"input_tokens": expected})
    status, body = llama2_served.post("/v1/responses/input_tokens", {"input": long[0]["content"]})
    assert status == 200, body
    assert body["input_tokens"] == expected
    status, body = llama2_served.post("/api/chat", {"model": "tiny-host", "messages": long, "stream": False,
                                                   "truncate": False})
    assert status == 400
    assert f"the prompt has {expected} tokens" in body["error"]


def test_llama_cpp_tokenizes_the_chat_prompt_as_chat_ids(tmp_path):
    """Against llama.cpp itself (llama-cpp-python over the exported GGUF): the rendering with the BOS text cut off
    where the vocabulary adds BOS (common/chat.cpp, common_chat_template_direct_apply), tokenized with add_special
    and parse_special true (llama-server's tokenize_input_prompts), for TinyLlama's kind of tokenizer in the
    tokenizer.json form of the Hub's (a Prepend normalizer) and Gemma's, whose template writes the BOS."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    pytest.importorskip("gguf")
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_gguf_tokenizer_parity36 import _export, _llama2_normalizer

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! What's 12345 + 1?"},
            {"role": "assistant", "content": "12346."}, {"role": "user", "content": "Café 🙂?"}]
    for name, make in (("llama2", _llama2_normalizer), ("gemma", tiny.tiny_gemma_tokenizer)):
        (tmp_path / name).mkdir()
        bundle, report = _export(tmp_path / name, make())
        tokenizer = open_runtime(bundle.path, threads=1).tokenizer
        model = llama_cpp.Llama(str(report.path), vocab_only=True, verbose=False)
        assert model.metadata.get("tokenizer.ggml.add_bos_token") == "true"
        rendered = tokenizer.render_chat(chat)
        bos_text = model._model.token_get_text(model.token_bos())
        cut = rendered[len(bos_text):] if rendered.startswith(bos_text) else rendered
        expected = model.tokenize(cut.encode(), add_bos=True, special=True)
        assert expected.count(model.token_bos()) == 1, name
        assert tokenizer.chat_ids(rendered) == expected, name


def test_ollama_context_and_trimming_count_the_bos(llama2_served, llama2_runtime):
    """/api/generate's ``context`` goes in front of the rendered prompt and the whole is tokenized with BOS in front
    (Ollama's runner: ``Encode(prompt, true)``); /api/chat's trimming counts each try as the prompt runs, BOS
    included, so a conversation one token too long for ``num_ctx`` with its BOS drops its oldest exchange rather
    than being refused for leaving no room (counted without it, the whole conversation seemed to fit and was then
    refused)."""
    tokenizer = llama2_runtime.tokenizer
    status, first = llama2_served.post("/api/generate", {"model": "tiny-host", "prompt": "Hi", "stream": False,
                                                        "options": {"num_predict": 1}})
    assert status == 200, first
    status, body = llama2_served.post("/api/generate", {"model": "tiny-host", "prompt": "Hello there", "stream": False,
                                                       "context": first["context"], "options": {"num_predict": 1}})
    assert status == 200, body
    text = tokenizer.tokenizer.decode(first["context"], skip_special_tokens=False) + tokenizer.render_chat(MESSAGES)
    assert body["prompt_eval_count"] == 1 + len(tokenizer.encode(text, add_special_tokens=False))

    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, *MESSAGES]
    whole = len(tokenizer.chat_ids(tokenizer.render_chat(chat)))
    status, body = llama2_served.post("/api/chat", {"model": "tiny-host", "messages": chat, "stream": False,
                                                   "options": {"num_predict": 1, "num_ctx": whole}})
    assert status == 200, body
    # Ollama drops one message at a time (this template does not ask the roles to alternate)
    assert body["prompt_eval_count"] == len(tokenizer.chat_ids(tokenizer.render_chat(chat[1:])))
