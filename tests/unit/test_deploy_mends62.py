"""Mends from a last read of the deploy changes, 62.

The first ``deploy --status`` after an upgrade named a deploy killed on every board an older edgesdk last deployed to
(it left its bare process id in ``.deploy.lock`` after every deploy). A failed install step's stderr was shown as one
repr() line cut to 1000 characters. The site-packages refusal left the half-made venv, and a venv Python that failed
was passed over in silence. ``--status`` counted a runtime stamp without a version as finished, which the install
does not reuse. ``fmt_bytes(10**400)`` raised OverflowError. ``env`` handed a logger to TensorRT in the caller's
process and dropped it, where TensorRT keeps the first logger it is given.

The board helper's functions run for real against directories under tmp_path; ``deploy --status`` is the real CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from edgesdk.deploy import board_transfer
from edgesdk.deploy.board_common import (
    HOLDER_MARK,
    Lock,
    Refused,
    lock_state,
    paths,
    read_stamp,
    release_list,
    runtime_finished,
    unfinished_runtimes,
)
from edgesdk.deploy.board_install import inherit_site_packages, op_install, printed, read_answer
from edgesdk.deploy.report import fmt_bytes
from edgesdk.envinfo import tensorrt_check
from tests._utils.deploy import edgesdk
from tests.unit.test_small_refusals62 import _fake_python, needs_venv

# --- the lock record an older edgesdk left ------------------------------------------------------------------------


def test_a_bare_process_id_left_by_an_older_edgesdk_is_no_killed_deploy(tmp_path):
    root = tmp_path / "board"
    root.mkdir()
    (root / ".deploy.lock").write_text("4242")  # an older edgesdk never emptied the file
    assert lock_state(str(root)) is None
    assert "lock" not in release_list(paths(str(root))[0])
    shown = edgesdk("deploy", "--status", "--to", root)
    assert shown.returncode == 0, shown.stderr
    assert "lock " not in shown.stdout, shown.stdout
    assert "4242" not in shown.stdout


def test_a_marked_record_no_deploy_holds_names_the_deploy_killed(tmp_path):
    root = tmp_path / "board"
    root.mkdir()
    (root / ".deploy.lock").write_text(HOLDER_MARK + "4242 from 10.0.0.5")
    assert lock_state(str(root)) == {"held": False, "holder": "4242 from 10.0.0.5"}


def test_the_lock_writes_its_holder_marked_and_empties_the_file_when_it_ends(tmp_path):
    root = tmp_path / "board"
    with Lock(str(root)):
        assert (root / ".deploy.lock").read_text().startswith(f"{HOLDER_MARK}{os.getpid()}")
    assert (root / ".deploy.lock").read_text() == ""
    assert lock_state(str(root)) is None


# --- what a failed step printed ----------------------------------------------------------------------------------


def test_a_failed_step_shows_its_stderr_as_indented_lines_its_last_2500_characters(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('x' * 3000 + chr(10)); "
                                  "raise ImportError('no module named edgesdk')"]
    with pytest.raises(Refused) as caught:
        read_answer(argv, 2, None, "import edgesdk in the new runtime", "edgesdk version and file on two lines",
                    "report this", str(venv))
    problem = caught.value.problem
    assert "failed on the board (exit 1)" in problem
    assert "printed:\n  on stdout: nothing\n  on stderr (its last 2500 characters):\n" in problem
    assert "\n    Traceback (most recent call last):\n" in problem
    assert problem.endswith("\n    ImportError: no module named edgesdk")
    assert "\\n" not in problem.split(" printed:", 1)[1]  # real lines, not repr()
    stderr_shown = problem.split("on stderr (its last 2500 characters):\n", 1)[1]
    assert len("\n".join(line[4:] for line in stderr_shown.splitlines())) == 2500
    assert not venv.exists()


def test_printed_keeps_a_short_stream_whole():
    assert printed("1.2.3\n", "") == "  on stdout:\n    1.2.3\n  on stderr: nothing"
    assert printed("", "a\n\n  b\n") == "  on stdout: nothing\n  on stderr:\n    a\n\n      b"


# --- the site-packages refusal -----------------------------------------------------------------------------------


@needs_venv
def test_a_venv_python_that_fails_is_refused_and_the_venv_removed(tmp_path):
    venv = _fake_python(tmp_path, "echo 'Fatal Python error: init_fs_encoding' >&2\nexit 1\n")
    with pytest.raises(Refused) as caught:
        inherit_site_packages(venv)
    problem = caught.value.problem
    assert "the new runtime's Python failed (exit 1)" in problem
    assert "a JSON list of its site-packages directories was expected" in problem
    assert "  on stderr:\n    Fatal Python error: init_fs_encoding" in problem
    assert "--runtime-venv-system-site-packages" in caught.value.fix
    assert not os.path.exists(venv)


@needs_venv
def test_a_venv_python_that_names_no_site_packages_leaves_no_venv(tmp_path):
    venv = _fake_python(tmp_path, "echo 'Python 3.12 is not configured'\n")
    with pytest.raises(Refused, match="did not name its site-packages directory"):
        inherit_site_packages(venv)
    assert not os.path.exists(venv)


# --- one test of a finished runtime ------------------------------------------------------------------------------


def _runtime(root, key, stamp):
    folder = root / "runtime" / key
    folder.mkdir(parents=True)
    if stamp is not None:
        (folder / "edgesdk-runtime.json").write_text(json.dumps(stamp))
    return folder


def test_a_stamp_without_a_version_is_unfinished_everywhere(tmp_path):
    root = tmp_path / "board"
    _runtime(root, "done", {"key": "done", "version": "0.9.0"})
    _runtime(root, "noversion", {"key": "noversion"})
    _runtime(root, "list", ["not", "a", "stamp"])
    _runtime(root, "none", None)
    p = paths(str(root))[0]
    assert unfinished_runtimes(p) == ["list", "none", "noversion"]
    assert board_transfer.runtime_facts(p)["installed"] == ["done"]
    assert read_stamp(str(root / "runtime" / "list")) is None
    assert [runtime_finished(read_stamp(str(root / "runtime" / key))) for key in ("done", "noversion")] == \
        [True, False]
    assert board_transfer.read_stamp is read_stamp  # the probe, the install and --status read it one way
    reused = op_install({"root": str(root), "key": "done", "pip_spec": "edgesdk"})
    assert reused == {"key": "done", "version": "0.9.0", "reused": True}
    from edgesdk.deploy.board_common import Refused
    from edgesdk.deploy.board_ops import switch_runtime

    with pytest.raises(Refused, match="runtime noversion is not installed on the board"):
        switch_runtime(p, "noversion")  # a stamp without its version: an install a kill cut short


def test_a_pipe_at_a_stamp_is_not_read(tmp_path):
    root = tmp_path / "board"
    folder = _runtime(root, "k", None)
    os.mkfifo(folder / "edgesdk-runtime.json")
    # in a Python of its own: a read of the pipe would block until the timeout
    probe = textwrap.dedent("""
        import json, sys
        from edgesdk.deploy.board_common import paths
        from edgesdk.deploy.board_transfer import runtime_facts
        facts = runtime_facts(paths(sys.argv[1])[0])
        print(json.dumps([facts["stamp"], facts["installed"]]))
    """)
    done = subprocess.run([sys.executable, "-c", probe, str(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [None, []]
    assert unfinished_runtimes(paths(str(root))[0]) == ["k"]


# --- fmt_bytes of an int past a float's range --------------------------------------------------------------------


def test_fmt_bytes_shows_an_int_too_large_for_a_float_as_its_bytes():
    assert fmt_bytes(10**400) == "1" + "0" * 400 + " B"
    assert fmt_bytes(-(10**400)) == "-1" + "0" * 400 + " B"
    assert fmt_bytes(10**12) == "1000.00 GB"


# --- env's builder check leaves this process's TensorRT without a logger -----------------------------------------

STAND_IN = '''\
import os

__version__ = "10.3.0"
LOGGERS = []  # what TensorRT keeps: the loggers handed to it in this process


class ILogger:
    class Severity:
        INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self):
        pass


class Builder:
    def __init__(self, logger):
        LOGGERS.append(logger)
        with open({pids!r}, "a") as handle:
            handle.write(str(os.getpid()) + "\\n")
        {body}
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    def write(body: str):
        folder = tmp_path / "stand-in"
        (folder / "tensorrt").mkdir(parents=True)
        pids = tmp_path / "builder-pids"
        (folder / "tensorrt" / "__init__.py").write_text(STAND_IN.format(pids=str(pids), body=body))
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
        return folder / "tensorrt" / "__init__.py", pids
    yield write
    sys.modules.pop("tensorrt", None)


def test_the_builder_check_gives_no_logger_to_this_processs_tensorrt(stand_in):
    module, pids = stand_in("pass")
    assert tensorrt_check("10.3.0", None) == (True, f"Python module 10.3.0 ({module}); a builder was created")
    import tensorrt

    assert tensorrt.LOGGERS == []  # a later engine build here gives TensorRT its own logger first
    made_in = [int(pid) for pid in pids.read_text().split()]
    assert len(made_in) == 1
    assert made_in[0] != os.getpid()


def test_a_builder_check_that_dies_says_so(stand_in):
    module, _ = stand_in("import sys; sys.stderr.write('Segmentation fault in libnvinfer' + chr(10)); os._exit(139)")
    usable, said = tensorrt_check("10.3.0", None)
    assert usable is False
    assert said.startswith(f"Python module 10.3.0 ({module}), but the builder check ({sys.executable} -c ...) ended "
                           "with exit 139 and no answer (Segmentation fault in libnvinfer)")
