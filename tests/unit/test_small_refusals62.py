"""Small refusals: plan's ambient range, the install's answers read from stdout alone, fmt_bytes's odd counts."""

from __future__ import annotations

import json
import math
import os
import stat
import sys

import pytest

from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.board_install import inherit_site_packages, read_answer
from edgesdk.deploy.report import fmt_bytes
from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal import AMBIENT_RANGE_C
from edgesdk.thermal.plan import Workload, compare, simulate


@pytest.fixture(scope="module")
def rpi5():
    return get_profile("rpi5")


@pytest.mark.parametrize(("ambient", "hint"), [(25000, "25 °C"), (298.15, "kelvin"), (-41, ""), (86, "")])
def test_plan_refuses_an_ambient_outside_the_range_in_its_own_terms(rpi5, ambient, hint):
    with pytest.raises(EdgeSDKError) as caught:
        simulate(rpi5, 1, ambient, True, 35.0)
    text = str(caught.value)
    assert text.startswith("simulate: ")
    assert "SimulatedBoard" not in text
    assert f"ambient_c={ambient!r} (--ambient)" in text
    assert "from -40 to 85 °C" in text
    assert hint in text
    assert "e.g. ambient_c=35 (--ambient 35)" in text


def test_plan_takes_the_ends_of_the_shared_range(rpi5):
    low, high = AMBIENT_RANGE_C
    work = Workload(prompt_tokens=4, new_tokens=4)
    for ambient in (low, high):
        runs = compare(rpi5, 0.05, ambient, 35.0, workload=work)
        assert runs["guarded"].board.ambient_c == ambient


def test_plan_still_names_a_nan_ambient_as_not_finite(rpi5):
    with pytest.raises(EdgeSDKError, match=r"ambient_c=nan \(--ambient\) is not a finite temperature"):
        simulate(rpi5, 1, math.nan, True, 35.0)


def _fake_python(tmp_path, script: str) -> str:
    """A venv whose bin/python is a real program printing what ``script`` (sh) prints."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n" + script)
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return str(venv)


needs_venv = pytest.mark.skipif(sys.prefix == getattr(sys, "base_prefix", sys.prefix),
                                reason="inherit_site_packages only acts from inside a venv")


@needs_venv
@pytest.mark.parametrize(("script", "seen"), [("exit 0\n", "on stdout: nothing"),
                                              ("echo 'Python 3.12 is not configured'\n", "is not configured")])
def test_a_venv_python_that_names_no_site_packages_is_refused_readably(tmp_path, script, seen):
    venv = _fake_python(tmp_path, script)
    with pytest.raises(Refused) as caught:
        inherit_site_packages(venv)
    problem, fix = caught.value.problem, caught.value.fix
    assert "did not name its site-packages directory" in problem
    assert seen in problem
    assert os.path.join(venv, "bin", "python") in problem
    assert "import site, json" in problem
    assert "--runtime-venv-system-site-packages" in fix


@needs_venv
def test_a_warning_on_stderr_after_the_site_packages_is_not_read_as_them(tmp_path):
    target = tmp_path / "site-packages"
    target.mkdir()
    venv = _fake_python(tmp_path, f"echo '{json.dumps([str(target)])}'\n"
                                  "echo 'Warning: a .pth file failed to import' >&2\n")
    dirs = inherit_site_packages(venv)
    assert dirs
    assert (target / "zz-edgesdk-inherited.pth").read_text() == "\n".join(dirs) + "\n"


def test_an_answer_is_read_from_stdout_with_a_warning_after_it_on_stderr(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    argv = [sys.executable, "-c", "import sys; print('1.2.3'); print('/venv/edgesdk/__init__.py'); "
                                  "sys.stdout.flush(); sys.stderr.write('DeprecationWarning: pkg_resources\\n')"]
    assert read_answer(argv, 2, None, "import edgesdk in the new runtime", "version", "report this",
                       str(venv)) == ["1.2.3", "/venv/edgesdk/__init__.py"]
    dependencies = [sys.executable, "-c", "import json, sys; print(json.dumps({'keep': [], 'provided': []})); "
                                          "sys.stdout.flush(); sys.stderr.write('UserWarning: setuptools\\n')"]
    assert read_answer(dependencies, 1, json.loads, "reading the dependencies", "JSON", "report this",
                       str(venv)) == [{"keep": [], "provided": []}]
    assert venv.is_dir()


def test_an_answer_that_is_not_printed_is_refused_with_what_was_printed(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('ImportError: no module named edgesdk\\n')"]
    with pytest.raises(Refused) as caught:
        read_answer(argv, 2, None, "import edgesdk in the new runtime", "edgesdk version and file on two lines",
                    "report this", str(venv))
    text = caught.value.problem
    assert "printed no edgesdk version and file on two lines" in text
    assert "on stdout: nothing" in text
    assert "no module named edgesdk" in text
    assert sys.executable in text
    assert not venv.exists()  # the install cut short is not kept


def test_fmt_bytes_shows_an_odd_count_as_what_it_is():
    assert fmt_bytes(-5000) == "-5.0 kB"
    assert fmt_bytes(-12) == "-12 B"
    assert fmt_bytes(math.nan) == "unknown"
    assert fmt_bytes(math.inf) == "unknown"
    assert [fmt_bytes(n) for n in (0, 999, 1000, 1_200_000_000)] == ["0 B", "999 B", "1.0 kB", "1.20 GB"]
