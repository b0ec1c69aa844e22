"""llama.cpp's ``--draft-min`` / ``--draft-n-min`` (common/arg.cpp; llama-server ignores a draft shorter than n_min and
does not draft where no more than that fits: "ignoring small draft", "the max possible draft is too small"). The
option did not exist: ``run``/``serve ... --draft-min 4`` was refused as an unknown option."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.speculative import DraftConfig, DraftModel

PROMPT = [5, 17, 120, 33, 250, 9, 64, 199]


class _Counted:
    """A draft model's drafter that records the length of every draft it hands generate."""

    def __init__(self, model: DraftModel):
        self.model, self.lengths = model, []

    def drafter(self, prompt_ids):
        inner, lengths = self.model.drafter(prompt_ids), self.lengths

        class Drafter:
            def push(self, token):
                inner.push(token)

            def draft(self, limit=None):
                drafted = inner.draft(limit)
                lengths.append(len(drafted))
                return drafted

        return Drafter()


@pytest.fixture(scope="module")
def lively(tmp_path_factory):
    """A bundle whose model is unsure of many tokens (tests/_utils/builds.py), so that p_min cuts drafts short."""
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_lively_bundle

    bundle = build_lively_bundle(tmp_path_factory.mktemp("lively50"), 11, max_context=128)
    return open_runtime(bundle.path, threads=1), open_runtime(bundle.path, threads=1)


def test_a_draft_shorter_than_min_draft_is_not_checked_and_the_answer_is_the_bundle_s(lively):
    target, draft = lively
    sampling = SamplingConfig(max_new_tokens=30)
    plain, _ = generate(target.backend, PROMPT, sampling, stop_ids=set())
    lengths = {}
    for min_draft in (0, 2):
        counted = _Counted(DraftModel(draft.backend, DraftConfig(max_draft=4, p_min=0.2, min_draft=min_draft),
                                      target.backend.vocab_size))
        drafted, stats = generate(target.backend, PROMPT, sampling, stop_ids=set(), lookup=counted)
        assert drafted == plain
        assert stats.draft_tokens == sum(counted.lengths)
        lengths[min_draft] = counted.lengths
    assert 1 in lengths[0], lengths  # p_min cut some drafts to one token ...
    assert 1 not in lengths[2], lengths  # ... which min_draft 2 does not check
    assert 4 in lengths[2], lengths


def test_no_draft_is_made_where_fewer_than_min_draft_tokens_fit(same_model, target):
    model = DraftModel(same_model.backend, DraftConfig(max_draft=4, min_draft=3), target.backend.vocab_size)
    drafter = model.drafter(PROMPT)
    same_model.backend.reset()
    model.cached = []
    assert drafter.draft(limit=2) == []
    assert same_model.backend.position == 0  # the draft model did not run
    assert len(drafter.draft(limit=3)) == 3


@pytest.mark.parametrize(("min_draft", "fragment"),
                         [(5, "got 5"), (-1, "got -1"), (1.5, "got 1.5"), (True, "got True")])
def test_a_min_draft_past_max_draft_or_not_a_count_is_refused_by_name(min_draft, fragment):
    with pytest.raises(ValueError, match=f"min_draft must be a whole number from 0 to max_draft \\(4\\), {fragment}"):
        DraftConfig(max_draft=4, min_draft=min_draft)
    assert DraftConfig(max_draft=4, min_draft=np.int64(4)).min_draft == 4


def test_run_takes_draft_min_and_answers_as_without_a_draft(tiny_bundle):
    from tests.unit.test_cli import assert_ok, invoke

    args = ("run", tiny_bundle.path, "--prompt", "The quick brown fox", "--raw", "-n", 16, "--ignore-eos", "--threads",
            1, "--stats")
    plain = invoke(*args)
    drafted = invoke(*args, "--draft", tiny_bundle.path, "--draft-max", 3, "--draft-n-min", 2)
    assert_ok(plain)
    assert_ok(drafted)
    assert drafted.stdout == plain.stdout
    assert re.search(r"drafts \d+/\d+ taken", drafted.stderr), drafted.stderr


def test_run_refuses_a_draft_min_above_draft_max_and_names_it_unused_without_a_draft(tiny_bundle):
    from tests.unit.test_cli import flat, invoke

    refused = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--draft", tiny_bundle.path, "--draft-max", 2,
                     "--draft-min", 5)
    assert refused.exit_code == 2
    assert "5 is more than --draft-max (2), so no draft could be checked; pass --draft-max 5 or more" in \
        flat(refused.stderr)
    unused = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--raw", "--draft-min", 2)
    assert unused.exit_code == 0, unused.output
    assert "--draft-min is not used: it works with --draft BUNDLE" in unused.stderr
