"""``edgesdk run ... --prompt-cache FILE | head`` where the reader goes away at the answer's last write (an answer
that wrote nothing before its end: its first token the end of text): the file is still written, as for a reader
gone mid-answer (cli_prompt_cache.PromptCacheFile.watch); it was skipped."""

from __future__ import annotations

import pytest

from tests.unit.test_cli_small52 import _to_closed_pipe


@pytest.fixture(scope="module")
def end_token(tiny_bundle) -> int:
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1).tokenizer.token_id("<|im_end|>")


@pytest.mark.parametrize("cache_all", [False, True])
def test_a_reader_gone_at_the_answers_last_write_still_gets_the_prompt_cache_written(tiny_bundle, tmp_path,
                                                                                   end_token, cache_all):
    cache = tmp_path / "prompt.cache"
    done = _to_closed_pipe("run", str(tiny_bundle.path), "--prompt", "Hello there my friend", "-n", "4",
                           "--logit-bias", f"{end_token}=100", "--prompt-cache", str(cache),
                           *(["--prompt-cache-all"] if cache_all else []))
    assert done.returncode == 128 + 13, done.stderr
    assert done.stderr == ""
    assert cache.is_file()
