"""Speculative decoding with a draft bundle (edgesdk/runtime/speculative.py), on real ONNX Runtime sessions.

The target is the tiny bundle; the drafts come from the same bundle opened again (it agrees with the target
wherever it is sure) or from a bundle of another random model with the same tokenizer (it rarely agrees).
Either way the answer must be the target's own, greedy or sampled: drafts only change how many passes it takes.
"""

from __future__ import annotations

import json
import re

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.speculative import DraftConfig, DraftModel

PROMPT = [5, 17, 120, 33, 250, 9, 64, 199]


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("other")
    model_dir = save_tiny_model_dir(root / "model", seed=7, hidden=64, heads=4, kv_heads=2)
    bundle = build_tiny_bundle(root, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    return open_runtime(bundle.path, threads=1)


@pytest.mark.parametrize("sampling", [SamplingConfig(max_new_tokens=40),
                                      SamplingConfig(max_new_tokens=40, temperature=0.9, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafts_from", ["same_model", "other_model"])
def test_the_answer_is_the_target_s_own_whatever_drafts(target, drafts_from, sampling, request):
    draft = request.getfixturevalue(drafts_from)
    plain, _ = generate(target.backend, PROMPT, sampling, stop_ids=set())
    model = DraftModel(draft.backend, DraftConfig(max_draft=6, p_min=0.0))
    drafted, stats = generate(target.backend, PROMPT, sampling, stop_ids=set(), lookup=model)
    assert drafted == plain
    assert stats.draft_tokens > 0
    if drafts_from == "same_model" and sampling.temperature == 0:
        # the same weights agree on every greedy token: each pass takes its whole draft
        assert stats.draft_accepted == stats.draft_tokens
        assert stats.draft_accepted >= 30


def test_the_draft_cache_is_reused_across_answers_and_resynced(target, same_model):
    """A second answer after the first one's text prefills only its new tokens in the draft model; a prompt
    that shares less is rewound to what it shares."""
    model = DraftModel(same_model.backend, DraftConfig(max_draft=4, p_min=0.0))
    first, _ = generate(target.backend, PROMPT, SamplingConfig(max_new_tokens=8), stop_ids=set(), lookup=model)
    held = list(model.cached)
    assert held[:len(PROMPT)] == PROMPT
    following = PROMPT + first + [7, 8]
    second, _ = generate(target.backend, following, SamplingConfig(max_new_tokens=8), stop_ids=set(), lookup=model)
    assert second == generate(target.backend, following, SamplingConfig(max_new_tokens=8), stop_ids=set())[0]
    other, _ = generate(target.backend, [3, 4, 5], SamplingConfig(max_new_tokens=8), stop_ids=set(), lookup=model)
    assert model.cached[:3] == [3, 4, 5]
    assert other == generate(target.backend, [3, 4, 5], SamplingConfig(max_new_tokens=8), stop_ids=set())[0]


def test_an_unsure_draft_stops_early_and_a_certain_one_runs_to_its_limit(target, other_model):
    sure = DraftModel(other_model.backend, DraftConfig(max_draft=5, p_min=0.0)).drafter(PROMPT).draft()
    assert len(sure) == 5
    never = DraftModel(other_model.backend, DraftConfig(max_draft=5, p_min=0.999999)).drafter(PROMPT).draft()
    assert never == []  # a random model is never that sure
    assert DraftModel(other_model.backend).drafter(PROMPT).draft(limit=0) == []


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("max_draft", 0, "max_draft must be a whole number from 1 to 64"),
    ("max_draft", 65, "max_draft must be a whole number from 1 to 64"),
    ("p_min", 1.0, "p_min must be in [0, 1)"),
    ("p_min", float("nan"), "p_min must be in [0, 1)"),
])
def test_bad_settings_are_refused(field, value, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", "\\[").replace("(", "\\(").replace(")", "\\)")):
        DraftConfig(**{field: value})


def test_run_with_a_draft_bundle_answers_as_without_and_says_how_many_drafts_it_took(tiny_bundle):
    from tests.unit.test_cli import assert_ok, invoke

    args = ("run", tiny_bundle.path, "--prompt", "The quick brown fox", "--raw", "-n", 24, "--ignore-eos", "--threads",
            1, "--stats")
    plain = invoke(*args)
    drafted = invoke(*args, "--draft", tiny_bundle.path, "--draft-max", 3, "--draft-p-min", 0)
    assert_ok(plain)
    assert_ok(drafted)
    assert drafted.stdout == plain.stdout
    taken = re.search(r"drafts (\d+)/(\d+) taken", drafted.stderr)
    assert taken, drafted.stderr
    assert 0 < int(taken.group(1)) <= int(taken.group(2))


def test_a_draft_bundle_with_another_tokenizer_and_draft_with_lookup_are_refused(tiny_bundle, tmp_path):
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_cli import invoke

    # another vocabulary (Gemma's pieces): llama.cpp refuses it too, where a 300-token draft whose texts are the
    # first 300 of the bundle's is one it takes (common_speculative_are_compatible)
    model_dir = save_tiny_model_dir(tmp_path / "model", tokenizer="gemma", vocab_size=384, hidden=64, heads=4,
                                    kv_heads=2)
    other = build_tiny_bundle(tmp_path, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                              model_dir=model_dir)
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--draft", other.path)
    assert result.exit_code != 0
    assert "has another tokenizer than the bundle (384 tokens against 320" in " ".join(result.stderr.split())
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--draft", tiny_bundle.path, "--lookup", 4)
    assert result.exit_code != 0
    assert "--draft and --lookup both draft tokens; pass one" in result.stderr


def test_serve_with_a_draft_bundle_answers_as_without(tiny_bundle):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    runtime = open_runtime(tiny_bundle.path, threads=1)
    draft = DraftModel(open_runtime(tiny_bundle.path, threads=1).backend, DraftConfig(max_draft=3, p_min=0.0))
    body = {"prompt": "The quick brown fox", "max_tokens": 20}
    plain = Served(runtime, ServeDefaults(max_tokens=20))
    try:
        expected = plain.post("/v1/completions", body)[1]["choices"][0]["text"]
    finally:
        plain.close()
    from edgesdk.serve.completion import Completer

    assert Completer(runtime, ServeDefaults(), draft=draft).lookup is draft  # what serve --draft builds
    served = Served(runtime, ServeDefaults(max_tokens=20))
    served.server.completer.lookup = draft
    try:
        status, answer = served.post("/v1/completions", body)
        assert status == 200, answer
        assert answer["choices"][0]["text"] == expected
        assert draft.drafted > 0
        assert served.request("GET", "/props")[0] == 200
        props = json.loads(served.request("GET", "/props")[2])
        assert props["default_generation_settings"]["params"]["speculative.n_max"] == 3
    finally:
        served.close()
