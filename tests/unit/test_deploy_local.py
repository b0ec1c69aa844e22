"""``edgesdk deploy --to DIR``: the same release, switch and rollback logic without ssh; CLI argument checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests._utils.deploy import bundle_variant, current_id, edgesdk


def test_cli_deploy_module_is_lean(tmp_path):
    code = textwrap.dedent("""
        import json, sys
        import edgesdk.cli
        print(json.dumps(sorted(m for m in sys.modules if m.startswith(("edgesdk.deploy", "onnxruntime", "torch")))))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert json.loads(proc.stdout) == []


def test_argument_errors_name_the_fix(tmp_path):
    runner = CliRunner()
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = [
        (["deploy", str(tmp_path)], "exactly one of --host"),
        (["deploy", str(tmp_path), "--host", "b", "--to", str(tmp_path)], "exactly one of --host"),
        (["deploy", "--to", str(tmp_path)], "no BUNDLE given"),
        (["deploy", str(tmp_path), "--status", "--to", str(tmp_path)], "take no BUNDLE"),
        (["deploy", str(tmp_path), "--to", str(afile)], "is a file; it must be a directory"),
    ]
    for args, expected in cases:
        result = runner.invoke(main, args)
        assert result.exit_code == 8, (args, result.output)
        assert expected in result.output
        assert "fix:" in result.output
    alone = runner.invoke(main, ["deploy", "--to", str(tmp_path), "--release", "abc"])
    assert alone.exit_code == 2
    assert "pass --rollback with it" in alone.output


def test_a_host_that_looks_like_an_option_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["deploy", str(tmp_path), "--host", f"-oProxyCommand=touch {tmp_path}/pwned"])
    assert result.exit_code != 0
    assert not (tmp_path / "pwned").exists()


def test_local_deploy_redeploy_and_rollback(tiny_bundle, tmp_path):
    root = tmp_path / "dir"
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")
    assert first.returncode == 0, first.stderr
    assert "[7/8] smoke test" in first.stderr
    assert json.loads(first.stdout)["bytes_sent"] > 0
    again = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")
    assert json.loads(again.stdout)["bytes_sent"] == 0

    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    assert edgesdk("deploy", second.path, "--to", root).returncode == 0
    assert current_id(root) == second.bundle_id
    back = edgesdk("deploy", "--rollback", "--to", root)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert os.readlink(root / "previous") == f"releases/{second.bundle_id}"
    for wrong in ("../x", "0123456789abcdef"):
        refused = edgesdk("deploy", "--rollback", "--release", wrong, "--to", root)
        assert refused.returncode == 8
        assert f"--release {wrong!r} is not a release" in refused.stderr
        assert "deploy --status" in refused.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    status = edgesdk("deploy", "--status", "--to", root)
    assert f"* {tiny_bundle.bundle_id}" in status.stdout
    ran = edgesdk("run", root / "current", "--prompt", "hi", "-n", 4, "--raw")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()


@pytest.mark.parametrize("name", ["b.tar", "smollm.bundle"])  # pack writes a plain tar under any other name
def test_deploy_accepts_a_packed_bundle(tiny_bundle, tmp_path, name):
    archive = tmp_path / name
    assert edgesdk("pack", tiny_bundle.path, archive).returncode == 0
    proc = edgesdk("deploy", archive, "--to", tmp_path / "dir")
    assert proc.returncode == 0, proc.stderr
    assert current_id(tmp_path / "dir") == tiny_bundle.bundle_id


def test_the_memory_check_counts_entropy_coded_weights_at_their_inflated_size(tmp_path):
    """The board holds a zlib weights file inflated; its bytes on disk would pass any budget."""
    import zlib

    from edgesdk.bundle import BundleWriter
    from edgesdk.profile import get_profile

    inflated = 20_000_000_000  # more than the host profile's 12000 MB budget
    writer = BundleWriter(tmp_path / "coded")
    writer.write_text("model.onnx", "graph")
    (writer.staging / "model.onnx.data.zlib").write_bytes(zlib.compress(b"\0" * 1000))
    writer.write_text("tokenizer.json", "{}")
    bundle = writer.commit({
        "target": get_profile("host").summary(), "model": {}, "tokenizer": {"file": "tokenizer.json"},
        "graph": {"file": "model.onnx", "weights": {"file": "model.onnx.data.zlib", "codec": "zlib",
                                                    "external_name": "model.onnx.data", "bytes": inflated,
                                                    "sha256": "0" * 64}},
        "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1}, "stages": []})
    root = tmp_path / "dir"
    proc = edgesdk("deploy", bundle.path, "--to", root)
    assert proc.returncode == 8, proc.stderr
    assert "the bundle takes 20000 MB in memory, more than the 12000 MB memory budget" in proc.stderr
    assert "fix:" in proc.stderr
    assert not (root / "releases").exists()


def test_the_run_command_in_the_summary_carries_ignore_target(tiny_bundle, tmp_path):
    """A bundle deployed with --ignore-target (built for another board) is refused by a plain 'edgesdk run'
    on that board; the smoke test passed the flag, the printed command left it out."""
    import shlex

    bundle = bundle_variant(tiny_bundle.path, tmp_path / "pi", "for a pi", target="rpi5")
    proc = edgesdk("deploy", bundle.path, "--to", tmp_path / "dir", "--ignore-target")
    assert proc.returncode == 0, proc.stderr
    command = shlex.split(proc.stdout.split("run it on the board: ", 1)[1].strip())
    assert command[command.index("run"):] == ["run", str(tmp_path / "dir" / "current"), "--ignore-target"]
    plain = edgesdk("deploy", tiny_bundle.path, "--to", tmp_path / "host")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.rstrip().endswith(f"run {tmp_path / 'host' / 'current'}")


def test_summary_names_a_local_root_once(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    result = edgesdk("deploy", tiny_bundle.path, "--to", root)
    assert result.returncode == 0, result.stderr
    summary = next(line for line in result.stdout.splitlines() if line.startswith("deployed bundle"))
    assert f"to local directory {root} in " in summary
    assert summary.count(str(root)) == 1
