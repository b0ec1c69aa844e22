"""Chat template rendering, review 55 (edgesdk/runtime/text.py): what a failing template's error blames."""

from __future__ import annotations

import pytest

from edgesdk.errors import BundleError
from edgesdk.runtime.text import ChatTokenizer

pytest.importorskip("transformers")

# a template whose own code fails on an assistant message with no text (DeepSeek-style concatenation, no guard)
UNGUARDED = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<A>{{ m['content'] + '<end>' }}"
             "{% else %}<U>{{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<A>{% endif %}")
# a template that calls namespace(), which a template variable of that name replaces (Qwen3's template does)
CALLS_NAMESPACE = ("{% set ns = namespace(n=0) %}{% for m in messages %}<U>{{ m['content'] }}{% endfor %}"
                   "{% if add_generation_prompt %}<A>{% endif %}")


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    from tests._utils import tiny

    folder = tmp_path_factory.mktemp("byte-level55")
    tiny.tiny_tokenizer().save_pretrained(folder)
    return folder / "tokenizer.json"


def _tokenizer(tokenizer_json, tmp_path, template: str, template_kwargs: dict) -> ChatTokenizer:
    path = tmp_path / "chat_template.jinja"
    path.write_text(template, encoding="utf-8")
    tokenizer = ChatTokenizer(tokenizer_json, {}, path)
    tokenizer.template_kwargs = template_kwargs  # a server's --chat-template-kwargs, on every rendering
    return tokenizer


def test_a_template_failing_on_its_own_code_does_not_blame_the_template_variables(tokenizer_json, tmp_path):
    """The template fails on the messages with or without the variables: the error blamed 'enable_thinking
    (chat_template_kwargs)' and told the user to change or leave out a variable that had nothing to do with it."""
    tokenizer = _tokenizer(tokenizer_json, tmp_path, UNGUARDED, {"enable_thinking": False})
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "again"}]
    with pytest.raises(BundleError) as caught:
        tokenizer.render_chat(messages)
    assert "enable_thinking" not in caught.value.problem
    assert "chat_template_kwargs" not in caught.value.problem
    assert caught.value.problem.startswith("the bundle's chat template failed: TypeError")
    assert "fixed template" in caught.value.fix


def test_a_template_variable_that_makes_the_template_fail_is_still_named(tokenizer_json, tmp_path):
    tokenizer = _tokenizer(tokenizer_json, tmp_path, CALLS_NAMESPACE, {"namespace": 1})
    with pytest.raises(BundleError) as caught:
        tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert "template variables namespace (chat_template_kwargs): TypeError" in caught.value.problem
    assert "leave them out" in caught.value.fix
    tokenizer.template_kwargs = {}
    assert tokenizer.render_chat([{"role": "user", "content": "hi"}]) == "<U>hi<A>"


def test_a_lone_surrogate_from_a_json_escape_is_told_as_one_not_as_latin1():
    """A JSON "\\ud83d" without its other half (a client that cut a string between the halves of an emoji) was told
    to convert its text from Latin-1 with iconv, which has nothing to do with it."""
    import json

    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.text import check_utf8

    with pytest.raises(EdgeSDKError) as caught:
        check_utf8(json.loads('"hi \\ud83d there"'), "messages[0].content")
    assert caught.value.problem.startswith("messages[0].content is not valid UTF-8 (U+D83D at character 3): ")
    assert "surrogate pair" in caught.value.problem
    assert "iconv" not in caught.value.fix
    assert "Latin-1" not in caught.value.fix
    with pytest.raises(EdgeSDKError) as caught:  # a byte that is not UTF-8 (surrogateescape) is still told as one
        check_utf8(b"caf\xe9".decode("utf-8", "surrogateescape"), "--system")
    assert caught.value.problem == "--system is not valid UTF-8 (byte 0xe9 at character 3)"
    assert "iconv" in caught.value.fix


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_tokenizer_path_with_no_file_to_read_is_not_called_unreadable_json(tmp_path, kind):
    """A manifest whose 'tokenizer.file' names no file was told 'it does not read as JSON', as if the file there
    held something other than JSON."""
    from edgesdk.runtime.text import load_tokenizer

    path = tmp_path / "tokenizer.json"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(BundleError) as caught:
        load_tokenizer(path)
    assert caught.value.problem.startswith(f"{path} is not a tokenizer.json: it cannot be read (")
    assert "JSON" not in caught.value.problem.split(": ", 1)[1]
    assert "tokenizer.file" in caught.value.fix
