"""Serve's refusals carry their fixes, in the words of who reads them.

- A chat template's own refusal (``raise_exception``: "Unknown role: ipython") reached a server's client as a bare
  400 with no fix, and the fix the runtime words names the command line's --raw, which a client has none of: the
  client is told to change the messages, or to send the prompt already rendered (/v1/completions, Ollama's
  /api/generate with raw); the Python API names create_completion; the command line's words stay as they were.
- /infill's overflow refusal was built on its own: without the refusal's facts (``context``, ``headline``) and the fix
  every other overflow names after the field's (-c up to the bundle's context, a rebuild with more).
- OpenAI's overflow headline was written twice (the embedding runtime's by hand): one function, which the runtime
  imports without the server.
- ``load(path, n_ctx=64)`` was refused as though a bundle's context could not be lowered: it holds the run to 64
  tokens, as llama-cpp-python's ``Llama(n_ctx=64)`` and ``-c 64``; past the bundle's it is refused naming the build.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgesdk
from edgesdk.api import RequestError, _request_error
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.embedding import EmbeddingError, fitted
from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.text import template_refusal_fix
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.infill import parse_infill_request
from tests.unit.test_serve_infill40 import qwen_bundle, qwen_runtime  # noqa: F401  (fixtures)

USER = [{"role": "user", "content": "Where is the lamp?"}]
ROLE_TEMPLATE = ("{% for message in messages %}{% if message['role'] != 'user' %}"
                 "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}{{ message['content'] }}"
                 "{% endfor %}")


@pytest.fixture
def own(tiny_bundle):
    """A runtime of its own: the tests change its chat template."""
    return open_runtime(tiny_bundle.path, threads=1)


def _refused(runtime, template: str, messages: list[dict]) -> ApiError:
    runtime.tokenizer.template_source, runtime.tokenizer._template = template, None
    with pytest.raises(ApiError) as refused:
        Completer(runtime, ServeDefaults(max_tokens=4)).prompt_ids(parse_chat_request({"messages": messages}))
    return refused.value


def test_a_template_s_refusal_reaches_a_client_with_a_server_s_fix(own):
    refusal = _refused(own, ROLE_TEMPLATE, [*USER, {"role": "assistant", "content": "Here."}, *USER])
    assert refusal.status == 400
    assert refusal.param == "messages"
    assert refusal.message.startswith("chat template refused the messages: Unknown role: assistant; ")
    assert "give the messages the roles, in the order, that the template's message asks for" in refusal.message
    assert "/v1/completions" in refusal.message
    assert "/api/generate" in refusal.message
    assert "--raw" not in refusal.message
    assert "--system" not in refusal.message


def test_a_refusal_not_about_roles_tells_the_client_to_change_the_messages(own):
    refusal = _refused(own, "{{ raise_exception('The word lamp is not allowed') }}", USER)
    assert "change the messages so the template takes them, or send the prompt" in refusal.message
    assert "--raw" not in refusal.message
    assert "--system" not in refusal.message


def test_the_python_api_words_the_refusal_s_fix_for_python(own):
    error = _request_error("create_chat_completion",
                           _refused(own, ROLE_TEMPLATE, [*USER, {"role": "assistant", "content": "Here."}, *USER]))
    assert isinstance(error, RequestError)
    assert error.problem == ("create_chat_completion (messages): chat template refused the messages: Unknown role: "
                             "assistant")
    assert "create_completion" in error.fix
    assert "--raw" not in error.fix
    assert "/v1/" not in error.fix


def test_the_command_line_s_words_stay_as_they_were():
    assert template_refusal_fix("No way") == (
        "change the messages so the template takes them (the prompt, --system or the conversation so far), or pass "
        "--raw to feed the prompt without the template (a server's /v1/completions takes a prompt as it is)")
    assert template_refusal_fix("System role not supported", "cli") == (
        "give the messages the roles, in the order, that the template's message asks for, or pass --raw to feed the "
        "prompt without the template (a server's /v1/completions takes a prompt as it is)")


def test_an_infill_overflow_is_the_context_refusal_with_its_counts(qwen_runtime):  # noqa: F811
    long_text = "x = 1\n" * 60  # past the 256-token context
    with pytest.raises(ApiError) as refused:
        parse_infill_request({"input_prefix": "a", "input_suffix": "b", "prompt": long_text},
                             Completer(qwen_runtime, ServeDefaults(max_tokens=8)))
    error = refused.value
    tokens, limit, _positions = error.context
    assert limit == 256
    assert tokens > limit
    assert error.headline.startswith(f"This model's maximum context length is 256 tokens. However, your infill "
                                     f"prompt resulted in {tokens} tokens ('input_prefix' ")
    assert error.headline.endswith("as llama-server keeps them within its batch of 2048)")
    assert error.message.startswith(f"{error.headline}: send a shorter 'prompt' (the cursor line's text, which is "
                                    "kept whole), or put its head in 'input_prefix'")
    assert "--max-context" in error.message  # the bundle's fix after the field's own


def test_an_infill_overflow_of_a_run_held_below_its_bundle_names_raising_c(qwen_bundle):  # noqa: F811
    runtime = open_runtime(qwen_bundle.path, threads=1, context=64)
    with pytest.raises(ApiError) as refused:
        parse_infill_request({"input_prefix": "a", "input_suffix": "b", "prompt": "x = 1\n" * 20},
                             Completer(runtime, ServeDefaults(max_tokens=8)))
    assert refused.value.code == "context_length_exceeded"
    assert "raise -c to" in refused.value.message
    assert "up to the bundle's 256" in refused.value.message


def test_openai_s_overflow_headline_is_one_function_the_runtime_imports_without_the_server():
    """The embedding runtime wrote OpenAI's words by hand beside serve's overflow_headline: one wording, one place."""
    import subprocess
    import sys

    from edgesdk.errors import overflow_headline
    from edgesdk.runtime import embedding
    from edgesdk.serve import api

    assert api.overflow_headline is overflow_headline
    assert embedding.overflow_headline is overflow_headline
    with pytest.raises(EmbeddingError) as refused:
        fitted([1] * 9, 8)
    assert refused.value.problem == overflow_headline(9, 8, "input")
    assert refused.value.problem == ("This model's maximum context length is 8 tokens. However, your input resulted "
                                     "in 9 tokens")
    loaded = subprocess.run([sys.executable, "-c", "import sys, edgesdk.runtime.embedding; "
                             "print(sorted(m for m in sys.modules if m.startswith('edgesdk.serve')))"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_load_n_ctx_holds_the_run_s_context(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, n_ctx=np.int64(64), max_tokens=4) as model:
        assert model.n_ctx() == 64
        assert model.max_context == 64
        with pytest.raises(RequestError) as refused:
            model.create_completion(list(range(1, 80)))
        assert "64" in str(refused.value)
    with edgesdk.Model(tiny_bundle.path, threads=1, n_ctx=0) as model:  # 0: the bundle's, llama-cpp-python's too
        assert model.n_ctx() == 256
    with edgesdk.load(tiny_bundle.path, threads=1, n_ctx=256) as model:
        assert model.n_ctx() == 256


def test_load_n_ctx_past_the_bundle_s_names_the_build(tiny_bundle):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, n_ctx=512)
    assert "n_ctx=512 is more than the 256 tokens" in refused.value.problem
    assert "pass n_ctx=256 or less" in refused.value.fix
    assert "build_bundle(..., max_context=512)" in refused.value.fix


@pytest.mark.parametrize("value", [-1, 1.5, "64", True])
def test_load_n_ctx_of_the_wrong_kind_is_refused_by_name(tiny_bundle, value):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, n_ctx=value)
    assert refused.value.problem.startswith("load(): n_ctx=")
    assert "whole number of tokens" in refused.value.problem
