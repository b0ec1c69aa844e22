"""Refusals of a run held below its bundle's context by ``-c N``: each named "the bundle's" context N, and some
sent the user to rebuild a bundle that held the input already (the server's prompt refusal, the context shift's),
named no ``-c`` at all (the embedding's, Ollama's ``truncate: false``), or destroyed a prompt-cache file that the
bundle's whole context loads (rewritten with the shorter run's cache). Real bundles built by the pipeline and a real
ONNX Runtime session."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import ContextShift
from edgesdk.runtime.session import context_limits, open_runtime

pytest.importorskip("torch")

LONG = "The quick brown fox jumps over the lazy dog. " * 3  # 85 tokens of the tiny tokenizer: past 64, within 256


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def capped(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1, context=64)
    yield runtime
    runtime.backend.close()


def test_the_server_names_raising_c_and_no_rebuild_where_the_bundle_holds_the_prompt(tiny_bundle):
    from edgesdk.serve.api import ApiError, CompletionRequest
    from edgesdk.serve.completion import ServeDefaults
    from edgesdk.serve.model_pool import described

    with context_limits({tiny_bundle.path: 64}):
        completer = described(tiny_bundle, ServeDefaults(), None)
    with pytest.raises(ApiError) as refused:
        completer.prompt_ids(CompletionRequest(chat=False, prompt=LONG))
    said = flat(refused.value.message)
    assert "maximum context length is 64 tokens" in said
    assert re.search(r"raise -c to \d+ or more, up to the bundle's 256 \(-c 0: all of it\)", said), said
    assert "--max-context" not in said  # the bundle holds the prompt: no rebuild
    assert said.count("-c ") == 2, said  # one fix, not two
    with pytest.raises(ApiError) as past:  # past the bundle's context too: the rebuild comes after raising -c
        completer.prompt_ids(CompletionRequest(chat=False, prompt=LONG * 4))
    assert "raising -c up to the bundle's 256 holds fewer than" in flat(past.value.message)


def test_the_context_shift_names_the_c_context_and_raising_c():
    with pytest.raises(EdgeSDKError) as refused:
        ContextShift(keep=-1).spans(50, 47, 256)
    assert "nothing to discard in this run's context, 47 (-c), of the bundle's 256" in refused.value.problem
    assert "raise -c above 50, up to the bundle's 256" in refused.value.fix
    with pytest.raises(EdgeSDKError) as uncapped:  # no cap: as before
        ContextShift(keep=-1).spans(50, 47)
    assert uncapped.value.problem.endswith("nothing to discard in the bundle's max_context of 47")
    assert "-c" not in uncapped.value.fix


def test_a_cache_file_past_the_c_context_is_named_and_kept(tiny_bundle, capped, tmp_path):
    from edgesdk.runtime import cache_file
    from edgesdk.runtime.prompt_cache import PromptCache

    whole = open_runtime(tiny_bundle.path, threads=1)
    path = tmp_path / "cache.npz"
    try:
        ids = [int(t) for t in np.random.default_rng(98).integers(3, 300, 98)]
        cache = PromptCache(whole.backend)
        whole.backend.reset()
        whole.backend.prefill(np.array(ids))
        cache.took(ids)
        cache_file.save(path, cache, tiny_bundle.bundle_id)
    finally:
        whole.backend.close()
    before = path.read_bytes()
    cache = PromptCache(capped.backend)
    loaded, why = cache_file.load(path, cache, tiny_bundle.bundle_id)
    assert loaded == 0
    assert why == ("it holds 98 tokens, more than this run's context, 64 (-c), of the bundle's 256; raise -c to 98 to "
                   "use it")
    shorter = [int(t) for t in np.random.default_rng(12).integers(3, 300, 12)]
    capped.backend.reset()
    capped.backend.prefill(np.array(shorter))
    cache.took(shorter)
    cache_file.save(path, cache, tiny_bundle.bundle_id)  # the run's write leaves the kept file as it is
    assert path.read_bytes() == before


def test_embedding_past_the_c_context_names_raising_c(capped):
    from edgesdk.runtime.embedding import InputTooLong, embed_tokens, fitted

    with pytest.raises(InputTooLong) as refused:
        embed_tokens(capped.backend, list(range(3, 83)))
    assert refused.value.fix == ("shorten the input or split it into passages, or raise -c up to the bundle's 256 "
                                 "(-c 0: all of it)")
    with pytest.raises(InputTooLong) as served:
        fitted(list(range(3, 83)), 64, built=256, restart=True)
    assert "or restart the server with -c up to the bundle's 256" in served.value.fix
    with pytest.raises(InputTooLong) as uncapped:
        fitted(list(range(3, 83)), 64)
    assert uncapped.value.fix == "shorten the input or split it into passages"


def test_ollama_truncate_false_names_the_c_context_and_a_restart(tiny_bundle):
    from edgesdk.serve.api import ApiError, CompletionRequest
    from edgesdk.serve.completion import ServeDefaults
    from edgesdk.serve.model_pool import described
    from edgesdk.serve.ollama import Asked, _refuse_past_the_context

    with context_limits({tiny_bundle.path: 64}):
        completer = described(tiny_bundle, ServeDefaults(), None)
    request = CompletionRequest(chat=False, prompt=LONG)
    with pytest.raises(ApiError) as refused:
        _refuse_past_the_context(completer, Asked("m", request, False, truncate=False), request, 64)
    said = flat(refused.value.message)
    assert "within this run's context, 64 (-c), of the bundle's 256" in said, said
    assert said.endswith("shorten the prompt, or restart the server with -c up to the bundle's 256 (-c 0: all of it)")


def test_run_says_a_cache_file_past_its_c_context_is_left_as_it_is(tiny_bundle, tmp_path):
    """run --prompt-cache with a file the bundle holds but -c does not: the note said "the next answer rewrites it",
    which the kept file contradicts; the file's bytes stay."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    cache = tmp_path / "cache.npz"
    prompt = " ".join(["word"] * 8)
    first = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "-p", prompt, "-n", "4", "--prompt-cache",
                                      str(cache)])
    assert first.exit_code == 0, first.output
    before = cache.read_bytes()
    capped = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "-p", "hi", "-n", "2", "-c", "32",
                                       "--prompt-cache", str(cache)])
    assert capped.exit_code == 0, capped.output
    said = " ".join(capped.stderr.split())
    assert "raise -c to" in said, said
    assert "it is left as it is for this run" in said, said
    assert "rewrites it" not in said, said
    assert cache.read_bytes() == before
