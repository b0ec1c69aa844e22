"""Mends, 61, of board detection, deploy's target check, the thermal profile and a redeploy's unit check.

- deploy words its advice from the profile a detection note names (``BoardInfo.note_target``), not from the note's
  prose: a module with no shipped profile gave "build the bundle with 'edgesdk build --target with' ...";
- a module no shipped profile is made for keeps the model string's profile, with a note that it is another module's;
- a profile's ambient is held to ``--ambient``'s range, and a temperature refusal names its key and value once;
- a redeploy that switched nothing leaves only an active unit running, and not where another program answers.

``tests/_utils/fake_systemd.py`` stands in for systemctl; the units' servers are real processes.
"""

from __future__ import annotations

import http.server
import sys
import threading
from pathlib import Path

import pytest
import yaml

from edgesdk.board import detect_board
from edgesdk.cli_thermal import AMBIENT
from edgesdk.deploy import board_service
from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.probe import check_target
from edgesdk.deploy.transport import DeployError
from edgesdk.errors import ProfileError
from edgesdk.profile import get_profile, parse_profile
from edgesdk.thermal import AMBIENT_RANGE_C
from tests._utils import fake_systemd
from tests._utils.sshd import free_port
from tests.unit.test_board61 import board_tree
from tests.unit.test_deploy_report61 import _jetson

ORIN_NX_MODEL = "NVIDIA Jetson Orin NX Developer Kit"
INDUSTRIAL = ("nvidia,p3737-0000+p3701-0008", "nvidia,p3701-0008", "nvidia,tegra234")


# -- 1: deploy's advice from the note's profile -------------------------------------------------------------------

def test_a_module_without_a_shipped_profile_is_advised_in_deploy_s_words():
    """The model string names the Orin NX, the compatible the AGX Orin Industrial, which no shipped profile is made
    for: the note's "pass --target with its profile" became "'edgesdk build --target with'"."""
    facts = _jetson(ORIN_NX_MODEL, INDUSTRIAL)
    b = facts.board
    assert (b.suggested_target, b.note_target) == ("orin-nx-16gb", None)
    assert b.detection_note.endswith("pass --target with the module's profile (target= in Python)")
    with pytest.raises(DeployError) as refused:
        check_target("rpi5", facts, "nvidia@orin", ignore=False)
    problem = refused.value.problem
    assert "name different modules: orin-nx-16gb is suggested, from the model string" in problem
    assert ("if the module is the compatible's, deploy a bundle built for the module's profile with --ignore-target "
            "(this one was built for 'rpi5')") in problem, problem
    assert "--target with" not in problem
    assert "target= in Python" not in problem


def test_a_board_of_two_modules_is_advised_in_deploy_s_words():
    facts = _jetson("Custom carrier", ("nvidia,p3768-0000+p3767-0000", "nvidia,p3768-0000+p3767-0004"))
    assert (facts.board.suggested_target, facts.board.note_target) == (None, None)
    with pytest.raises(DeployError) as refused:
        check_target("orin-nx-16gb", facts, "nvidia@carrier", ignore=False)
    problem = refused.value.problem
    assert ("so no target is suggested: deploy a bundle built for the module's profile with --ignore-target (this one "
            "was built for 'orin-nx-16gb')") in problem
    assert "pass --target" not in problem


def test_a_note_naming_a_profile_carries_it():
    facts = _jetson("NVIDIA Jetson Orin Nano Developer Kit", ("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000"),
                    mem=7_620_000 * 1024)
    assert facts.board.note_target == "orin-nx-16gb"
    assert facts.board.detection_note.endswith("pass --target orin-nx-16gb (target= in Python)")
    with pytest.raises(DeployError) as refused:
        check_target("rpi5", facts, "nvidia@orin", ignore=False)
    assert ("build the bundle with 'edgesdk build --target orin-nx-16gb' and deploy that with --ignore-target"
            in refused.value.problem)


# -- 2: a module with no shipped profile -----------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "compatible", "target", "made_for"), [
    ("NVIDIA Jetson Xavier NX Developer Kit", ("nvidia,p3509-0000+p3668-0003", "nvidia,p3668-0003"), "xavier-nx",
     "Xavier NX (p3668-0001)"),
    ("NVIDIA Jetson AGX Orin Developer Kit", ("nvidia,p3737-0000+p3701-0000", "nvidia,p3701-0000"), "agx-orin-32gb",
     "AGX Orin 32GB (p3701-0004)"),
    ("NVIDIA Jetson AGX Orin", INDUSTRIAL[:2], "agx-orin-64gb", "AGX Orin 64GB (p3701-0005)"),
])
def test_a_module_without_a_shipped_profile_keeps_the_model_s_with_a_note(tmp_path, model, compatible, target,
                                                                            made_for):
    mem_kb = 62_000_000 if target == "agx-orin-64gb" else 14_500_000
    board = detect_board(board_tree(tmp_path, model, compatible, mem_kb=mem_kb))
    assert board.suggested_target == target
    assert board.note_target is None
    note = board.detection_note
    assert note is not None
    assert "which no shipped profile is made for" in note
    assert f"{target} is suggested, from the model string, and is made for " in note
    assert made_for in note
    assert note.endswith("pass --target with the module's profile (target= in Python)")


# -- 3: one way to name the module -----------------------------------------------------------------------------------

def test_a_board_with_a_module_and_no_model_names_it_as_a_module():
    facts = _jetson("", ("nvidia,p3768-0000+p3767-0001", "nvidia,p3767-0001", "nvidia,tegra234"),
                    mem=7_620_000 * 1024)
    assert facts.board.model is None
    assert facts.board.module_words() == "module Orin NX 8GB (p3767-0001)"
    with pytest.raises(DeployError) as refused:
        check_target("orin-nano-4gb", facts, "nvidia@orin", ignore=False)
    assert refused.value.problem == ("the bundle was built for target 'orin-nano-4gb', but nvidia@orin is "
                                     "'orin-nx-8gb' (module Orin NX 8GB (p3767-0001))")


# -- 4: the ambient's range, the refusal's wording ---------------------------------------------------------------------

def _refusal(section: str, key: str, value: float) -> str:
    data = get_profile("rpi5").summary()
    data[section][key] = value
    with pytest.raises(ProfileError) as info:
        parse_profile(yaml.safe_dump(data, sort_keys=False), "my-board.yaml")
    return str(info.value)


def test_an_ambient_in_fahrenheit_is_refused_as_ambient_refuses_it():
    assert (AMBIENT.min, AMBIENT.max) == AMBIENT_RANGE_C
    message = _refusal("thermal_model", "ambient_c", 95)
    assert "thermal_model.ambient_c" in message
    assert "95 °F is 35.0 °C" in message
    assert f"from {AMBIENT_RANGE_C[0]:g} °C to {AMBIENT_RANGE_C[1]:g} °C" in message
    assert "298.15 K is 25.0 °C" in _refusal("thermal_model", "ambient_c", 298.15)
    assert "e.g. 25 for a room" in _refusal("thermal_model", "ambient_c", -41)


def test_a_refusal_names_the_key_and_the_value_once_and_its_readings_in_one_parenthesis():
    message = _refusal("thermal", "soft_limit_c", 298.15)
    assert message.count("thermal.soft_limit_c") == 1
    assert message.count("298.15") == 3  # the two readings and pydantic's "(got ...)"
    assert "(298.15 K is 25.0 °C or 298.15 °F is 147.9 °C)" in message
    millidegrees = _refusal("thermal", "soft_limit_c", 75000)
    assert millidegrees.count("thermal.soft_limit_c") == 1
    assert millidegrees.count("75000") == 1
    assert "write 75" in millidegrees


# -- 5: a redeploy's unit check ----------------------------------------------------------------------------------------

@pytest.fixture
def fake(tmp_path, monkeypatch) -> Path:
    state = tmp_path / "systemd-state"
    for key, value in fake_systemd.install(tmp_path / "bin", state).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    monkeypatch.setattr(board_service, "unit_scope", lambda: "system")  # whoever runs the tests
    yield state
    fake_systemd.stop_all(state)


def _service(root: Path, port: int, action: str, **extra) -> dict:
    current = root / "current"
    current.mkdir(parents=True, exist_ok=True)
    (current / "health").write_text("ok")
    argv = [sys.executable, "-m", "http.server", "--directory", str(current), "--bind", "127.0.0.1", str(port)]
    return board_service.op_service({"root": str(root), "action": action, "argv": argv, "token": "t", "fix": "fix",
                                     "health_url": f"http://127.0.0.1:{port}/health", "timeout_s": 20, **extra})


def _restarts(state: Path) -> int:
    return len([c for c in fake_systemd.calls(state) if c[-2:] == ["restart", "edgesdk-serve"]])


def test_a_unit_that_is_stopping_is_restarted_not_left_running(tmp_path, fake, monkeypatch):
    """``deactivating``: the unit is being stopped, its server answers until it exits."""
    root, port = tmp_path / "board", free_port()
    assert _service(root, port, "install")["restarted"]
    assert _restarts(fake) == 1
    monkeypatch.setattr(board_service, "unit_state", lambda scope: ("deactivating", ""))

    result = _service(root, port, "restart", unless_up=True, during="deploy")

    assert result["restarted"] is True, result
    assert "up" not in result
    assert _restarts(fake) == 2


def test_an_active_unit_that_answers_is_left_running(tmp_path, fake):
    root, port = tmp_path / "board", free_port()
    assert _service(root, port, "install")["restarted"]

    result = _service(root, port, "restart", unless_up=True, during="deploy")

    assert (result["restarted"], result["up"]) == (False, True)
    assert _restarts(fake) == 1


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_another_program_answering_on_the_unit_s_port_is_refused_not_taken_for_the_unit(tmp_path, fake,
                                                                                          monkeypatch):
    """systemd said the unit is active, but by the time the port is asked its server has gone and another program
    (llama-server says 200 on /health too) answers there: refused, as before a restart, not "left running"."""
    root, port = tmp_path / "board", free_port()
    assert _service(root, port, "install")["restarted"]
    fake_systemd.stop_all(fake)
    monkeypatch.setattr(board_service, "unit_state", lambda scope: ("active", ""))
    other = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Answer)
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(Refused) as refused:
            _service(root, port, "restart", unless_up=True, during="deploy")
    finally:
        other.shutdown()
        other.server_close()
    assert f"something other than the system unit edgesdk-serve already answers on http://127.0.0.1:{port}/health" \
        in refused.value.problem
    assert "--service-port" in refused.value.fix
    assert _restarts(fake) == 1
