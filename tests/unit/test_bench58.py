"""``edgesdk bench`` reads llama-bench's option spellings, review 58: llama-bench's ``parse_cmd_params`` reads '_' in a
long option's name as '-' and names its prompt and generation lengths ``--n-prompt`` / ``--n-gen``; bench answered
"No such option" to ``--no_warmup``, ``--output_err`` and ``--n-prompt``."""

from __future__ import annotations

import json

from tests.unit.test_cli import assert_ok, invoke


def _records(result) -> list[dict]:
    assert_ok(result)
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_llama_bench_spellings_run_the_same_tests(tiny_bundle):
    spelt = invoke("bench", tiny_bundle.path, "--n_prompt", 4, "--n-gen", 2, "-r", 1, "-t", 1, "--no_warmup",
                   "-o", "jsonl")
    records = _records(spelt)
    assert [(record["n_prompt"], record["n_gen"]) for record in records] == [(4, 0), (0, 2)]
    plain = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "-t", 1, "--no-warmup", "-o", "jsonl")
    assert [(record["n_prompt"], record["n_gen"]) for record in _records(plain)] == [(4, 0), (0, 2)]


def test_an_underscore_option_with_a_choice_is_read_as_its_dashed_name(tiny_bundle):
    result = invoke("bench", tiny_bundle.path, "-p", 0, "-n", 1, "-r", 1, "-t", 1, "--output_err", "jsonl",
                    "-o", "none")
    assert_ok(result)
    assert '"n_gen": 1' in result.stderr
