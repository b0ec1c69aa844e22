"""Telemetry JSONL: every line strict JSON."""

from __future__ import annotations

import json

import pytest

from edgesdk.thermal.telemetry import Telemetry, load


def strict(line: str) -> dict:
    """json.loads refusing NaN and Infinity, as jq and RFC 8259 parsers do."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_a_number_that_is_not_finite_is_written_as_null(tmp_path):
    """json.dumps wrote NaN and Infinity bare: such a line is not JSON, and jq (or any strict reader) stopped
    at it. It is null now; the finite numbers and the other fields stay as they were."""
    path = tmp_path / "run.jsonl"
    telemetry = Telemetry(path, {"ambient_c": float("inf")})
    telemetry.step(t=1.0, kind="decode", tokens=1, temp_c=float("nan"), zones={"cpu": float("-inf"), "gpu": 51.5},
                   power_w={"rails": [1.5, float("nan")]})
    telemetry.close()
    meta, step = (strict(line) for line in path.read_text().splitlines())
    assert meta["ambient_c"] is None
    assert step == {"type": "step", "t": 1.0, "kind": "decode", "tokens": 1, "temp_c": None,
                    "zones": {"cpu": None, "gpu": 51.5}, "power_w": {"rails": [1.5, None]}}
    assert load(path)[1] == [step]


@pytest.mark.parametrize("value", [1e308, -0.0, 0.5])
def test_finite_numbers_are_written_unchanged(tmp_path, value):
    path = tmp_path / "run.jsonl"
    telemetry = Telemetry(path)
    telemetry.step(t=value)
    telemetry.close()
    assert strict(path.read_text().splitlines()[1])["t"] == value
