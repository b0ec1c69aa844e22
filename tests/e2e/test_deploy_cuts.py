"""The transfer cut at random points: every cut leaves the previous release intact, verifiable and
runnable, and the next deploy resumes from what the board already received.

Cuts alternate between killing the ssh client and killing the sshd processes that serve the
connection, each at a random byte of what the upload still has to send. Three bundle variants
are deployed one after the other, each cut several times before it is allowed through, so every
cut has a different "previous release" to protect.
"""

from __future__ import annotations

import random
import sys

import pytest

from edgesdk.bundle import verify_bundle
from edgesdk.deploy.orchestrate import deploy
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import DeployError, SshOptions
from tests._utils.deploy import bundle_variant, current_id, edgesdk, faulty_ssh_command

pytestmark = pytest.mark.slow


VARIANTS = 3
CUTS_PER_VARIANT = 7  # 21 cuts in all
PADDING = 3_000_000


def options(server, root, ssh_command: str | None = None) -> DeployOptions:
    ssh = SshOptions(identity=str(server.user_key), ssh_config="/dev/null", ssh_command=ssh_command,
                     options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    return DeployOptions(host=server.destination, remote_root=str(root), ssh=ssh, remote_python=sys.executable,
                         system_site_packages=True)


def still_to_send(bundle, root) -> int:
    """Bytes of file data the board lacks (what the upload stream carries, headers aside)."""
    staging = root / "staging" / bundle.bundle_id
    missing = 0
    for name, facts in bundle_files(bundle).items():
        if (staging / name).is_file():
            continue
        partial = staging / (name + ".partial")
        missing += facts["size"] - (partial.stat().st_size if partial.is_file() else 0)
    return missing


def test_transfer_cut_at_random_points_keeps_the_previous_release(ssh_server, tiny_bundle, tmp_path):
    rng = random.Random(20240606)
    root = tmp_path / "board"
    log: list[str] = []
    first = deploy(tiny_bundle.path, options(ssh_server, root), Reporter(8, write=log.append))
    expected = first.bundle_id
    cuts, resumed = [], 0
    for v in range(VARIANTS):
        bundle = bundle_variant(tiny_bundle.path, tmp_path / f"v{v}", f"cut variant {v}", padding=PADDING)
        for c in range(CUTS_PER_VARIANT):
            remaining = still_to_send(bundle, root)
            assert remaining > 1, "the cuts should land inside the transfer"
            at = rng.randrange(1, remaining)
            mode = "client" if (v * CUTS_PER_VARIANT + c) % 2 == 0 else "server"
            faulty = faulty_ssh_command(f"{mode}:{at}", ssh_server.process.pid)
            with pytest.raises(DeployError) as cut:
                deploy(bundle.path, options(ssh_server, root, faulty), Reporter(8, write=log.append))
            assert "the board keeps its current release" in str(cut.value), str(cut.value)
            cuts.append((mode, at, remaining))
            # The previous release is untouched: current, every sha256, and generation.
            assert current_id(root) == expected
            verify_bundle(root / "current")
            ran = edgesdk("run", root / "current", "--prompt", "hi", "-n", 4, "--raw")
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.strip()
        left = still_to_send(bundle, root)
        done = deploy(bundle.path, options(ssh_server, root), Reporter(8, write=log.append))
        assert done.bytes_sent == left  # resumed: only what the cuts had not delivered
        resumed += sum(f["size"] for f in bundle_files(bundle).values()) - left
        assert current_id(root) == bundle.bundle_id
        verify_bundle(root / "current")
        expected = bundle.bundle_id
    assert len(cuts) >= 20
    assert {mode for mode, _, _ in cuts} == {"client", "server"}
    print(f"\nMEASURED {len(cuts)} cuts (client and sshd killed), all left the previous release intact; "
          f"{resumed} bytes were not re-sent thanks to resume")
