"""Fleet inventories (edgesdk/deploy/fleet.py) read as a user writes them: a byte order mark, a ``#`` inside a
value, one board spelled two ways."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from edgesdk.deploy import fleet
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import tiny_checkout


def test_a_byte_order_mark_is_no_part_of_the_first_board(tmp_path):
    """Notepad (before Windows 10 1903) saves UTF-8 with a BOM: the first board was '\\ufeffpi@a', which ssh
    tried as the user '\\ufeffpi' and the board refused with a login failure naming no cause."""
    inventory = tmp_path / "boards.txt"
    inventory.write_bytes(b"\xef\xbb\xbfpi@a remote_root=/data\r\npi@b\r\n")
    boards = fleet.read_inventory(inventory)
    assert [(b.host, b.remote_root) for b in boards] == [("pi@a", "/data"), ("pi@b", None)]


def test_a_hash_inside_a_word_is_no_comment(tmp_path):
    """As a POSIX shell reads a line, '#' starts a comment only at the start of a word: shlex's comments=True
    cut 'remote_root=/data/edge#2' to /data/edge and dropped the rest of the line (remote_python), silently."""
    inventory = tmp_path / "boards.txt"
    inventory.write_text("# lab boards\n"
                         "pi@a remote_root=/data/edge#2 remote_python=/usr/bin/python3.11   # the second root\n"
                         "   \n"
                         "pi@[::1]:2222 remote_root='/data/x #3'  # quoted\n"
                         "pi@b\t# it's a comment with an unclosed quote\n")
    boards = fleet.read_inventory(inventory)
    assert [(b.host, b.remote_root, b.remote_python) for b in boards] == [
        ("pi@a", "/data/edge#2", "/usr/bin/python3.11"),
        ("pi@[::1]:2222", "/data/x #3", None),
        ("pi@b", None, None),
    ]
    inventory.write_text("pi@a remote_root='/data/x'#2 extra\n")
    with pytest.raises(DeployError, match="'extra' is not a KEY=VALUE setting"):
        fleet.read_inventory(inventory)


@pytest.mark.parametrize(("first", "second"), [
    ("pi@Orin.local", "pi@orin.local"),
    ("pi@ORIN.LOCAL:2222", "pi@orin.local:2222"),
    ("pi@[::1]:2222", "pi@[0:0:0::1]:2222"),
    ("pi@[FE80::1%eth0]", "pi@[fe80::1%eth0]"),
])
def test_one_board_spelled_two_ways_is_given_twice(tmp_path, first, second):
    """ssh lowercases the host name (ssh.c lowercase(host)) and an address reaches the same board however it is
    written: two deploys ran at once into one deploy root, the second failing on the first's lock or redoing it."""
    inventory = tmp_path / "boards.txt"
    inventory.write_text(f"{second}\n")
    with pytest.raises(DeployError) as refused:
        fleet.fleet_boards((first,), inventory, (), "~/edgesdk")
    assert f"board {second} (deploy root ~/edgesdk) is given twice: at --host and at {inventory}:1" \
        in refused.value.problem


@pytest.mark.parametrize("pair", [("Pi@a", "pi@a"), ("pi@a", "pi@a:2222"), ("pi@a", "a"), ("pi@[::1]", "pi@[::2]")])
def test_boards_that_may_differ_stay_apart(pair):
    """User names are case-sensitive; a port or user left out may be set in ~/.ssh/config."""
    assert [b.host for b in fleet.fleet_boards(pair, None, (), "~/edgesdk")] == list(pair)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_ssh_itself_lowercases_the_host_name():
    """The reference: what 'ssh -G' resolves a mixed-case host name to."""
    out = subprocess.run(["ssh", "-G", "-F", "/dev/null", "pi@Orin.EXAMPLE"], capture_output=True, text=True,
                         timeout=30).stdout
    assert "hostname orin.example" in out.splitlines()
    assert fleet.same_host(fleet.HostSpec.parse("pi@Orin.EXAMPLE")).host == "orin.example"


def test_a_file_written_at_the_top_of_the_checkout_is_no_new_runtime(tmp_path, monkeypatch):
    """A model fetched into the checkout or a benchmark's results.json is no part of the wheel: counted, it made
    a new runtime key, so the next deploy hashed it, copied it into the wheel's build tree and reinstalled the
    runtime (pip, minutes on a Pi) on every board. The files the build reads still count, and build."""
    from edgesdk.deploy import install

    root = tiny_checkout(tmp_path / "checkout")
    before = install.source_digest(root)
    (root / "results.json").write_text("{}")
    (root / "smollm2-135m.gguf").write_bytes(b"GGUF" + bytes(64))
    assert install.source_digest(root) == before
    assert [p.relative_to(root).as_posix() for p in install.source_files(root)] == [
        "LICENSE", "README.md", "edgesdk/__init__.py", "pyproject.toml"]
    (root / "README.md").write_text("# edgesdk, changed\n")
    assert install.source_digest(root) != before
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    wheel = install.build_wheel(root, install.source_digest(root))
    assert wheel.name.startswith("edgesdk-0.1.0-")
    assert wheel.suffix == ".whl"


def test_json_tells_apart_the_failed_roots_of_one_board(tmp_path, tiny_bundle):
    """A board given twice with two roots: each failed entry of --json named only 'host', the same twice, and
    (unlike a deploy that finished) carries no 'root' from the board, so a script could not tell which failed."""
    import json
    import sys

    from click.testing import CliRunner

    from edgesdk.cli import main

    spy = tmp_path / "ssh.py"
    spy.write_text("import sys\nsys.stderr.write('ssh: connect to host b1 port 22: Connection refused\\n')\n"
                   "sys.exit(255)\n")
    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@b1 remote_root=/one\npi@b1 remote_root=/two\n")
    bundle = tiny_bundle.path  # verified once before any board: only the boards fail
    result = CliRunner().invoke(main, ["deploy", str(bundle), "--hosts", str(inventory), "--json", "--no-install",
                                       "--ssh-command", f"{sys.executable} {spy}"], prog_name="edgesdk")
    assert result.exit_code == 1, result.output
    listed = json.loads(result.stdout)
    assert [(item["host"], item["remote_root"], item["ok"], item["state"]) for item in listed] == [
        ("pi@b1", "/one", False, "failed"), ("pi@b1", "/two", False, "failed")]
    assert "deploy of 2 boards: 0 of 2 boards ok, 2 failed" in result.stderr


def _facts(model, memory):
    from edgesdk.deploy.probe import BoardFacts

    cpuinfo = "processor\t: 0\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd0b\nFeatures\t: fp asimd\n"
    return BoardFacts.from_probe({"root": "/home/pi/edgesdk", "arch": "aarch64", "disk": {"free": 10**10},
                                  "python": {"version": [3, 11, 2], "bits": 64}, "cpuinfo": cpuinfo,
                                  "device_tree_model": model + "\x00", "memory": {"MemTotal": memory}})


def test_a_bundle_for_a_profile_of_ones_own_is_refused_with_the_way_through():
    """'edgesdk build --target rock5b.yaml' makes a bundle no board matches: the refusal said 'add a profile for
    this board' (done already; deploy still refuses) or 'build it with --target rpi5', not --ignore-target."""
    from edgesdk.deploy.probe import check_target

    rock = _facts("Radxa ROCK 5B", 16_000_000_000)
    assert rock.board.suggested_target is None
    with pytest.raises(DeployError) as refused:
        check_target("rock5b", rock, "radxa@rock", ignore=False)
    assert "the bundle was built for 'rock5b', a target profile of your own" in refused.value.problem
    assert "model 'Radxa ROCK 5B', aarch64" in refused.value.problem
    assert refused.value.fix.startswith("pass --ignore-target to deploy it anyway")
    assert "add a profile" not in refused.value.fix
    pi5 = _facts("Raspberry Pi 5 Model B Rev 1.0", 8_300_000_000)
    with pytest.raises(DeployError) as refused:
        check_target("rpi5-custom", pi5, "pi@pi5", ignore=False)
    assert "a target profile of your own" in refused.value.problem
    assert "--ignore-target" in refused.value.fix
    assert "'edgesdk build --target rpi5'" in refused.value.fix
    assert check_target("rock5b", rock, "radxa@rock", ignore=True) == \
        "target check skipped (--ignore-target): bundle for 'rock5b', board matches no shipped profile"
    # a shipped target on an unknown board keeps its own message
    with pytest.raises(DeployError, match="cannot tell which target profile matches radxa@rock") as refused:
        check_target("rpi5", rock, "radxa@rock", ignore=False)
    assert "--ignore-target" in refused.value.fix
    assert "add a profile" not in refused.value.fix  # a profile of one's own is refused all the same


def test_a_wheel_build_does_not_share_its_partial_file_with_another(tmp_path, monkeypatch):
    """Two builders of one source digest (two deploys at once, or a fleet's boards each building after the
    up-front build failed) wrote the same fixed ``<wheel>.partial``: one could replace the other's half-copied
    file into place, or find it gone. Another builder's partial file (a directory here, so that the clash is
    certain) is left alone, and no partial file of this build is left behind."""
    from edgesdk.deploy import install

    root = tiny_checkout(tmp_path / "checkout")
    digest = install.source_digest(root)
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    target = install.cache_dir() / digest[:24]
    other = target / "edgesdk-0.1.0-py3-none-any.whl.partial"
    other.mkdir(parents=True)
    wheel = install.build_wheel(root, digest)
    assert wheel.name == "edgesdk-0.1.0-py3-none-any.whl"
    import zipfile
    assert "edgesdk/__init__.py" in zipfile.ZipFile(wheel).namelist()
    assert sorted(path.name for path in target.iterdir()) == [wheel.name, other.name]
