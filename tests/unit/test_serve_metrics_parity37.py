"""GET /metrics against llama-server's (server_task_result_metrics::to_metrics, tools/server/server-task.cpp): its
families under the edgesdk_ prefix with their types, what each counts, the throughput gauges' window from one
scrape to the next, and the text read by a strict reader of Prometheus' text format 0.0.4."""

from __future__ import annotations

import json
import re

import pytest

from tests.unit.test_serve_metrics import ask, start

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
LABELS = rf"\{{(?:{NAME}={LABEL_VALUE}(?:,{NAME}={LABEL_VALUE})*,?)?\}}"
VALUE = r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)"
SAMPLE = re.compile(rf"({NAME})({LABELS})? ({VALUE})(?: -?\d+)?")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")

# llama-server's families (n_tokens_max, prompt_tokens_cached_total and the speculative counters aside) and types,
# but for n_busy_slots_per_decode: llama-server lists it among its counters, yet it is an average that can fall
# (a counter's drop reads as a reset to Prometheus' rate()), so it is written as the gauge it is
LLAMA_SERVER = {"prompt_tokens_total": "counter", "prompt_seconds_total": "counter", "tokens_predicted_total": "counter",
                "tokens_predicted_seconds_total": "counter", "n_decode_total": "counter",
                "prompt_tokens_seconds": "gauge", "predicted_tokens_seconds": "gauge", "requests_processing": "gauge",
                "requests_deferred": "gauge", "n_busy_slots_per_decode": "gauge"}


def read_exposition(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """(family -> type, series -> value), refusing what the text format 0.0.4 does not allow: a missing last
    newline, a HELP or TYPE twice or after the family's samples, a family's samples apart, a series twice, a
    sample that is not ``name{labels} value``."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    types: dict[str, str] = {}
    helps: set[str] = set()
    values: dict[str, float] = {}
    seen: list[str] = []  # families in the order their samples came
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert re.fullmatch(NAME, name), line
            assert name not in helps, f"{name}'s HELP twice"
            assert name not in seen, f"{name}'s HELP after its samples"
            assert re.fullmatch(r"(?:[^\\\n]|\\[\\n])*", help_text), line
            helps.add(name)
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert re.fullmatch(NAME, name), line
            assert kind in TYPES, line
            assert name not in types, f"{name}'s TYPE twice"
            assert name not in seen, f"{name}'s TYPE after its samples"
            types[name] = kind
        else:
            match = SAMPLE.fullmatch(line)
            assert match, f"not a sample: {line!r}"
            name, series = match.group(1), match.group(1) + (match.group(2) or "")
            assert series not in values, f"{series} twice"
            if not seen or seen[-1] != name:
                assert name not in seen, f"{name}'s samples are apart"
                seen.append(name)
            values[series] = float(match.group(3).replace("Inf", "inf"))
            if types.get(name) == "counter":
                assert values[series] >= 0, line
    return types, values


def test_llama_server_s_families_count_what_llama_server_s_do(runtime):
    server = start(runtime, metrics=True)
    try:
        answers = [json.loads(ask(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": count})[2])
                   for prompt, count in (("The quick brown fox", 5), ("Edge boards run", 3))]
        status, kind, first = ask(server, "GET", "/metrics")
        _, _, second = ask(server, "GET", "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    assert kind.startswith("text/plain; version=0.0.4")
    types, values = read_exposition(first)
    for name, kind in LLAMA_SERVER.items():
        assert types.get(f"edgesdk_{name}") == kind, name
    # A backend pass per token picked, and one more for the end-of-text token an answer that stopped picked.
    passes = sum(a["usage"]["completion_tokens"] + (a["choices"][0]["finish_reason"] == "stop") for a in answers)
    assert values["edgesdk_n_decode_total"] == passes
    assert values["edgesdk_tokens_predicted_total"] == passes
    assert values["edgesdk_n_busy_slots_per_decode"] == 1
    # The first scrape's window is the server's life so far; the next one's holds nothing.
    assert values["edgesdk_prompt_tokens_seconds"] == pytest.approx(
        values["edgesdk_prompt_tokens_total"] / values["edgesdk_prompt_seconds_total"])
    assert values["edgesdk_predicted_tokens_seconds"] == pytest.approx(
        values["edgesdk_tokens_predicted_total"] / values["edgesdk_tokens_predicted_seconds_total"])
    _, again = read_exposition(second)
    assert again["edgesdk_prompt_tokens_seconds"] == again["edgesdk_predicted_tokens_seconds"] == 0
    assert again["edgesdk_prompt_tokens_total"] == values["edgesdk_prompt_tokens_total"]


def test_a_server_that_answered_nothing_reports_zeros_not_a_division_by_zero(runtime):
    server = start(runtime, metrics=True)
    try:
        _, values = read_exposition(ask(server, "GET", "/metrics")[2])
    finally:
        server.shutdown()
        server.server_close()
    assert values["edgesdk_prompt_tokens_seconds"] == values["edgesdk_predicted_tokens_seconds"] == 0
    assert values["edgesdk_n_busy_slots_per_decode"] == values["edgesdk_n_decode_total"] == 0
