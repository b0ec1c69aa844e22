"""``edgesdk run --context-shift [--keep N]`` (llama-cli's options) and ``edgesdk serve --context-shift --keep N``
(llama-server's) on a tiny lively bundle with a 32-token context: with the shift an answer runs past the context,
without it (the default, as in current llama.cpp) it stops there."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from edgesdk.cli import main  # noqa: E402

MAX_CONTEXT = 32
PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    from tests._utils.builds import build_lively_bundle

    return build_lively_bundle(tmp_path_factory.mktemp("cli-shift41"), seed=5, max_context=MAX_CONTEXT).path


def _run(bundle_path, *options) -> tuple[str, int, str, int]:
    """The answer's text, its new tokens, stop reason and context shifts (from --stats)."""
    result = CliRunner().invoke(main, ["run", str(bundle_path), "--prompt", PROMPT, "--raw", "--ignore-eos",
                                       "--threads", "1", "--stats", *options], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    found = re.search(r"(\d+) new tok, .* stop: (\w+)", result.stderr)
    shifts = re.search(r", context shifted (\d+)x", result.stderr)
    return result.stdout, int(found[1]), found[2], int(shifts[1]) if shifts else 0


def test_run_with_context_shift_answers_past_the_context_and_without_it_stops(bundle_path):
    stopped, stopped_tokens, stopped_reason, none = _run(bundle_path, "-n", str(3 * MAX_CONTEXT))
    assert (stopped_reason, none) == ("max_context", 0)
    assert stopped_tokens < MAX_CONTEXT
    shifted, tokens, reason, shifts = _run(bundle_path, "-n", str(3 * MAX_CONTEXT), "--context-shift", "--keep", "4")
    assert (tokens, reason) == (3 * MAX_CONTEXT, "max_new_tokens")
    assert shifts >= 2  # three contexts of answer: --stats counts the shifts
    assert shifted.startswith(stopped.rstrip("\n"))  # the same answer up to the first shift
    assert len(shifted) > len(stopped)


def test_run_keep_that_leaves_nothing_to_discard_is_refused_naming_it(bundle_path):
    from edgesdk.runtime.session import open_runtime

    tokenizer = open_runtime(bundle_path, threads=1).tokenizer
    long_text = " ".join([PROMPT] * 8)
    full = next(text for end in range(len(long_text)) if
                len(tokenizer.prompt_ids(text := long_text[:end], raw=True)) == MAX_CONTEXT)
    result = CliRunner().invoke(main, ["run", str(bundle_path), "--prompt", full, "--raw", "--threads", "1",
                                       "-n", "8", "--context-shift", "--keep", "-1"], prog_name="edgesdk")
    assert result.exit_code != 0
    assert f"keep -1 (the whole prompt of {MAX_CONTEXT} tokens)" in result.output
    assert "leaves nothing to discard" in result.output


def test_serve_context_shift_and_keep_are_the_servers_defaults(bundle_path, tmp_path):
    from tests._utils.serve_command import serve_command

    body = json.dumps({"prompt": PROMPT, "n_predict": 3 * MAX_CONTEXT, "ignore_eos": True}).encode()
    answers = {}
    for name, options in (("off", ()), ("on", ("--context-shift", "--keep", "4"))):
        with serve_command(bundle_path, tmp_path, *options) as url:
            request = urllib.request.Request(f"{url}/completion", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                answers[name] = json.loads(response.read())
    assert answers["on"]["tokens_predicted"] == 3 * MAX_CONTEXT
    assert answers["on"]["truncated"] is True
    assert answers["off"]["tokens_predicted"] == MAX_CONTEXT - answers["off"]["tokens_evaluated"] + 1
    assert answers["off"]["truncated"] is True  # stopped by the full context, as llama-server marks it
