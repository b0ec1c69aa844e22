"""``edgesdk deploy``, review 49: the switch under lock contention, the journal of a user unit, the engine
check's CUDA device, the engine cache key and the service check's own unit.

The board side runs for real through a local transport; ``tests/_utils/fake_systemd.py`` stands in for
systemctl only.
"""

from __future__ import annotations

import fcntl
import json
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.orchestrate import deploy
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import bundle_variant, current_id
from tests.unit.test_deploy48 import board  # noqa: F401 - the fixture: a deploy root with the stand-in systemctl

# The board's Python for the deploy helper, with a clock that runs 2000 times fast: the root's lock gives up
# after its 120 s in 0.06 s. Everything else (the lock, the links, the helper) is the real one.
FAST_CLOCK_PYTHON = """#!{python}
import os, sys, time
if len(sys.argv) > 2 and sys.argv[1] == "-c" and "BOARD_BUNDLED" in sys.argv[2]:
    _monotonic = time.monotonic
    time.monotonic = lambda: _monotonic() * 2000
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {{"__name__": "__main__"}})
else:
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
"""


def test_a_switch_refused_for_the_lock_says_current_stays_the_previous_release(tiny_bundle, tmp_path):
    """Another deploy holding the root's lock through the switch step: the board refuses the switch before any
    link moves, so current is the release it was. The deploy asked the board to switch back as well, was
    refused again (the lock still held, after another 120 s) and said current may be either release."""
    python = tmp_path / "python"
    python.write_text(FAST_CLOCK_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    root = tmp_path / "board"
    options = DeployOptions(to=root, remote_python=str(python))
    first = deploy(tiny_bundle.path, options, Reporter(total=8, write=lambda line: None))
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    held = []

    def write(line: str) -> None:
        if line.endswith("switch current") and not held:  # the step starts: another deploy takes the lock
            handle = open(root / ".deploy.lock", "a+")  # noqa: SIM115 - closed below
            fcntl.flock(handle, fcntl.LOCK_EX)
            held.append(handle)

    try:
        with pytest.raises(DeployError) as refused:
            deploy(second.path, options, Reporter(total=8, write=write))
    finally:
        for handle in held:
            handle.close()
    assert held, "the switch step never started"
    assert current_id(root) == first.bundle_id
    text = refused.value.problem
    assert "another deploy holds" in text
    assert f"current stays releases/{first.bundle_id}, as it was before this deploy" in text
    assert "may be" not in text
    assert second.bundle_id not in text.split("\n", 1)[1]


# journalctl on a board whose journal is volatile (Storage=volatile, or no /var/log/journal): journald keeps one
# runtime journal, not split per user, so 'journalctl --user' finds no file with the user unit's lines, while
# the system journal holds them under _SYSTEMD_USER_UNIT=, which --user-unit matches (journald.conf(5) SplitMode=).
VOLATILE_JOURNALCTL = """#!/bin/sh
case " $* " in
  *" --user "*) exit 0 ;;
  *" --user-unit edgesdk-serve "*) printf 'Error: address already in use\\nserve exited 1\\n' ;;
  *) echo "-- No entries --" ;;
esac
"""


def journalctl_stand_in(tmp_path, monkeypatch, text: str) -> None:
    folder = tmp_path / "journal-bin"
    folder.mkdir()
    (folder / "journalctl").write_text(text)
    (folder / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{__import__('os').environ['PATH']}")


def test_a_user_units_journal_is_read_from_the_system_journal_where_the_journal_is_volatile(tmp_path, monkeypatch):
    """What a failed user unit logged came out as '(no journal lines)' on a board with a volatile journal."""
    from edgesdk.deploy import board_service

    journalctl_stand_in(tmp_path, monkeypatch, VOLATILE_JOURNALCTL)
    assert board_service.journal_tail("user") == "Error: address already in use\nserve exited 1"


def test_where_no_journal_lines_are_readable_the_tail_says_where_they_are(tmp_path, monkeypatch):
    from edgesdk.deploy import board_service

    journalctl_stand_in(tmp_path, monkeypatch, "#!/bin/sh\necho '-- No entries --'\n")
    tail = board_service.journal_tail("user")
    assert "sudo journalctl --user-unit edgesdk-serve" in tail
    assert "systemd-journal" in tail
    assert board_service.journal_tail("system") == "(no journal lines)"


# A server that says 200 to every GET, bound where its command line says (as edgesdk serve --host --port).
OK_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
args = sys.argv[1:]
http.server.HTTPServer((args[args.index("--host") + 1], int(args[args.index("--port") + 1])), Handler).serve_forever()
"""


def test_the_service_check_knows_its_own_unit_moved_from_a_wildcard_to_one_address(board, tmp_path):  # noqa: F811
    """The unit serves 0.0.0.0:PORT (its health URL 127.0.0.1:PORT); a redeploy that binds it to one of the board's
    addresses on the same port (127.0.0.2 here: any address of the board is one the unit accepts on) was refused
    as a foreign server on that port, as the health URLs differ."""
    from edgesdk.deploy import service
    from tests.unit.test_deploy48 import free_port, serving

    board_, _units, _state = board
    script = tmp_path / "ok_server.py"
    script.write_text(OK_SERVER)
    port = free_port()
    wildcard = service.ServiceOptions(host="0.0.0.0", port=port)
    argv = [sys.executable, str(script), "--host", "0.0.0.0", "--port", str(port)]
    service.install_service(board_, argv, wildcard, "token")
    moved = service.ServiceOptions(host="127.0.0.2", port=port)
    assert service.check_service(board_, moved, [sys.executable, "serve"]).startswith("systemd answers")
    # another port, held by another program, is still refused
    other = free_port()
    with serving(other, 200):
        with pytest.raises(DeployError, match="something other than the (system|user) unit"):
            service.check_service(board_, service.ServiceOptions(host="127.0.0.1", port=other),
                                  [sys.executable, "serve"])


def test_two_gpus_of_one_sm_do_not_share_an_engine_key(monkeypatch):
    """On a machine that is not a Jetson the key held the SM alone, so an RTX 4090's engine (sm_89) was taken
    for an L40's (sm_89 too); TensorRT engines fit the GPU model they were built on, unless built with hardware
    compatibility. This machine has no GPU: the device's name is stood in for, the board detection is real."""
    from edgesdk.board import detect_board
    from edgesdk.runtime import tensorrt_engine as te

    assert detect_board().family != "jetson"
    keys = set()
    for name in ("NVIDIA GeForce RTX 4090", "NVIDIA L40"):
        monkeypatch.setattr(te, "cuda_device_name", lambda device=0, name=name: name)
        keys.add(te.cache_key(None, "10.3.0", 89, te.board_module()))
    assert keys == {"jpunknown-trt10.3.0-sm89-NVIDIA-GeForce-RTX-4090", "jpunknown-trt10.3.0-sm89-NVIDIA-L40"}


def test_the_device_name_is_none_where_no_cuda_runtime_answers():
    from edgesdk.runtime import tensorrt_engine as te

    if te.cuda_device_sm()[0] is None:  # no usable GPU here (a CUDA runtime without a driver, say): no name
        assert te.cuda_device_name() is None
    else:
        assert te.cuda_device_name()


def test_a_jetson_whose_gpu_this_user_cannot_open_skips_the_engine_and_names_the_fix(tmp_path):
    """'edgesdk engine check' imports TensorRT only; where the deploy user is not in the group video (L4T's
    udev rules: the GPU's nodes are root:video 0660) the build ran and failed with "no CUDA device is usable".
    The probe runs as a user without that access (nobody), on device nodes made like L4T's."""
    import os
    import subprocess
    import tempfile

    from edgesdk.deploy import board_transfer, engine
    from edgesdk.deploy.probe import BoardFacts
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport
    from tests.unit.test_deploy_checks import ORIN

    # the test's tmp_path is private to root: the device nodes go where another user reaches them
    dev = Path(tempfile.mkdtemp(prefix="edgesdk-dev-", dir="/tmp"))
    dev.chmod(0o755)
    missing = board_transfer.jetson_gpu_problem(str(dev))
    assert "no GPU device node of a Jetson" in missing[0]
    assert "--runtime nvidia" in missing[1]
    for name in ("nvhost-ctrl-gpu", "nvmap"):
        (dev / name).write_text("")
        (dev / name).chmod(0o660)
    assert board_transfer.jetson_gpu_problem(str(dev)) is None or os.geteuid() != 0
    if os.geteuid() != 0:
        pytest.skip("needs root to run the probe as another user")
    code = (f"import sys, json; sys.path.insert(0, {str(Path(board_transfer.__file__).parents[2])!r}); "
            "from edgesdk.deploy.board_transfer import jetson_gpu_problem; "
            f"print(json.dumps(jetson_gpu_problem({str(dev)!r})))")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, env={"USER": "nobody", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    problem = json.loads(out.stdout)
    assert "nobody cannot open the GPU's device nodes" in problem[0]
    assert "nvmap" in problem[0]
    assert "sudo usermod -aG" in problem[1]
    assert "nobody" in problem[1]
    jetson = Board(LocalTransport(str(tmp_path)), "python3", "/root")
    decision = engine.decide(BoardFacts.from_probe({**ORIN, "gpu_problem": problem}), 87, "abc", jetson,
                             engine.BuilderStatus(True))
    assert not decision.build
    assert decision.message.startswith("skipped:")
    assert "sudo usermod -aG" in decision.message
    import shutil

    shutil.rmtree(dev)
