"""``edgesdk serve``'s fill in the middle as the editor plugins call it: the bodies below are the ones llama.vscode
(src/llama-server.ts, ``createRequestPayload``), llama.vim (autoload/llama.vim, ``llama#fim`` and ``s:ring_update``)
and Continue's Ollama provider (core/llm/llms/Ollama.ts, ``_getGenerateOptions``) send, field for field, and the
answers are read as they read them. The tiny FIM bundle is tests/unit/test_serve_infill40.py's.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.unit import test_serve_infill40 as infill40

pytest.importorskip("torch")
pytest.importorskip("transformers")

NAME, PREFIX, SUFFIX = infill40.NAME, infill40.PREFIX, infill40.SUFFIX
# the tiny FIM bundle and its server, as tests/unit/test_serve_infill40.py builds them
qwen_bundle, qwen_runtime, fim_served = infill40.qwen_bundle, infill40.qwen_runtime, infill40.fim_served

CHUNKS = [{"text": "def g(y):\n    return y * 2\n", "time": [1733, 220915], "filename": "util.py"},
          {"text": "import os\n", "time": [1733, 220916], "filename": "main.py"}]


def _vscode(n_predict: int = 6, **extra) -> dict:
    """llama.vscode's /infill body (``createRequestPayload(false, ...)``) with its defaults."""
    return {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": CHUNKS, "prompt": "    return ",
            "n_predict": n_predict, "top_k": 40, "top_p": 0.99, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, **extra}


def _vscode_warmup() -> dict:
    """llama.vscode's ``updateExtraContext`` body: the extra context into the cache, nothing generated."""
    return {"input_prefix": "", "input_suffix": "", "input_extra": CHUNKS, "prompt": "", "n_predict": 0,
            "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]


def _vim() -> dict:
    """llama.vim's ``llama#fim`` body."""
    return {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": CHUNKS, "prompt": "    return ",
            "n_predict": 6, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90, "stream": False,
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 250, "response_fields": VIM_FIELDS}


def test_llama_vscode_s_infill_is_answered_with_what_it_reads(fim_served, qwen_runtime):
    # the tiny random model's next token is no clear pick (the most likely of its 40 candidates 0.06), and
    # llama.cpp's infill sampler ends an answer whose text tokens are all under 0.2 with the EOT token at once; a
    # bias on "x" makes "x" the pick, so the answer runs to n_predict, as a code model's does
    x = qwen_runtime.tokenizer.token_id("x")
    status, answer = fim_served.post("/infill", _vscode(logit_bias=[[x, 20]]))
    assert status == 200, answer
    assert isinstance(answer["content"], str)
    assert answer["tokens_predicted"] == 6
    assert isinstance(answer["generation_settings"], dict)
    assert answer["truncated"] is False
    # at the token limit the last token is never fed back: llama-server's tokens_cached (slot.prompt.n_tokens())
    assert answer["tokens_cached"] == answer["tokens_evaluated"] + answer["tokens_predicted"] - 1
    for field in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                  "predicted_per_second"):
        assert field in answer["timings"], field
    # the chain the plugin sends, llama.cpp's infill sampler last
    assert answer["generation_settings"]["samplers"] == ["top_k", "top_p", "infill"]


def test_llama_vscode_s_extra_context_warmup_is_cached_for_its_next_infill(fim_served):
    status, warm = fim_served.post("/infill", _vscode_warmup())
    assert status == 200, warm
    assert warm["content"] == ""
    assert warm["tokens_predicted"] == 0
    status, answer = fim_served.post("/infill", _vscode())
    assert status == 200, answer
    # the extra context the warm-up put in the KV cache is the start of the next prompt: it is not prefilled again
    assert answer["timings"]["cache_n"] > 0
    assert answer["timings"]["prompt_n"] == answer["tokens_evaluated"] - answer["timings"]["cache_n"]
    status, again = fim_served.post("/infill", _vscode())
    # the same prompt: all of it but its last token from the cache, which is run again for its logits, as
    # llama-server runs it
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1
    assert again["content"] == answer["content"]


def test_llama_vim_s_response_fields_come_back_as_it_reads_them(fim_served):
    status, whole = fim_served.post("/infill", {**_vim(), "response_fields": None})
    assert status == 200, whole
    status, answer = fim_served.post("/infill", _vim())
    assert status == 200, answer
    # llama-server's json_get_nested_values: one flat key per path asked for, "timings/prompt_n" as written
    assert set(answer) == set(VIM_FIELDS)
    assert answer["content"] == whole["content"]
    assert answer["timings/predicted_n"] == whole["timings"]["predicted_n"]
    assert answer["truncated"] is False
    assert answer["tokens_cached"] == whole["tokens_cached"]
    # a path the answer does not have is left out; llama.vim's ring update asks for [""]: an empty object
    status, ring = fim_served.post("/infill", {"input_prefix": "", "input_suffix": "", "input_extra": CHUNKS,
                                               "prompt": "", "n_predict": 0, "temperature": 0.0, "stream": False,
                                               "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 1,
                                               "t_max_predict_ms": 1, "response_fields": [""]})
    assert status == 200, ring
    assert ring == {}
    status, some = fim_served.post("/completion", {"prompt": "a", "n_predict": 2,
                                                  "response_fields": ["content", "timings/nope", "stop_type"]})
    assert status == 200, some
    assert set(some) == {"content", "stop_type"}
    assert some["stop_type"] == "limit"


def test_a_streamed_answer_s_last_event_holds_the_response_fields(fim_served):
    status, _, payload = fim_served.request("POST", "/infill", {**_vim(), "stream": True})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    assert all(set(event) >= {"content", "stop"} for event in events[:-1])
    assert set(events[-1]) == set(VIM_FIELDS)


def test_bad_response_fields_are_refused_naming_the_field(fim_served):
    status, body = fim_served.post("/infill", {**_vim(), "response_fields": "content"})
    assert status == 400, body
    assert body["error"]["param"] == "response_fields"


# ------------------------------------------------------------------------------------------------ Continue


def test_continue_sees_the_suffix_in_the_template_and_its_fim_body_is_answered(fim_served, qwen_runtime):
    ollama = pytest.importorskip("ollama")
    status, shown = fim_served.post("/api/show", {"name": NAME})
    assert status == 200, shown
    # Continue's Ollama provider sends a suffix only where the template reads ".Suffix" (Ollama.ts, fimSupported)
    assert ".Suffix" in shown["template"]
    assert "<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>" in shown["template"]
    for line in shown["parameters"].split("\n"):  # Continue's parser of the parameters, line by line
        assert re.match(r'^(\S+)\s+((?:".*")|\S+)$', line), line
    body = {"model": NAME, "prompt": PREFIX, "suffix": SUFFIX,
            "options": {"temperature": 0.01, "top_p": 0.9, "top_k": 40, "num_predict": 5,
                        "stop": ["<|endoftext|>", "\n\n"], "num_ctx": 256},
            "keep_alive": 1800, "stream": True}
    status, _, payload = fim_served.request("POST", "/api/generate", body)
    assert status == 200, payload
    lines = [json.loads(line) for line in payload.decode().splitlines() if line]
    assert lines[-1]["done"] is True
    client = ollama.Client(host=f"http://127.0.0.1:{fim_served.port}")
    whole = client.generate(model=NAME, prompt=PREFIX, suffix=SUFFIX, keep_alive=1800, stream=False,
                            options={k: v for k, v in body["options"].items()})
    assert whole.response == "".join(line["response"] for line in lines)


# ------------------------------------------------------------------------------------------------ serve's options


def test_serve_s_batch_size_and_spm_infill_options_shape_the_infill_prompt(qwen_bundle, qwen_runtime, tmp_path):
    """``edgesdk serve -b 16 --spm-infill``: of the prefix its last 12 tokens, of the suffix its first 16/4 - 2 = 2,
    the suffix first (llama-server's format_prompt_infill with n_batch 16 and spm_infill), in /infill's prompt,
    Ollama's suffix and /api/show's template."""
    import http.client
    from urllib.parse import urlparse

    from tests._utils.serve_command import serve_command

    tokenizer = qwen_runtime.tokenizer
    prefix, suffix = tokenizer.encode_plain(PREFIX), tokenizer.encode_plain(SUFFIX)
    assert len(prefix) > 12
    assert len(suffix) > 2
    # the context leaves 256 - 16 - 2 * 2 tokens for the extra context: FIM_REP "myproject\n" FIM_SEP "filename\n"
    extra = [324, *tokenizer.encode_plain("myproject\n"), 325, *tokenizer.encode_plain("filename\n")]
    ids = [*extra, 322, *suffix[:2], 320, *prefix[-12:], 321]
    want = tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
    with serve_command(qwen_bundle.path, tmp_path, "-b", "16", "--spm-infill", "-n", "2", "-a", "tiny-host") as url:
        address = urlparse(url)

        def post(path: str, body: dict) -> dict:
            connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
            connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = json.loads(response.read())
            connection.close()
            assert response.status == 200, answer
            return answer

        infilled = post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX})
        generated = post("/api/generate", {"model": NAME, "prompt": PREFIX, "suffix": SUFFIX, "stream": False})
        shown = post("/api/show", {"model": NAME})
    assert infilled["prompt"] == want
    assert infilled["tokens_evaluated"] == len(ids)
    assert generated["prompt_eval_count"] == len(ids)
    assert shown["template"].startswith("{{- if .Suffix }}<|fim_suffix|>{{ .Suffix }}<|fim_prefix|>{{ .Prompt }}")
