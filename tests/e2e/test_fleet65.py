"""A fleet's retry line against a real OpenSSH server on 127.0.0.1 (review 65).

One board answers and refuses the bundle (built for another target); a port nothing listens on is a board that is
off. The retry line named both, and rerunning it could only fail again on the board that refused.
"""

from __future__ import annotations

import shlex
import sys

import pytest

from tests._utils.deploy import bundle_variant, edgesdk
from tests._utils.sshd import free_port, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    yield from serve(tmp_path_factory, "sshd-fleet65")


def command_after(text: str, start: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(start))
    return shlex.split(line.split(": ", 1)[1])


def test_a_board_that_refused_the_bundle_is_not_in_the_retry_but_on_a_line_with_its_fix(board, tiny_bundle,
                                                                                        tmp_path):
    other_target = bundle_variant(tiny_bundle.path, tmp_path / "rpi5", "rpi5", target="rpi5")
    off = f"{board.destination.rsplit(':', 1)[0]}:{free_port()}"

    done = edgesdk("deploy", other_target.path, "--host", board.destination, "--host", off,
                   "--remote-root", tmp_path / "root", "--ssh-config", "/dev/null", "-i", board.user_key,
                   "--ssh-option", f"UserKnownHostsFile={board.known_hosts}",
                   "--ssh-option", "GlobalKnownHostsFile=/dev/null", "--remote-python", sys.executable)

    assert done.returncode == 1, done.stderr
    assert f"{board.destination}: error: the bundle was built for target 'rpi5'" in done.stderr
    retry = command_after(done.stdout, "retry the 1 board that did not finish")
    assert [retry[i + 1] for i, word in enumerate(retry) if word == "--host"] == [off]
    refused = command_after(done.stdout, "after the fix its error gives, run the deploy again on the 1 board that "
                                        "refused it")
    assert [refused[i + 1] for i, word in enumerate(refused) if word == "--host"] == [board.destination]
    assert refused[:3] == ["edgesdk", "deploy", str(other_target.path)]
    assert not (tmp_path / "root" / "current").exists()
