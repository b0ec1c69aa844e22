"""The host side of deploy's install and service steps: the runtime key, and the service check before the switch.

The board helper runs for real through a local transport; ``tests/_utils/fake_systemd.py`` stands in for
systemctl only.
"""

from __future__ import annotations

import sys

import pytest

from edgesdk import __version__
from edgesdk.deploy import install, service
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils import fake_systemd


@pytest.fixture
def board(tmp_path, monkeypatch):
    """(board, systemd state): a deploy root in tmp whose helper sees the stand-in systemctl."""
    state = tmp_path / "systemd-state"
    for key, value in fake_systemd.install(tmp_path / "bin", state).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    root = tmp_path / "board"
    yield Board(LocalTransport(str(root)), sys.executable, str(root)), state
    fake_systemd.stop_all(state)


@pytest.mark.parametrize("bad", ['/opt/it\'s/runtime/current/bin/edgesdk', '/opt/a"b/bin/edgesdk',
                                 "/opt/a\\b/bin/edgesdk", "bin/edgesdk"])
def test_the_service_check_refuses_a_program_systemd_refuses_before_anything_changes(board, bad):
    """A deploy --service into a root whose path holds an apostrophe passed the check (step 3), installed the
    runtime, sent the bundle, switched current, and only then did the board's install refuse the unit's program
    (systemd refuses a quote, an apostrophe, a backslash or a relative path in ExecStart's program:
    config_parse_exec), so the deploy had to switch back. check_service now takes the unit's command line and
    refuses it with the board's own words before anything is asked of the board."""
    the_board, state = board
    options = service.ServiceOptions(port=18080)
    argv = service.serve_argv([bad], "/opt/root/current", options, ignore_target=False)
    with pytest.raises(DeployError) as caught:
        service.check_service(the_board, options, argv)
    assert "the service's program" in caught.value.problem
    assert repr(bad) in caught.value.problem
    assert "deploy with --service again" in caught.value.fix
    assert fake_systemd.calls(state) == []  # refused on the host: the board was not asked


def test_the_service_check_passes_a_program_systemd_takes(board, tmp_path):
    """A path with spaces, ``%`` and ``$`` is one systemd runs (the unit quotes it): the check goes on to the
    board, whose systemd answers."""
    the_board, state = board
    options = service.ServiceOptions(port=18081)
    program = str(tmp_path / "my runtime 100%$x" / "bin" / "edgesdk")
    argv = service.serve_argv([program], str(tmp_path / "board" / "current"), options, ignore_target=True)
    line = service.check_service(the_board, options, argv)
    assert line.startswith("systemd answers; the ")
    assert fake_systemd.calls(state)  # the board's systemd was asked


def test_the_runtime_key_names_the_board_python_and_the_site_packages(monkeypatch):
    """The runtime key decides whether the board's runtime is "up to date"; it named edgesdk's version and
    source only, so a deploy with another --remote-python (or after the board's Python was upgraded, which
    leaves the venv's bin/python pointing to an interpreter that is gone) kept the runtime built with the old
    one. The key now ends in -py<major><minor> (and -site for a venv that sees the system's packages)."""
    monkeypatch.setattr(install, "checkout_root", lambda: None)  # an installed release: no wheel to build
    assert install.runtime_source().key == f"{__version__}-pypi"  # the key without the board's facts
    py310 = install.runtime_source((3, 10, 12), inherit=False)
    assert py310.key == f"{__version__}-pypi-py310"
    assert py310.pip_spec == f"edgesdk=={__version__}"
    assert install.runtime_source((3, 11, 4), inherit=False).key == f"{__version__}-pypi-py311"
    assert install.runtime_source((3, 10, 4), inherit=True).key == f"{__version__}-pypi-py310-site"
    assert install.runtime_source((3, 10, 4)).key == py310.key  # the micro release keeps the venv's ABI
