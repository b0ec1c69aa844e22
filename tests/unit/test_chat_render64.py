"""Chat rendering, review 64.

- A template's own refusal (``raise_exception``) got the fix "check the roles and order" whatever it said: a template
  refuses for its own reasons (Llama 3.1's "This model only supports single tool-calls at once!", a word it does not
  take), and the fix now sends the caller to the messages or to ``--raw``, naming roles only where the refusal does.
  Serve answers the same refusal with a 400 carrying the same text.
- Only ``bos_token`` and ``eos_token`` reached the template, where transformers' ``apply_chat_template`` passes every
  special token its tokenizer has (``special_tokens_map``): a template writing ``{{ pad_token }}`` or
  ``{{ unk_token }}`` rendered them empty. The manifest's ``pad_token`` and the tokenizer.json model's unknown token
  now reach it, compared byte for byte with transformers' rendering; one the bundle does not have stays undefined.
"""

from __future__ import annotations

import pytest

from edgesdk.errors import BundleError
from edgesdk.runtime.text import ChatTokenizer
from tests._utils import tiny

pytest.importorskip("transformers")

USER = [{"role": "user", "content": "hi"}]
REFUSES_A_WORD = ("{% for message in messages %}{% if message['content'] == 'bad' %}"
                  "{{ raise_exception('The word bad is not allowed here') }}{% endif %}"
                  "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}")
# meta-llama/Llama-3.1-8B-Instruct's check on an assistant message's tool calls
LLAMA31_TOOL_CALLS = ("{% for message in messages %}{% if message.tool_calls is defined %}"
                      "{% if message.tool_calls|length != 1 %}"
                      "{{ raise_exception('This model only supports single tool-calls at once!') }}{% endif %}"
                      "{% endif %}{{ message['content'] }}{% endfor %}")
# mistralai/Mistral-7B-Instruct-v0.2's check
ALTERNATE = ("{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
             "[{{ message['role'] }}]{{ message['content'] }}{% endfor %}")
SPECIALS = ("{{ messages[0]['content'] }}[{{ pad_token }}][{{ unk_token }}][{{ sep_token }}][{{ cls_token }}]"
            "[{{ pad_token is defined }}|{{ unk_token is defined }}|{{ sep_token is defined }}"
            "|{{ cls_token is defined }}]")


def _facts(fast) -> dict:
    """The manifest's tokenizer facts as the build writes them from the transformers tokenizer."""
    return {"bos_token": fast.bos_token, "eos_token": fast.eos_token, "pad_token": fast.pad_token}


def _chat_tokenizer(folder, fast, template: str, facts: dict | None = None) -> ChatTokenizer:
    fast.save_pretrained(folder)
    path = folder / "chat_template.jinja"
    path.write_text(template, encoding="utf-8")
    return ChatTokenizer(folder / "tokenizer.json", _facts(fast) if facts is None else facts, path)


def _reference(fast, template: str, messages: list[dict], **kwargs) -> str:
    return fast.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                    **kwargs)


@pytest.fixture(scope="module")
def byte_level():
    return tiny.tiny_tokenizer()


@pytest.fixture(scope="module")
def gemma():
    return tiny.tiny_gemma_tokenizer()


def test_a_refusal_that_is_not_about_roles_gets_a_fix_that_fits_it(tmp_path, byte_level):
    chat = _chat_tokenizer(tmp_path, byte_level, REFUSES_A_WORD)
    with pytest.raises(BundleError) as refused:
        chat.prompt_ids("bad", raw=False)
    assert refused.value.problem == "chat template refused the messages: The word bad is not allowed here"
    fix = refused.value.fix
    assert "role" not in fix
    assert "change the messages so the template takes them" in fix
    assert "--system" in fix
    assert "--raw" in fix
    assert chat.prompt_ids("good", raw=False)  # the messages it takes render


def test_llama31s_single_tool_call_refusal_is_not_told_to_check_the_roles(tmp_path, byte_level):
    chat = _chat_tokenizer(tmp_path, byte_level, LLAMA31_TOOL_CALLS)
    call = {"type": "function", "function": {"name": "f", "arguments": {}}}
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": [call, call]}]
    with pytest.raises(BundleError, match="only supports single tool-calls at once") as refused:
        chat.render_chat(messages)
    assert "role" not in refused.value.fix
    assert "--raw" in refused.value.fix


def test_a_refusal_about_roles_keeps_the_roles_hint(tmp_path, byte_level):
    chat = _chat_tokenizer(tmp_path, byte_level, ALTERNATE)
    with pytest.raises(BundleError, match="roles must alternate") as refused:
        chat.render_chat([*USER, *USER])
    assert refused.value.fix.startswith("give the messages the roles, in the order, that the template's message "
                                        "asks for")
    assert "--raw" in refused.value.fix


def test_a_template_gets_the_special_tokens_transformers_gives_it(tmp_path, byte_level):
    """The byte-level tokenizer (SmolLM2's kind): its pad token is in the manifest; sep and cls it has none of."""
    chat = _chat_tokenizer(tmp_path, byte_level, SPECIALS.replace("[{{ unk_token }}]", "").replace(
        "|{{ unk_token is defined }}", ""))
    expected = _reference(byte_level, chat.template_source, USER)
    assert chat.render_chat(USER) == expected
    assert expected == "hi[<|endoftext|>][][][True|False|False]"


def test_the_unknown_token_comes_from_the_tokenizer_json_model(tmp_path, gemma):
    """Gemma's tokenizer: a BPE model naming <unk>, which the manifest does not record."""
    chat = _chat_tokenizer(tmp_path, gemma, SPECIALS)
    expected = _reference(gemma, SPECIALS, USER)
    assert chat.render_chat(USER) == expected
    assert expected == "hi[<pad>][<unk>][][][True|True|False|False]"


def test_a_unigram_models_unknown_token_reaches_the_template(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("h", -2.0), ("i", -2.0), ("hi", -1.0)]
    inner = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    inner.pre_tokenizer = pre_tokenizers.Metaspace()
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    chat = _chat_tokenizer(tmp_path, fast, SPECIALS)
    expected = _reference(fast, SPECIALS, USER)
    assert chat.render_chat(USER) == expected
    assert expected == "hi[][<unk>][][][False|True|False|False]"


def test_template_kwargs_go_over_a_special_token_as_in_transformers(tmp_path, gemma):
    chat = _chat_tokenizer(tmp_path, gemma, SPECIALS)
    rendered = chat.render_chat(USER, template_kwargs={"pad_token": "<P>", "sep_token": "<S>"})
    assert rendered == _reference(gemma, SPECIALS, USER, pad_token="<P>", sep_token="<S>")
    assert rendered == "hi[<P>][<unk>][<S>][][True|True|True|False]"


def test_a_built_bundle_hands_its_pad_token_to_the_template_and_serve_refuses_as_run_does(tiny_bundle):
    """Through the real bundle: the manifest's pad_token reaches the template; a template's refusal is serve's 400
    with the text run prints."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    assert tiny_bundle.manifest["tokenizer"]["pad_token"] == "<|endoftext|>"
    runtime = open_runtime(tiny_bundle.path, threads=1)
    tokenizer = runtime.tokenizer
    tokenizer.template_source, tokenizer._template = "{{ messages[0]['content'] }}[{{ pad_token }}]", None
    assert tokenizer.render_chat(USER) == "hi[<|endoftext|>]"

    tokenizer.template_source, tokenizer._template = REFUSES_A_WORD, None
    with pytest.raises(BundleError) as refused:
        tokenizer.prompt_ids("bad", raw=False)
    served = Served(runtime, ServeDefaults(max_tokens=2))
    try:
        status, body = served.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "bad"}]})
    finally:
        served.close()
    assert status == 400, body
    assert body["error"]["param"] == "messages"
    assert body["error"]["message"].startswith(refused.value.problem + "; ")  # then serve's own fix
