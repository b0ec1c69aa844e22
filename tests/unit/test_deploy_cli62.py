"""Deploy command, 62: the ssh port as ``-p/--port`` (as ssh takes it), the summary of a redeploy that found the
live release damaged and replaced it, and a rollback into a local directory naming it once.

``edgesdk deploy B --host root@board -p 2222`` was "No such option '-p'": only USER@BOARD:PORT gave the port. A
redeploy whose release on the board was damaged replaced it (said mid-output) and then summed up "already was
current, so nothing was switched". ``deploy --rollback --to DIR`` said "rolled back local directory DIR (DIR)".

Deploys run into a real board root (``--to DIR``, the real board helper) or over ssh to the real local sshd of
tests/_utils/sshd.py."""

from __future__ import annotations

import json

import pytest

from edgesdk.deploy.orchestrate import DeployResult
from tests._utils.deploy import bundle_variant, current_id, edgesdk

# --- the ssh port as -p / --port -------------------------------------------------------------------------------


def _ssh_status(ssh_server, *host_args):
    return edgesdk("deploy", "--status", *host_args, "--remote-root", "~/edgesdk-port62", *ssh_server.client_args())


def test_dash_p_gives_the_ssh_port_of_the_board(ssh_server):
    bare = f"{ssh_server.user}@127.0.0.1"
    for option in ("-p", "--port"):
        shown = _ssh_status(ssh_server, "--host", bare, option, ssh_server.port)
        assert shown.returncode == 0, shown.stderr
        assert f"board      {bare}:{ssh_server.port} " in shown.stdout, shown.stdout
    same = _ssh_status(ssh_server, "--host", ssh_server.destination, "-p", ssh_server.port)
    assert same.returncode == 0, same.stderr
    assert "-p" not in same.stderr  # the port given both ways, alike: no warning


def test_a_port_given_both_ways_with_different_values_is_refused(tmp_path):
    refused = edgesdk("deploy", tmp_path / "b", "--host", "pi@board.invalid:2222", "-p", "2200")
    assert refused.returncode == 2
    assert "--host pi@board.invalid:2222" in refused.stderr
    assert "port 2200, and --host pi@board.invalid:2222 gives port 2222" in refused.stderr
    assert "--host pi@board.invalid -p 2200" in refused.stderr, refused.stderr
    assert "--host pi@board.invalid:2222" in refused.stderr


def test_a_port_out_of_range_is_refused(tmp_path):
    refused = edgesdk("deploy", tmp_path / "b", "--host", "pi@board.invalid", "-p", "70000")
    assert refused.returncode == 2
    assert "Invalid value for '--port' / '-p': 70000 is not in the range 1<=x<=65535" in refused.stderr, \
        refused.stderr


def test_a_port_beside_a_fleet_is_refused_saying_where_each_port_goes(tmp_path):
    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@a.invalid\npi@b.invalid:2200\n", encoding="utf-8")
    for fleet in (["--hosts", inventory], ["--host", "pi@a.invalid", "--host", "pi@b.invalid"]):
        refused = edgesdk("deploy", tmp_path / "b", *fleet, "-p", "2222")
        assert refused.returncode == 2, refused.stderr
        assert "Invalid value for -p/--port: 2222 is the ssh port of one board" in refused.stderr, refused.stderr
        assert "put it after the board on its --host or inventory line (pi@board:2222" in refused.stderr


def test_a_port_beside_to_dir_is_refused(tmp_path):
    refused = edgesdk("deploy", tmp_path / "b", "--to", tmp_path / "root", "-p", "2222")
    assert refused.returncode == 2
    assert "Invalid value for -p/--port: works only with --host" in refused.stderr, refused.stderr


def test_help_names_the_port_option():
    shown = edgesdk("deploy", "--help")
    assert "-p, --port N" in shown.stdout, shown.stdout


# --- a damaged live release, replaced by the redeploy ----------------------------------------------------------


def _damage(root, bundle_id):
    release = root / "releases" / bundle_id
    damaged = next(p for p in sorted(release.rglob("*")) if p.is_file() and p.name != "manifest.json"
                   and p.stat().st_size > 0)
    data = bytearray(damaged.read_bytes())
    data[0] ^= 0xFF
    damaged.chmod(0o644)
    damaged.write_bytes(bytes(data))
    return damaged


def test_a_redeploy_that_replaced_a_damaged_current_release_says_so(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = edgesdk("deploy", tiny_bundle.path, "--to", root)
    assert first.returncode == 0, first.stderr
    _damage(root, tiny_bundle.bundle_id)

    again = edgesdk("deploy", tiny_bundle.path, "--to", root)

    assert again.returncode == 0, again.stderr
    assert f"releases/{tiny_bundle.bundle_id} on the board is damaged (" in again.stderr, again.stderr
    summary = again.stdout
    assert "so nothing was switched" not in summary
    assert (f"releases/{tiny_bundle.bundle_id} already was current and was damaged on the board (") in summary
    assert ("sha256 differs from the manifest), so it was repaired (its bad files sent again, and every sha256 "
            "checked on the board) and current was not switched: current -> "
            f"releases/{tiny_bundle.bundle_id} (no previous release") in summary, summary
    assert current_id(root) == tiny_bundle.bundle_id

    damaged = _damage(root, tiny_bundle.bundle_id)
    as_json = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    assert result["switched"] is False
    rel = damaged.relative_to(root / "releases" / tiny_bundle.bundle_id).as_posix()
    assert result["repaired"] == f"{rel}: sha256 differs from the manifest", result
    sound = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")
    assert json.loads(sound.stdout)["repaired"] == ""


def test_a_damaged_release_that_is_switched_to_says_it_was_replaced(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    for bundle in (tiny_bundle, older):
        done = edgesdk("deploy", bundle.path, "--to", root)
        assert done.returncode == 0, done.stderr
    _damage(root, tiny_bundle.bundle_id)

    back = edgesdk("deploy", tiny_bundle.path, "--to", root)

    assert back.returncode == 0, back.stderr
    summary = back.stdout
    assert (f"releases/{tiny_bundle.bundle_id} was damaged on the board (") in summary, summary
    assert ("sha256 differs from the manifest) and was repaired (its bad files sent again, and every sha256 checked "
            f"on the board); current -> releases/{tiny_bundle.bundle_id} (previous: {older.bundle_id}") in summary


@pytest.mark.parametrize("runtime", ["", "py3.10-venv"])
def test_the_summary_of_a_repaired_release_keeps_what_else_was_switched(runtime):
    result = DeployResult(bundle_id="abc", where="pi@board", root="~/edgesdk", bytes_sent=5, files_sent=1,
                          bytes_reused=10, runtime_bytes_sent=0, seconds=1.0, previous=None, engine="", generated="",
                          switched=False, runtime_switched_to=runtime, repaired="model.onnx: sha256 mismatch")
    summary = result.summary()
    switched = "only runtime/current was switched (to py3.10-venv)" if runtime else "current was not switched"
    assert ("releases/abc already was current and was damaged on the board (model.onnx: sha256 mismatch), so it was "
            "repaired (its bad files sent again, and every sha256 checked on the board) and "
            f"{switched}: current -> releases/abc (no previous release") in summary, summary


# --- a rollback into a local directory --------------------------------------------------------------------------


def test_a_rollback_of_a_local_directory_names_it_once(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    for bundle in (older, tiny_bundle):
        done = edgesdk("deploy", bundle.path, "--to", root)
        assert done.returncode == 0, done.stderr

    back = edgesdk("deploy", "--rollback", "--to", root)

    assert back.returncode == 0, back.stderr
    assert back.stdout.startswith(f"rolled back local directory {root} from {tiny_bundle.bundle_id} to "
                                  f"{older.bundle_id}"), back.stdout
    assert back.stdout.count(str(root)) == 1
