"""``edgesdk serve --simulate-thermal`` on a board that cannot cool below the guard's resume point: what the client
gets, what ``/metrics``, ``/health`` and the telemetry file count (real sockets, a real ONNX Runtime session, the
simulated Raspberry Pi 5, whose clock the guard's pause advances without sleeping)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from edgesdk.profile import get_profile
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.thermal.watch import open_session
from tests._utils.metrics_server import MetricsServer

# A Pi 5 at 55 °C ambient idles at 81.6 °C, past its 78 °C hard limit: the guard pauses at once and the board never
# cools below the 70 °C resume point; the hook gives up after 5 of the profile's time constants (1187.5 s).
HOT_AMBIENT_C = 55.0
SETTLE_S = 1187.5


class HotServer(MetricsServer):
    """A server whose guard watches a simulated board at ``ambient_c``, with /metrics and a telemetry file."""

    def __init__(self, runtime, telemetry, ambient_c: float = HOT_AMBIENT_C, clock_cap: bool = False):
        thermal = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False,
                               ambient_c=ambient_c, telemetry_path=str(telemetry), clock_cap=clock_cap)
        super().__init__(Completer(runtime, ServeDefaults(max_tokens=4), hook=thermal.hook), thermal)


@pytest.fixture
def hot(runtime, tmp_path):
    server = HotServer(runtime, tmp_path / "serve.jsonl")
    yield server
    server.close()


def waits_recorded(path) -> float:
    """Seconds of the guard's waits in a telemetry file's "wait" records."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return sum(record["wait_s"] for record in records if record.get("kind") == "wait")


def test_a_board_that_never_cools_answers_503_naming_its_temperature_limit_and_fix(hot):
    """The guard giving up is no fault of the server (a 500): it is a 503 a client may retry, with a code to tell it
    from a busy server, naming the board's temperature, the resume point it never reached and the fix."""
    status, text = hot.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4})
    assert status == 503, text
    error = json.loads(text)["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "board_too_hot"
    assert "never cooled below the guard's resume point 70 °C" in error["message"]
    assert "still at 81.6 °C" in error["message"]
    assert "lower --ambient" in error["message"]
    # Anthropic's shape for a 503: overloaded_error, which its client retries
    status, text = hot.request("POST", "/v1/messages", {"max_tokens": 4, "messages": [{"role": "user",
                                                                                        "content": "hi"}]})
    assert status == 503, text
    assert json.loads(text)["error"]["type"] == "overloaded_error"


def test_the_clients_see_a_503_not_an_internal_error(hot):
    """What the OpenAI and Anthropic SDKs raise: the status error for 503 (not InternalServerError's 500), with the
    body's code; a stream that had its headers ends with the same error as its last event."""
    client = openai.OpenAI(base_url=f"{hot.url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="tiny", prompt="hello", max_tokens=4)
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "board_too_hot"
    claude = anthropic.Anthropic(base_url=hot.url, api_key="none", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as caught:
        claude.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True)
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert "never cooled" in caught.value.message


def test_a_pause_that_ends_in_the_guard_giving_up_is_counted(hot, tmp_path):
    """``edgesdk_thermal_wait_seconds_total`` stayed 0.0 after a pause of 1187.5 simulated seconds, because the
    step that would have carried the wait never ran; the telemetry file lost the pause's last chunk the same way.
    Both count every second the guard held the answers back, as ``requests_finished_total`` counts them."""
    for _ in range(2):  # the second request finds the board still paused, and is refused after one more poll
        status, _ = hot.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4})
        assert status == 503
    values = hot.metrics()
    assert values["edgesdk_thermal_wait_seconds_total"] == SETTLE_S + hot.thermal.hook.guard.config.poll_s
    assert values['edgesdk_requests_finished_total{finish_reason="error"}'] == 2
    assert values["edgesdk_n_decode_total"] == 0  # no prefill ran
    assert values["edgesdk_thermal_paused"] == 1
    # GET /health: the server is up (no restart cools a board), the guard paused at its temperature
    status, text = hot.request("GET", "/health")
    health = json.loads(text)
    assert status == 200
    assert health["status"] == "ok"
    assert not health["busy"]
    assert health["thermal"] == {"level": "critical", "temperature_c": 81.6, "paused": True, "level_source": "reading"}
    assert waits_recorded(tmp_path / "serve.jsonl") == values["edgesdk_thermal_wait_seconds_total"]


def test_a_pause_the_board_cools_out_of_is_counted_once(runtime, tmp_path):
    """A board that pauses and cools (one started at 79 °C in a 25 °C room): the answer runs after the pause, whose
    seconds /metrics counts once, as the telemetry's "wait" records do."""
    server = HotServer(runtime, tmp_path / "cool.jsonl", ambient_c=25.0)
    try:
        server.thermal.hook.board.temp_c = 79.0
        status, text = server.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4})
        assert status == 200, text
        values = server.metrics()
    finally:
        server.close()
    waited = values["edgesdk_thermal_wait_seconds_total"]
    assert waited > 0
    assert waits_recorded(tmp_path / "cool.jsonl") == pytest.approx(waited)
    assert values['edgesdk_requests_finished_total{finish_reason="length"}'] == 1


def test_the_clock_cap_is_given_back_when_the_guard_gives_up(runtime, tmp_path):
    """With --clock-cap the guard caps the (simulated) clock while it pauses; the answer it gave up on gives the
    idle board its clock back, as an answer that ends does."""
    server = HotServer(runtime, tmp_path / "cap.jsonl", clock_cap=True)
    try:
        status, _ = server.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4})
        board = server.thermal.hook.board
    finally:
        server.close()
    assert status == 503
    records = [json.loads(line) for line in (tmp_path / "cap.jsonl").read_text().splitlines()[1:]]
    assert {record["clock_cap"] for record in records} == {0.625}
    assert board.cap_ratio is None
