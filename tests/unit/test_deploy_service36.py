"""Two ``deploy --service`` into one root: each waits for its service's /health outside the deploy lock, so
one's undo may run after the other deploy switched ``current``. The undo leaves that deploy's release current
and its server running.

The board side runs for real through a local transport; ``tests/_utils/fake_systemd.py`` stands in for
systemctl, and the unit's ExecStart it starts is a real process that serves the release behind ``current``
as it was when it started.
"""

from __future__ import annotations

import os
import sys
import urllib.request

import pytest

from edgesdk.deploy.orchestrate import undo_service
from edgesdk.deploy.remote import BoardRefusal
from edgesdk.deploy.report import Reporter
from tests.unit.test_deploy_helper import commit_by_hand, make_bundle
from tests.unit.test_deploy_review35 import BAD_ARGV, LOADS_AT_START, board, free_port, install  # noqa: F401

pytestmark = pytest.mark.usefixtures("board")


def served(port: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/which", timeout=30).read()


def current(root: str) -> str:
    return os.path.basename(os.readlink(os.path.join(root, "current")))


@pytest.mark.parametrize("other_installs_first", [True, False])
def test_a_failed_service_leaves_the_release_another_deploy_switched_to(board, tmp_path,  # noqa: F811
                                                                        other_installs_first):
    """X is served. Deploy F switches current to its release, then deploy O to its own; F's service then does
    not come up, before or after O's did. F's undo switched current back to X over O's switch, and the unit put
    back was restarted on X: O had reported success (or went on to), and the board served X."""
    board, _units, _state = board
    port, root = free_port(), board.root
    x, f, o = (make_bundle(tmp_path / name, {"health": b"ok", "which": name.encode()}) for name in "xfo")
    for bundle in (x, f, o):
        commit_by_hand(board, bundle)
    board.call("switch", {"bundle_id": x.bundle_id})
    (tmp_path / "server.py").write_text(LOADS_AT_START)
    good = [sys.executable, str(tmp_path / "server.py"), f"{root}/current", str(port)]
    assert install(board, good, port, "x")["restarted"]
    assert served(port) == b"x"

    switched_from = board.call("switch", {"bundle_id": f.bundle_id})["from"]  # deploy F's switch
    board.call("switch", {"bundle_id": o.bundle_id})  # deploy O's, while F is on its way to /health
    if other_installs_first:
        install(board, good, port, "o")
        assert served(port) == b"o"
    with pytest.raises(BoardRefusal) as failed:  # F's service does not come up
        install(board, BAD_ARGV, port, "f")
    lines: list[str] = []
    error = undo_service(board, Reporter(9, write=lines.append), failed.value, "f", switched_from, f.bundle_id,
                         None, None)
    assert current(root) == o.bundle_id
    assert served(port) == b"o"  # the unit as it was before F's install, restarted on current
    assert f"current stays releases/{o.bundle_id}, which another deploy or rollback switched to since" \
        in error.problem
    assert "put back as it was and restarted" in error.problem
    if not other_installs_first:
        assert install(board, good, port, "o")["restarted"]  # O's install, after F's undo
        assert served(port) == b"o"
    assert os.readlink(os.path.join(root, "previous")) == os.path.join("releases", f.bundle_id)
