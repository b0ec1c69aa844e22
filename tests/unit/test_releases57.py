"""``edgesdk deploy --status`` / ``--rollback`` (edgesdk/deploy/releases.py) on a root that does not exist or a
release that cannot be switched to, and ``edgesdk engine build``'s refusals of what it cannot build
(edgesdk/cli_engine.py, edgesdk/runtime/tensorrt_engine.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.deploy.releases import rollback, status
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te


def test_status_of_a_root_that_does_not_exist_says_so(tmp_path):
    """A mistyped root read as an empty one ("releases 0"); it is shown as one that does not exist, a state (a
    fleet's status and scripts ask it of boards not deployed to yet), with the status's exit 0."""
    from edgesdk.deploy.releases import format_status

    missing = tmp_path / "sdcrad"  # a typo of the deploy root
    info = status(DeployOptions(to=missing))
    assert (info["root_exists"], info["releases"], info["current"]) == (False, [], None)
    assert f"root       {missing} (does not exist: nothing was deployed there)" in format_status(info)
    assert not missing.exists()  # --status makes nothing
    result = CliRunner().invoke(main, ["deploy", "--status", "--to", str(missing)])
    assert result.exit_code == 0, result.output
    assert "does not exist: nothing was deployed there" in result.output


def test_rollback_in_a_root_that_does_not_exist_names_the_root_not_a_missing_previous(tmp_path):
    missing = tmp_path / "sdcrad"
    with pytest.raises(DeployError) as caught:
        rollback(DeployOptions(to=missing), report=Reporter(total=4, prefix="rollback", write=lambda line: None))
    assert str(missing) in caught.value.problem
    assert "previous" not in caught.value.problem


def test_status_of_an_empty_root_still_lists_no_releases(tmp_path):
    info = status(DeployOptions(to=tmp_path))
    assert (info["releases"], info["current"]) == ([], None)


def test_a_refused_rollback_prints_no_done_line_before_its_error(tmp_path):
    lines: list[str] = []
    with pytest.raises(DeployError, match="--release 'zzz' is not a release"):
        rollback(DeployOptions(to=tmp_path), "zzz", Reporter(total=4, prefix="rollback", write=lines.append))
    assert not any("done in" in line for line in lines), lines
    assert "failed after" in lines[-1]


@pytest.mark.parametrize("option", ["--out", "--timing-cache"])
def test_engine_build_refuses_an_empty_path_as_it_parses(tmp_path, option):
    """'' is '.' to pathlib: --out '' built into the working directory, and --timing-cache '' failed with a
    ValueError on saving the cache once the engine was built (before it was written)."""
    result = CliRunner().invoke(main, ["engine", "build", str(tmp_path), option, ""])
    assert result.exit_code == 2, result.output
    assert "an empty path names no" in result.output
    assert option in result.output


def test_engine_build_refuses_a_workspace_no_gpu_has(tmp_path):
    result = CliRunner().invoke(main, ["engine", "build", str(tmp_path), "--workspace-mb", str(1 << 45)])
    assert result.exit_code == 2, result.output
    assert "--workspace-mb" in result.output


GRAPH = {"max_context": 64, "head_dim": 8, "kv_heads": [2, 2]}


def test_max_seq_above_max_context_is_refused_not_cut():
    with pytest.raises(RuntimeBackendError) as caught:
        te.profile_shapes(GRAPH, max_seq=65)
    assert "--max-seq 65" in caught.value.problem
    assert "max_context 64" in caught.value.problem
    assert "--max-seq 64 or less" in caught.value.fix
    assert te.profile_shapes(GRAPH, max_seq=64).max_seq == 64
    assert te.profile_shapes(GRAPH).max_seq == 64  # the default (512) is still cut to max_context


@pytest.mark.parametrize(("remote_root", "default"), [("~/edgesdk", True), ("/data/edgsdk", False)])
def test_a_missing_default_remote_root_is_not_called_a_typo(remote_root, default):
    """Without --remote-root the root is the default ~/edgesdk: the fix said to check the --remote-root path for a
    typo, a path nobody typed."""
    from types import SimpleNamespace

    from edgesdk.deploy.releases import require_root

    facts = SimpleNamespace(raw={"root_exists": False}, root="/home/pi/" + remote_root.rsplit("/", 1)[-1])
    with pytest.raises(DeployError) as caught:
        require_root(SimpleNamespace(label="pi@board"), facts, DeployOptions(host="pi@board", remote_root=remote_root))
    assert f"the deploy root {facts.root} on pi@board (" in caught.value.problem
    assert "does not exist: nothing was deployed there" in caught.value.problem
    assert ("the default ~/edgesdk: no --remote-root given" in caught.value.problem) == default
    assert ("typo" in caught.value.fix) != default
    assert "--remote-root" in caught.value.fix


@pytest.mark.parametrize(("args", "inventory", "default"), [
    ([], None, True),
    (["--remote-root", "~/edgesdk"], None, False),
    ([], "pi@board remote_root=~/edgesdk\npi@other\n", False),
])
def test_a_remote_root_given_as_the_default_path_is_not_called_not_given(tmp_path, monkeypatch, args, inventory,
                                                                          default):
    """Whether --remote-root was given was told by its value: --remote-root '~/edgesdk', typed, or an inventory's
    remote_root=~/edgesdk was refused with "no --remote-root given", and told to pass the option it had passed; and a
    root from an inventory line was blamed on --remote-root, which was not passed."""
    from types import SimpleNamespace

    from edgesdk.deploy import releases

    def open_board(options):
        root = "/home/pi/" + options.remote_root.rsplit("/", 1)[-1]
        return SimpleNamespace(label=options.host, root=root, transport=SimpleNamespace(close=lambda: None))

    monkeypatch.setattr(releases, "open_board", open_board)
    monkeypatch.setattr(releases, "probe", lambda board, *rest: SimpleNamespace(raw={"root_exists": False},
                                                                                 root=board.root))
    if inventory is None:
        where = ["--host", "pi@board"]
    else:
        (tmp_path / "boards.txt").write_text(inventory)
        where = ["--hosts", str(tmp_path / "boards.txt"), "--limit", "pi@board"]
    result = CliRunner().invoke(main, ["deploy", *where, *args, "--rollback"])
    assert result.exit_code != 0
    assert "/home/pi/edgesdk on pi@board" in result.output
    assert "does not exist" in result.output
    assert ("no --remote-root given" in result.output) == default
    if inventory is None:
        assert ("typo" in result.output) != default
    else:  # the root came from the inventory line, not from an option that was never passed
        named = f"remote_root= in {tmp_path / 'boards.txt'}"
        assert f"/home/pi/edgesdk on pi@board ({named}) does not exist" in result.output
        assert f"check the path of {named} for a typo" in result.output
        assert "--remote-root" not in result.output
