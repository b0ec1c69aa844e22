"""A chat template that takes no system role gets the leading system message merged into the next message, as
llama.cpp hands the messages to it (common/chat.cpp, ``workaround::system_message_not_supported``, where the
template's caps say ``supports_system_role`` false: minja's probe renders a system and a user needle and looks for
the system one). transformers' ``apply_chat_template`` renders the messages as given, so Gemma 2's template raises
"System role not supported" and Mistral v0.2's "Conversation roles must alternate"; edgesdk refused them too, so
``edgesdk run --system`` and a server request with a system message failed on such a bundle, where llama-cli and
llama-server answer. The merged messages are compared with transformers' rendering of the same merged messages."""

from __future__ import annotations

import pytest

from edgesdk.errors import BundleError
from edgesdk.runtime.text import ChatTokenizer
from tests._utils import tiny

pytest.importorskip("transformers")

FACTS = {"bos_token": "<bos>", "eos_token": "<eos>"}

# google/gemma-2-2b-it's template
GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)
# mistralai/Mistral-7B-Instruct-v0.2's template
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
# microsoft/Phi-3-mini-4k-instruct's first template: it leaves system messages out without a word
PHI3_FIRST = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\\n'}}{% endif %}{% endfor %}"
)
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Where is the lamp?"}
ANSWER = {"role": "assistant", "content": "In the hall."}
AGAIN = {"role": "user", "content": "And the heater?"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    fast = tiny.tiny_tokenizer()
    fast.save_pretrained(folder)
    return folder, fast


def _chat_tokenizer(made, template: str) -> ChatTokenizer:
    folder, _ = made
    path = folder / "chat_template.jinja"
    path.write_text(template, encoding="utf-8")
    return ChatTokenizer(folder / "tokenizer.json", FACTS, path)


def _reference(made, template: str, messages: list[dict], **kwargs) -> str:
    """transformers' rendering (with the bundle's BOS and EOS texts) of ``messages``."""
    _, fast = made
    kwargs.setdefault("add_generation_prompt", True)
    return fast.apply_chat_template(messages, chat_template=template, tokenize=False, bos_token=FACTS["bos_token"],
                                    eos_token=FACTS["eos_token"], **kwargs)


def _merged(text: str) -> dict:
    return {"role": "user", "content": f"{SYSTEM['content']}\n{text}"}


@pytest.mark.parametrize("template", [GEMMA2, MISTRAL], ids=["gemma2", "mistral-v0.2"])
def test_a_template_that_refuses_the_system_role_gets_it_merged_into_the_first_user_message(made, template):
    chat = _chat_tokenizer(made, template)
    with pytest.raises(Exception, match="System role not supported|roles must alternate"):
        _reference(made, template, [SYSTEM, USER])  # transformers renders the messages as given
    messages = [SYSTEM, USER, ANSWER, AGAIN]
    assert chat.render_chat(messages) == _reference(made, template, [_merged(USER["content"]), ANSWER, AGAIN])
    assert chat.render_chat([SYSTEM, USER]) == _reference(made, template, [_merged(USER["content"])])


def test_gemma2_renders_the_system_text_on_a_line_before_the_user_text(made):
    chat = _chat_tokenizer(made, GEMMA2)
    assert chat.render_chat([SYSTEM, USER]) == (
        "<bos><start_of_turn>user\nBe brief.\nWhere is the lamp?<end_of_turn>\n<start_of_turn>model\n")


def test_run_with_system_takes_a_template_without_a_system_role(made):
    """``edgesdk run --system`` (prompt_ids) on a Gemma 2 bundle: llama-cli -sys answers there."""
    chat = _chat_tokenizer(made, GEMMA2)
    ids = chat.prompt_ids(USER["content"], raw=False, system=SYSTEM["content"])
    assert ids == chat.chat_ids(_reference(made, GEMMA2, [_merged(USER["content"])]))


def test_a_template_that_leaves_system_messages_out_gets_the_system_text_in_the_user_message(made):
    chat = _chat_tokenizer(made, PHI3_FIRST)
    rendered = chat.render_chat([SYSTEM, USER])
    assert SYSTEM["content"] in rendered
    assert rendered == _reference(made, PHI3_FIRST, [_merged(USER["content"])])


@pytest.mark.parametrize("template", [GEMMA2, MISTRAL], ids=["gemma2", "mistral-v0.2"])
def test_an_empty_system_message_leaves_the_user_text_as_it_is(made, template):
    """``edgesdk run --system ''`` (a system message with no text): minja merges no empty system text."""
    chat = _chat_tokenizer(made, template)
    assert chat.render_chat([{"role": "system", "content": ""}, USER]) == _reference(made, template, [USER])
    assert chat.prompt_ids(USER["content"], raw=False, system="") == chat.chat_ids(_reference(made, template, [USER]))


def test_a_system_message_alone_is_left_for_the_template_to_refuse(made):
    """Nothing to merge it into: the template's own refusal says why (llama.cpp drops it and renders nothing)."""
    chat = _chat_tokenizer(made, GEMMA2)
    with pytest.raises(BundleError, match="System role not supported"):
        chat.render_chat([SYSTEM])


def test_a_system_message_before_an_assistant_message_goes_into_that_message(made):
    """llama.cpp merges the system text into the next message whatever its role."""
    chat = _chat_tokenizer(made, PHI3_FIRST)
    merged = {**ANSWER, "content": f"{SYSTEM['content']}\n{ANSWER['content']}"}
    assert chat.render_chat([SYSTEM, ANSWER, USER]) == _reference(made, PHI3_FIRST, [merged, USER])


def test_a_begun_answer_after_a_merged_system_message_goes_on_from_its_text(made):
    chat = _chat_tokenizer(made, GEMMA2)
    begun = {"role": "assistant", "content": "In the"}
    assert chat.render_chat([SYSTEM, USER, begun], continue_final=True) == _reference(
        made, GEMMA2, [_merged(USER["content"]), begun], continue_final_message=True, add_generation_prompt=False)


def test_a_template_that_takes_the_system_role_renders_it_as_given(made):
    chat = _chat_tokenizer(made, tiny.CHAT_TEMPLATE)
    messages = [SYSTEM, USER, ANSWER, AGAIN]
    assert chat.render_chat(messages) == _reference(made, tiny.CHAT_TEMPLATE, messages)


def test_the_probe_follows_a_template_swapped_on_the_same_tokenizer(made):
    chat = _chat_tokenizer(made, tiny.CHAT_TEMPLATE)
    assert chat.render_chat([SYSTEM, USER]) == _reference(made, tiny.CHAT_TEMPLATE, [SYSTEM, USER])
    chat.template_source, chat._template = GEMMA2, None
    assert chat.render_chat([SYSTEM, USER]) == _reference(made, GEMMA2, [_merged(USER["content"])])


def test_a_template_still_refuses_roles_out_of_order_after_the_merge(made):
    chat = _chat_tokenizer(made, GEMMA2)
    with pytest.raises(BundleError, match="Conversation roles must alternate"):
        chat.render_chat([SYSTEM, USER, USER])


@pytest.mark.parametrize("version", ["3.1.5", "3.0.3"])
def test_a_jinja_whose_sandbox_has_known_escapes_is_refused_naming_it(made, monkeypatch, version):
    """transformers refuses jinja2 < 3.1.6 for chat templates (chat_template_utils.py, "Older versions have known
    sandbox escapes"): a template from the model's repository could run code outside the sandbox there."""
    import jinja2

    from edgesdk.errors import EdgeSDKError

    monkeypatch.setattr(jinja2, "__version__", version)
    chat = _chat_tokenizer(made, tiny.CHAT_TEMPLATE)
    with pytest.raises(EdgeSDKError, match=rf"jinja2 {version} is installed, .*jinja2 >= 3\.1\.6") as refused:
        chat.render_chat([USER])
    assert "jinja2>=3.1.6" in refused.value.fix


@pytest.mark.parametrize("version", ["3.1.6", "3.1.6rc1", "3.2.0.dev0", "4.0"])
def test_a_jinja_without_known_escapes_renders(made, monkeypatch, version):
    import jinja2

    monkeypatch.setattr(jinja2, "__version__", version)
    chat = _chat_tokenizer(made, tiny.CHAT_TEMPLATE)
    assert chat.render_chat([USER]) == _reference(made, tiny.CHAT_TEMPLATE, [USER])


# a Llama 3 style template: it trims each message's text
TRIMMING = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@pytest.mark.parametrize("begun", ["\n", "  ", " \n"])
def test_a_begun_answer_of_whitespace_alone_is_kept_where_the_template_keeps_it(made, begun):
    """transformers' continue_final_message keeps it (ChatML writes the text as given); it was dropped."""
    chat = _chat_tokenizer(made, tiny.CHAT_TEMPLATE)
    messages = [USER, {"role": "assistant", "content": begun}]
    continued = chat.render_chat(messages, continue_final=True)
    assert continued == _reference(made, tiny.CHAT_TEMPLATE, messages, continue_final_message=True,
                                   add_generation_prompt=False)
    assert continued == chat.render_chat([USER]) + begun


@pytest.mark.parametrize("begun", ["", "\n", "  "])
def test_a_begun_answer_of_whitespace_a_template_trims_leaves_the_generation_prompt(made, begun):
    """Where the template trims it, the turn's header stays whole (transformers cuts back over its line breaks)."""
    chat = _chat_tokenizer(made, TRIMMING)
    messages = [USER, {"role": "assistant", "content": begun}]
    assert chat.render_chat(messages, continue_final=True) == chat.render_chat([USER])
    assert chat.render_chat([USER]).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
