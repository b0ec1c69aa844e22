"""Deploy's board probe, engine build and remote root: a ~//DIR root, TensorRT's log of a failed engine build, and
a board whose /proc/meminfo has no MemAvailable."""

from __future__ import annotations

import json
import os
import pwd
import sys

import pytest

from edgesdk.deploy.engine import EngineDecision, build_engine
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.session import DeployOptions, open_board, probe
from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport
from tests.unit.test_deploy_checks import GB, raw_probe


def _ssh_options(server) -> SshOptions:
    return SshOptions(identity=str(server.user_key), ssh_config="/dev/null", multiplex=False,
                      options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))


def test_a_remote_root_of_tilde_and_two_slashes_stays_in_the_home_directory(ssh_server):
    """A shell expands ~//edgesdk to HOME//edgesdk, which is HOME/edgesdk; open_board dropped the '~/' and left
    '/edgesdk', so the deploy went to a directory at the top of the board's file system."""
    name = "edgesdk misc58 'é'"
    board = open_board(DeployOptions(host=ssh_server.destination, ssh=_ssh_options(ssh_server),
                                     remote_root=f"~//{name}"))
    facts = probe(board)
    assert facts.root == os.path.join(pwd.getpwuid(os.getuid()).pw_dir, name)
    assert board.root == facts.root


BUILDER = """\
import json, sys
with open(sys.argv[1], "w") as handle:
    json.dump(sys.argv[2:], handle)
print("edgesdk engine: parsing model.onnx", file=sys.stderr)
print("[TRT] [W] Using default stream in enqueueV3() may lead to performance issues", file=sys.stderr)
print("edgesdk engine: building for sm_87 (orin-nano-8gb) with TensorRT 10.3.0", file=sys.stderr)
print("[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory", file=sys.stderr)
for step in range(12):  # progress after TensorRT's error: the stderr tail alone lost the [TRT] [E] line
    print(f"edgesdk engine: step {step}", file=sys.stderr)
print("error: TensorRT 10.3.0 failed to build an engine for model.onnx (see its log above)", file=sys.stderr)
print("  fix: try a larger --workspace-mb, or free GPU memory (stop other services)", file=sys.stderr)
sys.exit(1)
"""

# an older edgesdk on the board: TensorRT's default trt.Logger writes to stdout (NVIDIA/TensorRT#4306)
OLDER_BUILDER = """\
import sys
print("[12/06/2026-08:55:01] [TRT] [W] Using default stream in enqueueV3() may lead to performance issues")
print("[12/06/2026-08:55:02] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory")
print("edgesdk engine: building for sm_87 (orin-nano-8gb) with TensorRT 10.3.0", file=sys.stderr)
print("error: TensorRT 10.3.0 failed to build an engine for model.onnx (see its log above)", file=sys.stderr)
print("  fix: try a larger --workspace-mb, or free GPU memory (stop other services)", file=sys.stderr)
sys.exit(1)
"""

OOM = "[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory"


def test_a_failed_engine_build_shows_tensorrt_s_log_among_its_progress_lines(ssh_server, tmp_path):
    """The builder's logger writes TensorRT's log to stderr, among the 'edgesdk engine:' progress lines, and its
    error says 'see its log above'; the report kept the last 8 stderr lines, so the [TRT] [E] line that said why the
    build failed was lost when more progress lines came after it. The [TRT] lines have a budget of their own."""
    builder = tmp_path / "builder.py"
    builder.write_text(BUILDER)
    seen = tmp_path / "argv.json"
    root = tmp_path / "deploy root"
    board = Board(SshTransport(HostSpec.parse(ssh_server.destination), _ssh_options(ssh_server)), sys.executable,
                  str(root))
    release = board.path("releases", "b1 'quoted' ü")
    decision = EngineDecision(True, "building", board.path("engines", "b1 'quoted' ü", "jp6.2-trt10.3.0-sm87"))
    with pytest.raises(DeployError) as failed:
        build_engine(board, [sys.executable, str(builder), str(seen)], release, decision)
    problem = failed.value.problem
    assert "the TensorRT engine build failed on" in problem
    assert "(exit 1)" in problem
    lines = problem.splitlines()[1:]
    # TensorRT's log first, once, then the stderr tail with the builder's error line, which points 'above' to it
    assert [line.strip() for line in lines[:2]] == [
        "[TRT] [W] Using default stream in enqueueV3() may lead to performance issues", OOM]
    assert sum(OOM in line for line in lines) == 1
    assert problem.index("[TRT] [E]") < problem.index("error: TensorRT 10.3.0 failed to build")
    assert "fix: try a larger --workspace-mb" in problem
    assert "edgesdk engine: step 11" in problem
    # every argument reached the board as it was, quotes and all
    assert json.loads(seen.read_text()) == ["engine", "build", release, "--out", decision.cache_dir]


def test_a_failed_engine_build_of_an_older_board_edgesdk_shows_tensorrt_s_log_from_stdout(tmp_path):
    """An older edgesdk on the board builds with TensorRT's default trt.Logger, which writes to stdout."""
    from edgesdk.deploy.transport import LocalTransport

    builder = tmp_path / "older.py"
    builder.write_text(OLDER_BUILDER)
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    with pytest.raises(DeployError) as failed:
        build_engine(board, [sys.executable, str(builder)], board.path("releases", "b1"),
                     EngineDecision(True, "building", board.path("engines", "b1", "k")))
    problem = failed.value.problem
    assert "[12/06/2026-08:55:02] " + OOM in problem
    assert problem.index("[TRT] [E]") < problem.index("error: TensorRT 10.3.0 failed to build")
    assert "fix: try a larger --workspace-mb" in problem


def test_a_failed_engine_build_with_no_output_says_so(tmp_path):
    from edgesdk.deploy.transport import LocalTransport

    builder = tmp_path / "silent.py"
    builder.write_text("import sys\nsys.exit(3)\n")
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    with pytest.raises(DeployError) as failed:
        build_engine(board, [sys.executable, str(builder)], board.path("releases", "b1"),
                     EngineDecision(True, "building", board.path("engines", "b1", "k")))
    assert failed.value.problem.endswith("(exit 3):\n    (no output)")


def test_a_board_without_memavailable_is_not_described_as_having_no_free_memory():
    """Linux before 3.14 has no MemAvailable line in /proc/meminfo; the deploy log said '(0.0 free)'."""
    raw = raw_probe("Raspberry Pi 4 Model B Rev 1.4\x00", mem=4 * GB)
    raw["memory"] = {"MemTotal": 4 * GB}
    facts = BoardFacts.from_probe(raw)
    assert facts.mem_available is None
    text = facts.describe()
    assert "4.0 GiB RAM (free unknown)" in text
    assert "0.0 free" not in text
    raw["memory"] = {"MemTotal": 4 * GB, "MemAvailable": GB}
    assert "4.0 GiB RAM (1.0 free)" in BoardFacts.from_probe(raw).describe()
