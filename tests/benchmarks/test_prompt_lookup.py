"""Prompt lookup decoding (edgesdk/runtime/lookup.py) against decoding token by token, on a real bundle.

Each task is answered greedily with drafts of 0 (off), 4, 8 and 12 tokens, in alternating order,
three rounds, a pause between runs. The
tasks range from copying the prompt (a text to correct, code to rename in) to free text, where
drafts find little. Reported: decode tok/s (median) and its ratio to the run without drafts in the
same round, drafted and accepted tokens. Bundle: ``$EDGESDK_BENCH_BUNDLE`` or the fixture's build.

    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_prompt_lookup.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.benchmark

TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
        "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally "
        "nicknamed La dame de fer, it was constructed as the centrepiece of the 1889 World's Fair.")
CODE = ("def total(x):\n    s = 0\n    for item in x:\n        if item > 0:\n            s = s + item\n"
        "    return s\n")
TASKS = {
    "copy a text": f"Repeat this text exactly:\n\n{TEXT}",
    "rename in code": f"Rename the parameter x to values in this Python function and show the whole function:\n\n{CODE}",
    "summarize": f"Summarize this text in two sentences:\n\n{TEXT}",
    "free text": "Write a short story about a robot who learns to paint.",
}
DRAFTS = (0, 4, 8, 12)
ROUNDS, NEW_TOKENS, PAUSE_S = 3, 160, 1.0


def test_prompt_lookup_speed(smollm2_rpi5_bundle):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.lookup import LookupConfig
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(smollm2_rpi5_bundle.path, threads=2)
    tokenizer = runtime.tokenizer
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    print(f"\n{'task':<16}{'draft':>6}{'tokens':>8}{'tok/s':>8}{'x off':>7}{'drafted':>9}{'accepted':>10}")
    for name, prompt in TASKS.items():
        ids = tokenizer.prompt_ids(prompt, raw=False)
        speeds: dict[int, list[float]] = {draft: [] for draft in DRAFTS}
        ratios: dict[int, list[float]] = {draft: [] for draft in DRAFTS}
        answers, counts = {}, {}
        for round_index in range(ROUNDS):
            order = DRAFTS[round_index % len(DRAFTS):] + DRAFTS[:round_index % len(DRAFTS)]
            this_round = {}
            for draft in order:
                time.sleep(PAUSE_S)
                lookup = LookupConfig(max_draft=draft) if draft else None
                tokens, stats = generate(runtime.backend, ids, sampling, tokenizer.eos_token_ids, lookup=lookup)
                answers.setdefault(draft, tokens)
                this_round[draft] = len(tokens) / stats.decode_s
                counts[draft] = (len(tokens), stats.draft_tokens, stats.draft_accepted)
            for draft in DRAFTS:
                speeds[draft].append(this_round[draft])
                ratios[draft].append(this_round[draft] / this_round[0])
        for draft in DRAFTS:
            tokens, drafted, accepted = counts[draft]
            same = _first_difference(answers[draft], answers[0])
            print(f"{name:<16}{draft:>6}{tokens:>8}{statistics.median(speeds[draft]):>8.1f}"
                  f"{statistics.median(ratios[draft]):>7.2f}{drafted:>9}{accepted:>10}  {same}")
        print(f"  answer: {tokenizer.decode(answers[0])[:100]!r}")


def _first_difference(answer: list[int], reference: list[int]) -> str:
    for index, (a, b) in enumerate(zip(answer, reference, strict=False)):
        if a != b:
            return f"differs from token {index}"
    return "same answer" if len(answer) == len(reference) else "differs in length"
