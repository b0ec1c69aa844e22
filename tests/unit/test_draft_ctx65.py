"""A --draft bundle opened at its own whole context while ``-c N`` held the bundle below it (run, serve and
load(n_ctx=..., draft=...)): llama-server makes its draft's context the target's. A tool_result on the Messages
route answering no tool_use of the previous message (the first message, an assistant message with no call, a call
turns before) was taken silently, where Anthropic's API answers 400. ``edgesdk embed``'s refusal of an input past a
``-c`` run's context said --truncate or shorten it, never raising -c, as run's refusal does. Real bundles built by the
pipeline, a real ONNX Runtime session, the real CLI and a real server process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from edgesdk.runtime.backend import close_backend
from edgesdk.serve.anthropic import chat_body, parse_messages_request
from edgesdk.serve.api import ApiError
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

LONG = "The quick brown fox jumps over the lazy dog. " * 3  # 85 tokens of the tiny tokenizer: past 64, within 128


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def short_draft(tiny_model_dir, tmp_path_factory):
    """A draft bundle of the tiny model built with a 64-token context (the tiny bundle's is 256)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("drafts65") / "tiny-64"
    return build(BuildConfig(target="host", model=str(tiny_model_dir), out=out,
                             export=ExportConfig(max_context=64), progress=False))


# --- the draft follows -c ------------------------------------------------------------------------------------------


def test_run_holds_the_draft_to_c(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", "hi", "-n", 4, "-c", 64, "--stats",
                    "--draft", tiny_bundle.path)
    assert_ok(result)
    lines = result.stderr.splitlines()
    assert f"edgesdk: draft {tiny_bundle.path}: context 64 tokens (the bundle's 256)" in lines, result.stderr


def test_run_without_c_leaves_the_draft_its_context(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-t", 1, "--temp", 0, "-p", "hi", "-n", 2, "--stats",
                    "--draft", tiny_bundle.path)
    assert_ok(result)
    assert f"edgesdk: draft {tiny_bundle.path}: context" not in result.stderr, result.stderr


def test_serve_holds_the_draft_to_c_and_says_so(tiny_bundle, tmp_path):
    """The server's own notes were printed (its context among them), the draft's never, and a draft bundle other
    than the served one held its whole 256 (-c held only the bundles served)."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny_bundle.path, draft)
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0", "--threads", "1",
         "-c", "64", "--draft", str(draft)],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    said = []
    try:
        for line in process.stderr:
            said.append(line.rstrip("\n"))
            if " on http://" in line:
                break
    finally:
        process.terminate()
        said += process.communicate(timeout=60)[1].splitlines()
    assert any(" on http://" in line for line in said), "\n".join(said)
    assert f"edgesdk: draft {draft}: context 64 tokens (the bundle's 256)" in said, "\n".join(said)


def test_load_n_ctx_holds_the_draft_too(tiny_bundle):
    import edgesdk

    with edgesdk.load(tiny_bundle.path, n_ctx=64, draft=tiny_bundle.path, threads=1) as model:
        assert model._drafter.backend.max_context == 64
        assert "draft: context 64 tokens (the bundle's 256)" in model.notes, model.notes


def test_a_draft_with_a_shorter_context_keeps_it_and_says_so(tiny_bundle, short_draft):
    """-c 128 over a 64-token draft: not refused (its context is fixed when it was built, and drafting past it goes
    on from the text's latest tokens), said under --stats, and the answer is the bundle's own."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.speculative import DraftConfig, open_draft_model

    target = open_runtime(tiny_bundle.path, threads=1, context=128)
    try:
        model = open_draft_model(target, short_draft.path, DraftConfig(), threads=1)
        try:
            assert model.backend.max_context == 64
            assert "context 64 tokens (the draft bundle's own), less than the 128 the bundle runs with: past 64, " \
                   "drafts are made from the text's latest tokens" in model.notes, model.notes
        finally:
            close_backend(model.backend)
    finally:
        close_backend(target.backend)
    args = ("run", tiny_bundle.path, "-t", 1, "--temp", 0, "--raw", "-p", LONG, "-n", 8, "-c", 128)
    drafted = invoke(*args, "--stats", "--draft", short_draft.path)
    plain = invoke(*args)
    assert_ok(drafted)
    assert_ok(plain)
    assert f"edgesdk: draft {short_draft.path}: context 64 tokens (the draft bundle's own), less than the 128" \
           in drafted.stderr, drafted.stderr
    assert drafted.stdout == plain.stdout


# --- a tool_result must answer a tool_use of the previous message --------------------------------------------------


CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


def _result(ident: str = "toolu_1") -> dict:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ident, "content": "21 C"}]}


def _refused(messages: list) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request({"max_tokens": 8, "messages": messages})
    assert caught.value.status == 400
    assert caught.value.message.count("Each `tool_result` block must have a corresponding `tool_use` block in the "
                                      "previous message") == 1, caught.value.message
    return caught.value


def test_a_tool_result_in_the_first_message_is_refused():
    error = _refused([_result()])
    assert error.param == "messages[0].content[0].tool_use_id"
    assert error.message.startswith('messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: '
                                    '"toolu_1". ')
    assert "no assistant message comes before this one" in error.message


def test_a_tool_result_after_an_assistant_message_without_calls_is_refused():
    error = _refused([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Let me see."},
                      _result()])
    assert error.param == "messages[2].content[0].tool_use_id"
    assert "(it has no tool_use block)" in error.message


def test_a_tool_result_of_an_earlier_turn_s_call_is_refused():
    second = {**CALL, "id": "toolu_2"}
    error = _refused([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [CALL]}, _result(),
                      {"role": "assistant", "content": [second]}, _result("toolu_1")])
    assert error.param == "messages[4].content[0].tool_use_id"
    assert '(its tool_use ids: "toolu_2")' in error.message


def test_results_of_the_previous_message_s_calls_are_taken():
    # a call then text in consecutive assistant turns are one message, as a text then a call are
    for assistant in ([{"role": "assistant", "content": [CALL]}, {"role": "assistant", "content": "Checking."}],
                      [{"role": "assistant", "content": "Checking."}, {"role": "assistant", "content": [CALL]}]):
        body = chat_body({"max_tokens": 8, "messages": [
            {"role": "user", "content": "Weather?"}, *assistant, _result(), {"role": "user", "content": "Thanks."}]})
        assert [message["role"] for message in body["messages"]] == ["user", "assistant", "tool", "user"]
        assert body["messages"][2]["tool_call_id"] == "toolu_1"


# --- embed's refusal past a -c context -----------------------------------------------------------------------------


def test_embed_past_a_c_context_names_raising_c(tiny_bundle):
    result = invoke("embed", tiny_bundle.path, "-t", 1, "-p", LONG, "-c", 16)
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    tokens = re.search(r"your input resulted in (\d+) tokens", said)
    assert tokens, said
    assert (f"fix: pass --truncate to embed its first 16 tokens, or shorten it, or raise -c to {tokens[1]} or more, "
            "up to the bundle's 256 (-c 0: all of it)") in said


def test_embed_past_the_bundle_s_context_gives_run_s_fix(tiny_bundle):
    from edgesdk.bundle import context_fix, model_positions, read_manifest

    result = invoke("embed", tiny_bundle.path, "-t", 1, "-p", LONG * 8)
    assert result.exit_code == 1, result.output
    said = flat(result.stderr)
    tokens = re.search(r"your input resulted in (\d+) tokens", said)
    assert tokens, said
    expected = context_fix("pass --truncate to embed its first 256 tokens, or shorten it", 256,
                           model_positions(read_manifest(tiny_bundle.path)), int(tokens[1]))
    assert f"fix: {flat(expected)}" in said
    assert expected != "pass --truncate to embed its first 256 tokens, or shorten it"
