"""Thermal hook and telemetry: what ``--telemetry`` says of a path it cannot open, and the first-token time of a
run whose passes yield no token."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook, _open_telemetry
from tests._utils.clock import ManualClock

RPI5 = get_profile("rpi5")


def test_a_telemetry_path_that_is_a_directory_is_named_as_one(tmp_path):
    """``--telemetry logs`` where logs is a directory said "cannot create the file (Is a directory)" and told the
    user to pass a path whose parent is a writable directory, which logs's parent already is."""
    with pytest.raises(EdgeSDKError) as caught:
        _open_telemetry(str(tmp_path), {})
    assert "is a directory" in caught.value.problem
    assert str(tmp_path / "run.jsonl") in caught.value.fix


def test_a_telemetry_path_under_a_file_names_that_file(tmp_path):
    """``--telemetry run.jsonl/new.jsonl``: mkdir's strerror, "File exists", was the only reason given."""
    blocking = tmp_path / "run.jsonl"
    blocking.write_text("", encoding="utf-8")
    with pytest.raises(EdgeSDKError) as caught:
        _open_telemetry(str(blocking / "deeper" / "new.jsonl"), {})
    assert f"{blocking} is a file, not a directory" in caught.value.problem
    assert "File exists" not in caught.value.problem


def embedding_pass(hook: ThermalHook, tokens: int, seconds: float) -> None:
    """What :func:`edgesdk.runtime.hooked_pass.hooked_pass` tells the hook of a pass that yields no token, with its
    compute time given (the pass itself would be timed on this machine's clock)."""
    hook.begin(tokens, 0)
    hook.before_step("prefill")
    hook.after_step("prefill", 0, seconds)


def hook_on_a_cool_board() -> tuple[ThermalHook, Telemetry, ManualClock]:
    clock = ManualClock()
    limits, _ = Limits.resolve(RPI5.thermal)
    telemetry = Telemetry()
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": 50.0}),
                       Guard(limits, RPI5.thermal_model), telemetry=telemetry)
    return hook, telemetry, clock


def test_a_pass_that_yields_no_token_has_no_time_to_first_token():
    """An embedding pass (a perplexity window, a completion of max_tokens 0) is a prefill record of no token; the
    summary took its 5 s as a first-token time, and the mean over it and a 1 s answer's was 3 s."""
    hook, telemetry, _ = hook_on_a_cool_board()
    embedding_pass(hook, 40, 5.0)  # 5 s, no token
    hook.begin(20, 4)  # an answer: a 1 s prefill that yields its first token
    hook.before_step("prefill")
    hook.after_step("prefill", 1, 1.0)
    summary = summarize(telemetry.records)
    assert summary.requests == 2
    assert summary.mean_ttft_s == pytest.approx(1.0)


def test_a_run_of_embedding_passes_only_has_no_time_to_first_token():
    hook, telemetry, _ = hook_on_a_cool_board()
    for _ in range(3):
        embedding_pass(hook, 40, 2.0)
    summary = summarize(telemetry.records)
    assert summary.requests == 3
    assert summary.mean_ttft_s is None
