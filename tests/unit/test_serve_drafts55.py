"""A served answer's ``draft_n_accepted`` is generate's ``draft_accepted`` (every accepted draft token, as
llama-server's ``n_draft_accepted += ids.size() - 1`` counts them), also where a stop string ends the answer at a
drafted token: the server counted a pass's picked tokens less one, which missed the accepted draft token an answer
ended at."""

from __future__ import annotations

import pytest

from edgesdk.runtime.generate import GenerationStats, SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_invariance39 import Server, _timings, bundles  # noqa: F401 (bundles: a fixture)

PROMPT = "Grouped-query attention shares key and value heads"


class _Stopped(Exception):
    pass


def _accepted_when_stopped_at(reference, draft_backend, ids, stop_at: int) -> int:
    """generate's accepted draft tokens for the answer ended (as a stop string ends it) at its ``stop_at``-th token."""
    draft_backend.reset()
    draft = DraftModel(draft_backend, DraftConfig(max_draft=3), reference.backend.vocab_size)
    seen, stats = [], GenerationStats()

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) == stop_at:
            raise _Stopped

    reference.backend.reset()
    with pytest.raises(_Stopped):
        generate(reference.backend, ids, SamplingConfig(max_new_tokens=40), reference.tokenizer.eos_token_ids,
                 on_token=on_token, lookup=draft, stats=stats)
    return stats.draft_accepted


def test_an_answer_a_stop_string_ends_at_a_drafted_token_counts_that_draft(bundles):  # noqa: F811
    reference = open_runtime(bundles["target"], threads=1)
    ids = reference.tokenizer.prompt_ids(PROMPT, raw=True)
    tokens, _ = generate(reference.backend, ids, SamplingConfig(max_new_tokens=40), reference.tokenizer.eos_token_ids)
    text = reference.tokenizer.decode(tokens)
    server = Server(bundles, ServeDefaults(max_tokens=40), draft="target")  # the same weights draft: all accepted
    draft_backend = open_runtime(bundles["target"], threads=1).backend  # one for every answer, reset before each
    try:
        checked = 0
        for stop_at in range(12, 36):  # stop strings whose first match ends exactly at the answer's stop_at-th token
            end = len(reference.tokenizer.decode(tokens[:stop_at]))
            stop = text[max(end - 3, 0):end]
            if len(stop) < 3 or "\ufffd" in stop or text.find(stop) != end - 3 or \
                    len(reference.tokenizer.decode(tokens[:stop_at - 1])) >= end:
                continue
            cut = _timings(server, "/completion", {"prompt": PROMPT, "n_predict": 40, "stop": [stop]})
            assert cut["predicted_n"] == stop_at, (stop, cut)
            assert cut["draft_n_accepted"] == _accepted_when_stopped_at(reference, draft_backend, ids, stop_at)
            checked += 1
    finally:
        server.close()
        draft_backend.close()
    assert checked >= 3
