"""A thermal pause inside `edgesdk serve` ends where the answer would end at its next token: when its client leaves
or the server stops. On a real board a pause has no time limit (the board cools when it cools), so before this the
paused request held the board's one turn for a client that had gone, and a stopping server waited out its 30 s.

The board is the scripted heater of test_thermal_pause_sampled37 that never cools, on a simulated clock; its sleep
refuses to go on past a day, so a wait nothing abandons fails the test instead of hanging it."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook
from tests.unit.test_thermal_pause_sampled37 import PROFILE, Heater

DAY_S = 86_400.0
REQUEST = parse_chat_request({"messages": [{"role": "user", "content": "A fanless board in a warm cabinet"}]})


class NeverCools(Heater):
    """Past the hard limit from the start and never cooling; ``on_wait`` is told of every chunk waited."""

    def __init__(self, root, on_wait):
        super().__init__(root, heat_after=0)
        self.on_wait, self.chunks = on_wait, 0

    def sleep(self, seconds: float) -> None:
        if self.t > DAY_S:
            raise RuntimeError("the paused answer was never abandoned")
        self.t += seconds
        self.chunks += 1
        self.on_wait(self.chunks)


def paused_completer(runtime, root, on_wait) -> tuple[Completer, NeverCools, Telemetry]:
    board = NeverCools(root, on_wait)
    limits, _ = Limits.resolve(PROFILE.thermal, board.sysfs.trips())
    telemetry = Telemetry()
    hook = ThermalHook(board, board.read, Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0)),
                       board, telemetry)
    return Completer(runtime, ServeDefaults(max_tokens=4), hook=hook), board, telemetry


def test_a_client_that_leaves_during_a_pause_frees_the_board(runtime, tmp_path):
    gone = {"now": False}
    completer, board, telemetry = paused_completer(runtime, tmp_path, lambda chunks: gone.update(now=chunks >= 5))
    with pytest.raises(ClientGone, match="while the thermal guard held the answer"):
        completer.complete(REQUEST, client_gone=lambda: gone["now"])
    assert board.chunks == 5  # ended at the chunk the client left in
    assert completer.metrics.finished["cancelled"] == 1
    assert not completer.busy
    assert completer.hook.abandon_wait is None  # the next request's pause is its own
    waits = [record for record in telemetry.records if record["kind"] == "wait"]
    assert sum(record["wait_s"] for record in waits) == pytest.approx(5 * GuardConfig().poll_s)


def test_a_server_stopping_during_a_pause_ends_the_paused_answer(runtime, tmp_path):
    completer = None

    def stop_after_three(chunks: int) -> None:
        if chunks == 3:
            completer.stop()

    completer, board, _ = paused_completer(runtime, tmp_path, stop_after_three)
    with pytest.raises(ApiError) as caught:
        completer.complete(REQUEST)
    assert caught.value.code == "server_stopping"
    assert board.chunks == 3
    assert completer.metrics.finished["cancelled"] == 1


def test_a_prefill_only_request_whose_client_leaves_during_a_pause_frees_the_board(runtime, tmp_path):
    """llama-server's n_predict 0 (the prompt evaluated into the cache, nothing generated) is paused like any
    prefill: its pause must end with its client too. It set no abandon check and waited for the board to cool."""
    from edgesdk.serve.llama_native import parse_completion_request

    gone = {"now": False}
    completer, board, _ = paused_completer(runtime, tmp_path, lambda chunks: gone.update(now=chunks >= 4))
    request = parse_completion_request({"prompt": "A fanless board in a warm cabinet", "n_predict": 0})
    with pytest.raises(ClientGone, match="while the thermal guard held the answer"):
        completer.complete(request, client_gone=lambda: gone["now"])
    assert board.chunks == 4
    assert not completer.busy
    assert completer.hook.abandon_wait is None
