"""A bundle deployed again whose release is still on the board and sound is sent nothing; it is committed
again all the same, so another deploy's prune leaves it alone until this deploy switches to it.

A stand-in Python for the board helper runs a second deploy (``--keep 1``) just before the first one's
switch, as a concurrent deploy would: its prune removes every release not current, previous or in flight.
"""

from __future__ import annotations

import os
import shlex
import sys

from tests._utils.deploy import bundle_variant, current_id, edgesdk


def test_a_sound_release_deployed_again_survives_a_concurrent_prune(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    bundles = [tiny_bundle] + [bundle_variant(tiny_bundle.path, tmp_path / name, name) for name in ("b", "c", "e")]
    first, second, third, other = bundles
    for bundle in (first, second, third):
        deployed = edgesdk("deploy", bundle.path, "--to", root)
        assert deployed.returncode == 0, deployed.stderr
    assert current_id(root) == third.bundle_id

    inner = shlex.join([sys.executable, "-m", "edgesdk.cli", "deploy", str(other.path), "--to", str(root),
                        "--keep", "1"])
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ] && [ "$3" = "switch" ] && [ -z "$CONCURRENT_DEPLOY_RAN" ]; then
    CONCURRENT_DEPLOY_RAN=1 {inner} > {shlex.quote(str(tmp_path / "inner.log"))} 2>&1
fi
exec {shlex.quote(sys.executable)} "$@"
""")
    python.chmod(0o755)
    again = edgesdk("deploy", first.path, "--to", root, "--remote-python", python,
                    env={**os.environ, "CONCURRENT_DEPLOY_RAN": ""})
    inner_log = (tmp_path / "inner.log").read_text()
    assert "deployed bundle" in inner_log, inner_log  # the concurrent deploy ran, and pruned
    assert again.returncode == 0, again.stderr
    assert "nothing to send" in again.stderr + again.stdout
    assert current_id(root) == first.bundle_id
    assert not (root / "releases" / second.bundle_id).exists()  # pruned by the concurrent deploy
