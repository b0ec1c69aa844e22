"""Small leads 60: a fleet's ``deploy --json`` gives every board's object the same keys, whether it finished or not
(real sshd, real threads); a Gemma 3 bundle whose context is shorter than its model's sliding window exports as GGUF
with the model's window where the manifest records it, and says so where it does not."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.deploy import fleet
from edgesdk.deploy.transport import DeployError

FLEET_KEYS = ["host", "remote_root", "ok", "state", "error", "fix", "refused", "release", "seconds"]


def _boards(*hosts):
    return [fleet.FleetBoard(host=host, origin=f"--host {host}") for host in hosts]


def test_the_json_of_a_board_that_finished_and_of_one_that_failed_have_the_same_keys():
    """A finished board's object had the result's keys with host and ok; a failed one's state, error, fix, release
    and seconds instead: a script reading either had to know which it was. Both now carry all of them."""
    def work(board, report, progress):
        if board.host == "b2":
            raise DeployError("cannot reach b2", "check that the board is powered")
        return {"where": board.host, "bundle_id": "r1", "seconds": 1.5}, "r1"

    outcomes, stopped = fleet.run_fleet(_boards("b1", "b2"), work, lambda board: None, fleet.Console(lambda line: None))
    assert not stopped
    done, failed = fleet.json_entries(outcomes, ["where", "bundle_id", "previous", "seconds"])
    assert list(done) == list(failed) == ["where", "bundle_id", "previous", "seconds", *FLEET_KEYS[:-1]]
    assert done == {"where": "b1", "bundle_id": "r1", "previous": None, "seconds": 1.5, "host": "b1",
                    "remote_root": None, "ok": True, "state": "ok", "error": None, "fix": None, "refused": False,
                    "release": "r1"}
    assert {key: failed[key] for key in ("where", "bundle_id", "previous", "host", "ok", "state", "error", "fix")} == {
        "where": None, "bundle_id": None, "previous": None, "host": "b2", "ok": False, "state": "failed",
        "error": "cannot reach b2", "fix": "check that the board is powered"}
    assert isinstance(failed["seconds"], float)  # the board's own time, where its result has none


def test_a_fleet_deploy_whose_boards_all_failed_still_carries_a_deploy_s_keys(tmp_path, tiny_bundle):
    """With no board finished, no result names the keys: the deploy's own (DeployResult's) are there, null."""
    from dataclasses import fields

    from edgesdk.deploy.orchestrate import DeployResult

    spy = tmp_path / "ssh.py"
    spy.write_text("import sys\nsys.stderr.write('ssh: connect to host b1 port 22: Connection refused\\n')\n"
                   "sys.exit(255)\n")
    bundle = tiny_bundle.path  # verified once before any board: only the boards fail
    result = CliRunner().invoke(main, ["deploy", str(bundle), "--host", "pi@b1", "--host", "pi@b2", "--json",
                                       "--no-install", "--ssh-command", f"{sys.executable} {spy}"],
                                prog_name="edgesdk")
    assert result.exit_code == 1, result.output
    listed = json.loads(result.stdout)
    names = [item.name for item in fields(DeployResult)]
    assert [list(item) for item in listed] == [names + FLEET_KEYS[:-2] + ["release"]] * 2  # seconds among names
    assert [(item["host"], item["ok"], item["state"], item["bundle_id"]) for item in listed] == [
        ("pi@b1", False, "failed", None), ("pi@b2", False, "failed", None)]


def fleet_status_of_a_live_and_an_off_board(ssh_server, root):
    """``deploy --status --json`` of the real sshd's board (deploy root ``root``) and of one that is off (a free
    port): the CLI's result and the off board's destination."""
    from tests._utils.sshd import free_port

    dead = f"{ssh_server.user}@127.0.0.1:{free_port()}"
    result = CliRunner().invoke(main, ["deploy", "--status", "--json", "--host", ssh_server.destination, "--host",
                                       dead, "--remote-root", str(root), *ssh_server.client_args(),
                                       "--remote-python", sys.executable], prog_name="edgesdk")
    return result, dead


def test_a_fleet_status_json_gives_a_live_board_and_an_unreachable_one_the_same_keys(ssh_server, tmp_path):
    """A board that answered and one that is off, through the real ssh client and sshd: one key set, the status
    keys null for the board that is off, state, error and fix null for the one that answered."""
    result, dead = fleet_status_of_a_live_and_an_off_board(ssh_server, tmp_path / "root")
    assert result.exit_code == 1, result.output
    live, off = json.loads(result.stdout)
    assert list(live) == list(off)
    assert {"where", "root", "current", "previous", "releases", *FLEET_KEYS} <= set(live)
    assert (live["ok"], live["state"], live["error"], live["fix"], live["root"]) == (
        True, "ok", None, None, str(tmp_path / "root"))
    assert (off["ok"], off["state"], off["root"], off["current"], off["releases"]) == (
        False, "failed", None, None, None)
    assert f"cannot reach {dead}" in off["error"]


def test_the_keys_a_fleet_gives_every_board_are_those_of_a_status_and_a_rollback(tiny_bundle, tmp_path):
    """STATUS_KEYS and ROLLBACK_KEYS (null for a board that did not finish) are the keys status() and rollback()
    return, so that a failed board's object names the same keys as a finished one's."""
    from edgesdk.deploy.releases import ROLLBACK_KEYS, STATUS_KEYS, rollback, status
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from tests._utils.deploy import bundle_variant, edgesdk

    root = tmp_path / "root"
    assert set(status(DeployOptions(to=root))) == set(STATUS_KEYS)
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    for path in (tiny_bundle.path, second.path):
        deployed = edgesdk("deploy", path, "--to", root)
        assert deployed.returncode == 0, deployed.stderr
    back = rollback(DeployOptions(to=root), report=Reporter(total=4, prefix="rollback", write=lambda line: None))
    assert list(back) == list(ROLLBACK_KEYS)


LAYERS = 7
WINDOW, CONTEXT = 128, 64  # the build's context (tests/_utils/builds.py), shorter than the model's window


@pytest.fixture(scope="module")
def long_window_bundle(tmp_path_factory):
    """A Gemma 3 bundle laid out as llama.cpp's gemma3 (tests/unit/test_gemma3_gguf.py) whose window is longer
    than its context: its graph slides over no window."""
    pytest.importorskip("torch")
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("gemma3")
    model_dir = save_tiny_model_dir(
        root / "model", model_type="gemma3_text", hidden=64, heads=4, kv_heads=2, head_dim=32, layers=LAYERS,
        intermediate=128, vocab_size=384, tokenizer="gemma",
        config_overrides={"sliding_window": WINDOW, "query_pre_attn_scalar": 32,
                          "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention"
                                          for i in range(LAYERS)]})
    bundle = build_tiny_bundle(root, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    assert bundle.manifest["graph"]["max_context"] == CONTEXT
    return bundle


def _with_model_facts(source, destination, **facts):
    """``source``'s files in a new bundle whose manifest's model.after has ``facts`` too (a fact given as None:
    without that key)."""
    from edgesdk.bundle import BundleWriter

    writer = BundleWriter(destination)
    for name in source.manifest["files"]:
        writer.add_file(source.path / name, name)
    body = {key: value for key, value in source.manifest.items()
            if key not in ("schema_version", "edgesdk_version", "created", "files", "bundle_id")}
    after = {key: value for key, value in {**body["model"]["after"], **facts}.items() if value is not None}
    body["model"] = {**body["model"], "after": after}
    return writer.commit(body)


def _window(path) -> int:
    from gguf import GGUFReader

    return GGUFReader(str(path)).fields["gemma3.attention.sliding_window"].contents()


def test_a_gemma3_bundle_whose_manifest_records_the_window_exports_the_model_s_window(long_window_bundle, tmp_path):
    """The graph holds no window (the model's is longer than the context), so the export wrote the context as the
    window: llama.cpp run with a longer context slid over 64 tokens where the model slides over 128."""
    from edgesdk.export.gguf_export import export_gguf

    bundle = _with_model_facts(long_window_bundle, tmp_path / "recorded", sliding_window=WINDOW)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export_gguf(bundle.path, tmp_path / "model.gguf")
    assert _window(report.path) == WINDOW
    assert not [w for w in caught if "sliding window" in str(w.message)]


def test_a_gemma3_bundle_that_does_not_record_the_window_exports_the_context_and_says_so(long_window_bundle,
                                                                                        tmp_path):
    """A bundle without 'model.after.sliding_window' (built before it was recorded) exports as before, with a
    warning naming the window written, why, and what to do."""
    from edgesdk.export.gguf_export import export_gguf

    bundle = _with_model_facts(long_window_bundle, tmp_path / "older", sliding_window=None)
    with pytest.warns(UserWarning, match="does not record its model's sliding window") as caught:
        report = export_gguf(bundle.path, tmp_path / "model.gguf")
    assert _window(report.path) == CONTEXT
    note = next(str(w.message) for w in caught if "sliding window" in str(w.message))
    assert f"gemma3.attention.sliding_window is written as {CONTEXT}" in note
    assert f"run llama.cpp with -c {CONTEXT} at most" in note


@pytest.mark.parametrize("value", ["128", 0, 2.5, True])
def test_a_manifest_whose_recorded_window_is_not_a_whole_number_is_refused(long_window_bundle, tmp_path, value):
    from edgesdk.errors import BundleError

    with pytest.raises(BundleError, match="'model.after.sliding_window' must be a whole number"):
        _with_model_facts(long_window_bundle, tmp_path / "bad", sliding_window=value)


def test_a_gemma3_build_records_the_model_s_window_and_its_gguf_carries_it(long_window_bundle, tmp_path):
    """The build itself records the window (edgesdk/models/loader.py facts), so a bundle built now exports the
    model's window with no warning."""
    from edgesdk.export.gguf_export import export_gguf

    assert long_window_bundle.manifest["model"]["after"]["sliding_window"] == WINDOW
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export_gguf(long_window_bundle.path, tmp_path / "model.gguf")
    assert _window(report.path) == WINDOW
    assert not [w for w in caught if "sliding window" in str(w.message)]


def test_a_llama_build_records_no_window(tiny_bundle):
    """Only Gemma 3's window is recorded: other configs may carry one they do not use."""
    assert "sliding_window" not in tiny_bundle.manifest["model"]["after"]
