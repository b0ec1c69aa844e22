"""``edgesdk deploy``, review 49b: the first contact with a board whose host key is unknown, and the disk space an
engine build takes.

ssh runs against a real sshd on 127.0.0.1 (tests/_utils/sshd.py, the fixture of test_deploy48).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys

import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport


def test_an_unknown_host_keys_fix_connects_with_the_users_own_ssh_options(ssh_server, tmp_path):
    """A board whose key is in no known_hosts is refused (not accepted silently). The fix said to "connect once
    with 'ssh -p PORT user@board'", which leaves out what the user gave deploy: --ssh-config, their -o options
    (a UserKnownHostsFile, a ProxyJump) and -i. That ssh reads ~/.ssh/config and stores the key in
    ~/.ssh/known_hosts, so the next deploy was refused again (or, behind a ProxyJump, it never reached the
    board). The command named now is ssh with the user's options, and running it makes the deploy connect."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    opts = SshOptions(identity=str(ssh_server.user_key), ssh_config="/dev/null",
                      options=(f"UserKnownHostsFile={known}", "GlobalKnownHostsFile=/dev/null"))
    transport = SshTransport(HostSpec.parse(ssh_server.destination), opts)
    try:
        with pytest.raises(DeployError, match="no host key in known_hosts") as refused:
            transport.run(["true"], timeout=60)
        assert known.read_text() == ""  # refused, not accepted
        fix = refused.value.fix
        command = fix.split("connect once with '", 1)[1].split("' and check the fingerprint", 1)[0]
        argv = shlex.split(command)
        assert f"UserKnownHostsFile={known}" in argv
        assert str(ssh_server.user_key) in argv
        assert command == transport.login_command()
        assert argv[-3:] == ["-p", str(ssh_server.port), HostSpec.parse(ssh_server.destination).destination]
        # the user runs it and says yes to the fingerprint (accept-new stands in for that answer)
        first = subprocess.run([argv[0], "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
                                *argv[1:], "true"], capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stderr
        assert transport.run(["true"], timeout=60).returncode == 0  # and deploy connects now
    finally:
        transport.close()


# What a Jetson's probe says (the deploy helper reads these files on the board): an Orin NX 16GB on JetPack 6.2
# whose system Python imports TensorRT 10.3 and whose GPU this user may open.
ORIN_NX = {"device_tree_model": "NVIDIA Jetson Orin NX Engineering Reference Developer Kit\x00",
           "nv_tegra_release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
           "arch": "aarch64", "python_bits": 64, "tensorrt": {"version": "10.3.0", "python": True},
           "gpu_problem": None, "memory": {"MemTotal": 16_000_000_000, "MemAvailable": 12_000_000_000}}


def standard_graph_bundle(source, destination):
    """The tiny bundle as a Jetson recipe writes it: a standard ONNX graph, which the engine step builds from."""
    from edgesdk.bundle import BundleWriter, read_manifest

    manifest = read_manifest(source)
    writer = BundleWriter(destination)
    for name in manifest["files"]:
        writer.add_file(source / name, name)
    body = {key: value for key, value in manifest.items()
            if key not in ("schema_version", "edgesdk_version", "created", "bundle_id", "files")}
    body["graph"] = {**body["graph"], "form": "standard"}
    return writer.commit(body)


@pytest.mark.parametrize("engine_cached", [False, True])
def test_the_disk_check_counts_the_engine_a_jetson_builds(tiny_bundle, tmp_path, monkeypatch, engine_cached):
    """The check before the transfer counted the bundle files and the runtime only; on a Jetson the engine step
    then writes a TensorRT plan about as large as the weights under engines/. A board with room for the files
    and not the engine took the transfer, and the build ran out of space minutes later. The engine is counted
    now (not where this board's engine for the bundle is cached already), and such a board is refused before
    anything is written. The Jetson is a stand-in: its probe answers are the real probe's with a Jetson's files
    and a free space that holds the bundle and the margin, not the engine."""
    from edgesdk.deploy import engine, orchestrate
    from edgesdk.deploy.probe import DISK_MARGIN_BYTES, BoardFacts, memory_bytes
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transfer import bundle_files
    from tests._utils.deploy import tree_state

    bundle = standard_graph_bundle(tiny_bundle.path, tmp_path / "bundle")
    files = bundle_files(bundle)
    total = sum(f["size"] for f in files.values())
    real_probe = orchestrate.probe

    def jetson_probe(board, params=None):
        raw = dict(real_probe(board, params).raw)
        bits = ORIN_NX["python_bits"]
        raw.update({k: v for k, v in ORIN_NX.items() if k != "python_bits"},
                   python={**raw["python"], "bits": bits}, disk={**raw["disk"], "free": total + DISK_MARGIN_BYTES + 1})
        facts = BoardFacts.from_probe(raw)
        key = engine.cache_key(facts.board.jetpack, facts.tensorrt, None, engine.engine_module(facts.board))
        facts.raw["engines"] = [key] if engine_cached else []
        return facts

    monkeypatch.setattr(orchestrate, "probe", jetson_probe)
    # the board's engine builder ('edgesdk engine check'), which the check asks: one that can build, answering with
    # its TensorRT version alone (an older edgesdk's form), so the probe's TensorRT and the bundle's SM name the key
    monkeypatch.setattr(orchestrate, "board_edgesdk",
                        lambda board, facts, local: [sys.executable, "-c", "print('10.3.0')"])
    root = tmp_path / "board"
    options = DeployOptions(to=root, ignore_target=True)
    lines: list[str] = []
    if engine_cached:  # nothing to build: the files and the margin fit, and the check passes
        with contextlib.suppress(DeployError):  # what comes after the check is no part of this test
            orchestrate.deploy(bundle.path, options, Reporter(total=8, write=lines.append))
        assert any(line.endswith("MB needed") for line in lines), lines
        return
    before = tree_state(root)
    with pytest.raises(DeployError, match="not enough disk space") as refused:
        orchestrate.deploy(bundle.path, options, Reporter(total=8, write=lines.append))
    assert "for the TensorRT engine it builds" in refused.value.problem
    engine_mb = memory_bytes(bundle.manifest, files) / 1e6  # the plan holds the weights
    assert f"about {engine_mb:.1f} MB for the TensorRT engine it builds" in refused.value.problem
    assert tree_state(root) == before  # refused before the transfer: nothing written


def test_a_rollback_to_a_previous_release_that_was_removed_names_it_and_the_ones_left(tiny_bundle, tmp_path):
    """previous still pointed to a release whose directory had been removed (by hand, or a disk cleanup): --status
    listed it as previous without a word, and --rollback went to the board's verify, which said only that the
    path does not exist and to see --status (which showed it as previous again). It is refused now naming what
    happened and the releases the board does hold; a release whose files were deleted is refused before the
    switch as before. current never moves."""
    import shutil

    from edgesdk.deploy.orchestrate import deploy
    from edgesdk.deploy.releases import format_status, rollback, status
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from tests._utils.deploy import bundle_variant, current_id

    root = tmp_path / "board"
    options = DeployOptions(to=root)
    ids = []
    for note in ("one", "two", "three"):
        variant = bundle_variant(tiny_bundle.path, tmp_path / note, note)
        ids.append(deploy(variant.path, options, Reporter(total=8, write=lambda line: None)).bundle_id)
    one, two, three = ids
    quiet = Reporter(total=4, write=lambda line: None)
    (root / "releases" / two / "model.onnx").unlink()  # previous with a file deleted: refused, as before
    with pytest.raises(DeployError, match="fails verification") as damaged:
        rollback(options, report=quiet)
    assert "model.onnx: missing" in damaged.value.problem
    shutil.rmtree(root / "releases" / two)  # previous removed whole
    assert f"previous   {two} (removed: no such release here)" in format_status(status(options)).splitlines()
    with pytest.raises(DeployError) as refused:
        rollback(options, report=Reporter(total=4, write=lambda line: None))
    assert f"previous points to releases/{two}, which is no longer on the board" in refused.value.problem
    assert f"--rollback --release ID ({one})" in refused.value.fix
    assert current_id(root) == three
    assert rollback(options, one, Reporter(total=4, write=lambda line: None))["to"] == one  # the way out works
    assert current_id(root) == one
