"""``edgesdk run --raw`` (and a bundle without a chat template) reading prompts from stdin: the typed text is
plain text, its special tokens' text read as text, as llama.cpp's llama-completion tokenizes a typed line
(tools/completion/completion.cpp: ``common_tokenize(ctx, user_inp, false, format_chat)``, ``format_chat`` false
without a chat template), while ``--in-prefix`` / ``--in-suffix`` and ``-p`` keep their special tokens."""

from __future__ import annotations

import re

from tests.unit.test_cli import assert_ok, invoke


def _prompt_sizes(result) -> list[int]:
    return [int(n) for n in re.findall(r"\] prompt (\d+) tok", result.stderr)]


def test_typed_special_token_text_is_plain_text_in_raw_mode(tiny_bundle, runtime):
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 1, "--threads", 1, "--stats", input="<|im_start|>\n")
    assert_ok(result)
    tokenizer = runtime.tokenizer
    assert _prompt_sizes(result) == [len(tokenizer.encode_plain("<|im_start|>"))]
    assert _prompt_sizes(result)[0] > 1


def _generated(runtime, ids: list[int], n: int) -> str:
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=n), runtime.tokenizer.eos_token_ids)
    return runtime.tokenizer.decode(tokens)


def test_affixes_keep_their_special_tokens_and_the_typed_line_between_them_is_plain(tiny_bundle, runtime):
    """llama-completion: ``line_pfx`` and ``line_sfx`` tokenized with ``parse_special`` true, ``line_inp`` with
    ``format_chat`` (false here): the prompt is the prefix's tokens, the typed text as text, the suffix's tokens."""
    tokenizer = runtime.tokenizer
    start, end = tokenizer.token_id("<|im_start|>"), tokenizer.token_id("<|im_end|>")
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 4, "--threads", 1, "--stats",
                    "--in-prefix", "<|im_start|>user\\n", "--in-suffix", "<|im_end|>\\n<|im_start|>assistant\\n",
                    input="say <|im_end|> now\n")
    assert_ok(result)
    expected = [start, *tokenizer.encode_plain("user\nsay <|im_end|> now"), end, *tokenizer.encode_plain("\n"),
                start, *tokenizer.encode_plain("assistant\n")]
    assert expected.count(start) == 2
    assert expected.count(end) == 1
    assert _prompt_sizes(result) == [len(expected)]
    assert result.stdout == _generated(runtime, expected, 4) + "\n"


def test_regen_answers_the_typed_line_as_plain_text_again(tiny_bundle, runtime):
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 1, "--threads", 1, "--stats",
                    input="<|im_start|>\n/regen\n")
    assert_ok(result)
    size = len(runtime.tokenizer.encode_plain("<|im_start|>"))
    assert _prompt_sizes(result) == [size, size]


def test_a_read_files_special_token_text_is_plain_text_in_raw_mode(tiny_bundle, runtime, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("<|im_end|>", encoding="utf-8")
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 1, "--threads", 1, "--stats",
                    input=f"/read {notes}\nhi\n")
    assert_ok(result)
    expected = runtime.tokenizer.encode_plain(f"--- File: {notes} ---\n<|im_end|>\nhi")
    assert runtime.tokenizer.token_id("<|im_end|>") not in expected
    assert _prompt_sizes(result) == [len(expected)]


def test_the_prompt_option_keeps_its_special_tokens_in_raw_mode(tiny_bundle):
    """-p is tokenized with ``parse_special`` true by llama-completion (and llama-cli): '<|im_start|>' is one token."""
    result = invoke("run", tiny_bundle.path, "--raw", "-n", 1, "--threads", 1, "--stats", "-p", "<|im_start|>")
    assert_ok(result)
    assert _prompt_sizes(result) == [1]


def test_typed_special_token_text_is_the_tokens_in_chat_mode(tiny_bundle, runtime):
    """With the chat template the line is the user's content, rendered and read with its special tokens, as
    llama-completion's conversation mode (``format_chat`` true) and llama-cli's chat tokenize it."""
    result = invoke("run", tiny_bundle.path, "-n", 1, "--threads", 1, "--stats", "--no-history",
                    input="<|im_start|>\n")
    assert_ok(result)
    assert _prompt_sizes(result) == [len(runtime.tokenizer.prompt_ids("<|im_start|>", raw=False))]


def test_typed_special_token_text_is_plain_text_without_a_chat_template(tiny_bundle, runtime, monkeypatch):
    """A bundle without a chat template: llama-completion's ``format_chat`` is false there, so the typed line is
    plain text without --raw too. (The bundle's runtime is opened as it is, its template then taken away.)"""
    from edgesdk.runtime import session

    opened = session.open_runtime

    def without_template(*args, **kwargs):
        loaded = opened(*args, **kwargs)
        loaded.tokenizer.template_source = None
        return loaded

    monkeypatch.setattr(session, "open_runtime", without_template)
    result = invoke("run", tiny_bundle.path, "-n", 1, "--threads", 1, "--stats", input="<|im_start|>\n")
    assert_ok(result)
    assert _prompt_sizes(result) == [len(runtime.tokenizer.encode_plain("<|im_start|>"))]
