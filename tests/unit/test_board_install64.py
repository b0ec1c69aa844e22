"""What a board's install meets: a build asked for where the host extra is missing, a bundle whose onnxruntime
this Python cannot get, a Jetson's onnxruntime-gpu that a plain ``pip install edgesdk`` covers with the CPU build,
and the command line the huge-page re-execution leaves for ``ps`` and ``pgrep``.

A missing module is an import hook in a fresh interpreter that answers ``No module named ...`` for it, as a board's
Python without the host extra does.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgesdk.errors import EdgeSDKError, RuntimeBackendError

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def missing(*names: str) -> str:
    """A program prefix under which ``names`` (and their submodules) are not installed."""
    return textwrap.dedent(
        f"""
        import sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {names!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Missing())
        """
    )


def run_python(program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", program, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


def assert_host_refusal(text: str, names: tuple[str, ...], command: str) -> None:
    from edgesdk.cli_build import HOST_INSTALL

    assert "Traceback" not in text, text
    assert f"{command} needs " in text, text
    for name in names:
        assert re.search(rf"\b{name}\b", text.split("fix:")[0]), (name, text)
    assert "runs on the host" in text
    assert f"fix: on the host: {HOST_INSTALL}" in text


# --- finding: build and build_bundle on a board's install ----------------------------------------------------------


def test_build_on_an_install_without_the_host_extra_names_what_is_missing(tmp_path):
    program = missing("torch", "transformers", "onnx") + "from edgesdk.cli import main\nmain(sys.argv[1:], prog_name='edgesdk')\n"
    proc = run_python(program, "build", "--target", "rpi5", cwd=tmp_path)
    assert proc.returncode != 0
    assert_host_refusal(proc.stderr, ("torch", "transformers", "onnx"), "'edgesdk build'")
    assert not (tmp_path / "bundles").exists()  # refused before anything was written


def test_build_names_only_the_module_missing(tmp_path):
    program = missing("onnx") + "from edgesdk.cli import main\nmain(sys.argv[1:], prog_name='edgesdk')\n"
    proc = run_python(program, "build", "--target", "rpi5", cwd=tmp_path)
    assert proc.returncode != 0
    assert_host_refusal(proc.stderr, ("onnx",), "'edgesdk build'")
    assert "needs onnx, which" in proc.stderr


def test_build_bundle_on_an_install_without_the_host_extra_raises_edgesdk_error(tmp_path):
    program = missing("torch", "transformers", "onnx") + textwrap.dedent(
        """
        import edgesdk
        from edgesdk.errors import EdgeSDKError
        try:
            edgesdk.build_bundle("rpi5")
        except EdgeSDKError as exc:
            print(str(exc))
        """
    )
    proc = run_python(program, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_host_refusal(proc.stdout, ("torch", "transformers", "onnx"), "build_bundle()")


def test_a_host_module_missing_at_import_is_named_and_other_import_errors_pass():
    """Past the up-front check, a module of the host extra that the build's imports miss is named as well; an
    ImportError of anything else is no install problem and goes on as it is."""
    from edgesdk.cli_build import host_modules

    with pytest.raises(EdgeSDKError, match=r"^'edgesdk build' needs gguf, and the gguf this Python") as info:
        with host_modules("'edgesdk build'"):
            raise ModuleNotFoundError("No module named 'gguf.constants'", name="gguf.constants")
    assert "edgesdk[host]" in info.value.fix
    with pytest.raises(ModuleNotFoundError, match="somethingelse"):
        with host_modules("'edgesdk build'"):
            raise ModuleNotFoundError("No module named 'somethingelse'", name="somethingelse")


def test_the_install_command_pins_torch_as_ci_and_the_readme_do():
    from edgesdk.cli_build import HOST_EXTRA, HOST_INSTALL, TORCH_PIN

    ci_pin = re.search(r"torch==[\w.]+", (ROOT / ".ci" / "run").read_text(encoding="utf-8"))[0]
    assert TORCH_PIN == ci_pin
    assert HOST_INSTALL.startswith(f"pip install {ci_pin} && ")
    extra = re.search(r"^host = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M | re.S)[1]
    assert sorted(HOST_EXTRA) == sorted(re.findall(r'^\s*"([\w-]+)', extra, re.M))


# --- finding: a bundle that needs onnxruntime >= 1.24 under Python 3.10 --------------------------------------------


def window_feature():
    from edgesdk.export.fused_graph import SLIDING_WINDOW_ONNXRUNTIME

    return SLIDING_WINDOW_ONNXRUNTIME


def test_under_python_3_10_the_refusal_says_pip_cannot_get_it_and_what_works(monkeypatch):
    from edgesdk.runtime.ort_backend import check_onnxruntime_version

    monkeypatch.setattr(sys, "version_info", (3, 10, 13, "final", 0))
    with pytest.raises(RuntimeBackendError) as info:
        check_onnxruntime_version("1.23.2", window_feature(), "ort-fused")
    error = info.value
    assert "needs onnxruntime >= 1.24" in error.problem
    assert "Python 3.11 and newer" in error.problem
    assert "Python 3.10.13" in error.problem
    assert "Python 3.11 or newer on the board" in error.fix
    assert "--remote-python python3.11" in error.fix
    assert "'edgesdk build --recipe int8-qdq'" in error.fix
    assert "'edgesdk build --max-context N'" in error.fix
    assert "sliding_window" in error.fix


def test_under_python_3_11_pip_install_stays_the_fix(monkeypatch):
    from edgesdk.runtime.ort_backend import check_onnxruntime_version

    monkeypatch.setattr(sys, "version_info", (3, 11, 9, "final", 0))
    with pytest.raises(RuntimeBackendError) as info:
        check_onnxruntime_version("1.23.2", window_feature(), "ort-fused")
    assert info.value.fix.startswith("pip install 'onnxruntime>=1.24'")
    assert "--recipe int8-qdq" in info.value.fix
    assert "Python 3.11" not in str(info.value)
    # a form that needs an onnxruntime Python 3.10 has: pip install stays the fix there too
    monkeypatch.setattr(sys, "version_info", (3, 10, 13, "final", 0))
    with pytest.raises(RuntimeBackendError) as older:
        check_onnxruntime_version("1.22.1", ((1, 23), "GroupQueryAttention's qk_output"), "ort-fused-gated")
    assert older.value.fix.startswith("pip install 'onnxruntime>=1.23'")


def test_the_rebuilds_the_refusal_names_are_standard_graphs_and_build_options():
    """The recipe named builds the standard graph (which needs no newer onnxruntime for a window), and the
    options named are build's."""
    from edgesdk.build.recipes import load_recipe
    from edgesdk.cli_build import build

    assert load_recipe("int8-qdq").export.form == "standard"
    options = {name for param in build.params for name in param.opts}
    assert {"--recipe", "--max-context"} <= options


def test_the_readme_s_gemma_3_paragraph_says_what_a_python_3_10_board_does():
    paragraph = README[README.index("Gemma 3 (`gemma3_text`) differs"):]
    paragraph = paragraph[:paragraph.index("\n\n")]
    assert "Python 3.11" in paragraph
    assert "--remote-python python3.11" in paragraph
    assert "`--recipe int8-qdq`" in paragraph
    assert "`--max-context 512`" in paragraph


# --- finding: a Jetson's onnxruntime-gpu and pip install edgesdk -------------------------------------------------


def test_the_readme_s_jetson_install_leaves_out_onnxruntime_and_installs_every_other_dependency():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [req for req in project["dependencies"] if not req.startswith("onnxruntime")]
    wanted += project["optional-dependencies"]["jetson"]
    spaced = " ".join(README.split())
    assert "onnxruntime-gpu wheel for the board's JetPack (Jetson Zoo or jetson-containers) first" in spaced
    assert "`pip install --no-deps edgesdk`" in spaced
    command = re.search(r"dependencies without onnxruntime: `(pip install [^`]+)`", spaced)[1]
    given = re.findall(r"'([^']+)'", command)
    assert sorted(given) == sorted(re.sub(r"\s*#.*", "", req).replace(" ", "") for req in wanted)
    assert not any(item.startswith("onnxruntime") for item in given)


# --- finding: the huge-page re-execution's command line ----------------------------------------------------------

# what pip writes for the console script edgesdk = edgesdk.cli:entry (less its shebang: run with this interpreter)
CONSOLE_SCRIPT = textwrap.dedent(
    """\
    import sys
    from edgesdk.cli import entry
    if __name__ == '__main__':
        sys.argv[0] = sys.argv[0].removesuffix('.exe')
        sys.exit(entry())
    """
)

# each interpreter that starts records its command line (NUL-separated) and whether the tunable was set
SITECUSTOMIZE = textwrap.dedent(
    """\
    import os
    with open(os.environ["CMDLINE_LOG"], "a", encoding="utf-8") as log:
        with open("/proc/self/cmdline", "rb") as cmdline:
            args = cmdline.read().decode().rstrip("\\0").split("\\0")
        log.write(repr((args, os.environ.get("GLIBC_TUNABLES", ""))) + "\\n")
    """
)


def started_commands(tmp_path: Path, argv: list[str], shadow: bool = True) -> tuple[subprocess.CompletedProcess, list]:
    """Run ``argv`` in ``tmp_path / "work"`` with huge pages wanted, and the command line of every interpreter it
    started, in order, with the GLIBC_TUNABLES each saw. ``shadow``: the working directory holds an edgesdk that
    exits, as a checkout there would run other code."""
    import ast

    from edgesdk.runtime.huge_pages import OPT_OUT, huge_page_environment, thp_mode

    environment = {key: value for key, value in os.environ.items() if key not in ("GLIBC_TUNABLES", OPT_OUT)}
    if huge_page_environment(environment, thp_mode(), platform.libc_ver()) is None:
        pytest.skip("no re-execution is attempted on this system (glibc or THP mode)")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    work = tmp_path / "work"
    work.mkdir()
    if shadow:
        (work / "edgesdk").mkdir()
        (work / "edgesdk" / "__init__.py").write_text("raise SystemExit('the shadow edgesdk was imported')\n")
    log = tmp_path / "cmdlines.txt"
    environment.update(CMDLINE_LOG=str(log),
                       PYTHONPATH=os.pathsep.join(filter(None, (str(site), environment.get("PYTHONPATH")))))
    proc = subprocess.run(argv, cwd=work, env=environment, capture_output=True, text=True, timeout=120, check=False)
    return proc, [ast.literal_eval(line) for line in log.read_text().splitlines()]


def test_the_console_script_reexecutes_as_itself(tmp_path):
    """``ps`` shows ``python /venv/bin/edgesdk run ...``, which ``pgrep -f 'edgesdk run'`` finds; the working
    directory's edgesdk is not imported (a script's directory leads sys.path, not the working one)."""
    script = tmp_path / "bin" / "edgesdk"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    proc, started = started_commands(tmp_path, [sys.executable, str(script), "run", "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    assert len(started) == 2, started
    (first, first_tunables), (second, second_tunables) = started
    assert first == [sys.executable, str(script), "run", "--help"]
    assert second == first  # the same command line, now with the tunable
    assert "glibc.malloc.hugetlb" in second_tunables
    assert "glibc.malloc.hugetlb" not in first_tunables
    assert re.search(r"edgesdk run", " ".join(second))


def test_python_m_edgesdk_reexecutes_as_python_m_edgesdk(tmp_path):
    """The same ``-m edgesdk``, whose sys.path (the working directory first) is the one this process imported
    edgesdk from."""
    proc, started = started_commands(tmp_path, [sys.executable, "-m", "edgesdk", "bench", "--help"], shadow=False)
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    assert [args for args, _ in started] == [[sys.executable, "-m", "edgesdk", "bench", "--help"]] * 2
    assert "glibc.malloc.hugetlb" in started[1][1]


def test_a_program_that_calls_entry_itself_reexecutes_the_installed_cli(tmp_path):
    """Neither the console script nor ``-m edgesdk`` (here ``python -c``): the program that imports the installed
    edgesdk whatever the working directory holds, as before."""
    from edgesdk.runtime.huge_pages import REEXEC_PROGRAM

    program = "import sys; sys.argv[1:] = ['run', '--help']; from edgesdk.cli import entry; entry()"
    # (its own -c puts the working directory first: test_huge_pages.py shows the re-executed one does not)
    proc, started = started_commands(tmp_path, [sys.executable, "-c", program], shadow=False)
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    assert [args for args, _ in started] == [[sys.executable, "-c", program], [sys.executable, "-c", REEXEC_PROGRAM,
                                                                               "run", "--help"]]


def test_a_script_that_is_not_the_console_script_is_not_run_again(tmp_path):
    """A file named as argv[0] that this interpreter did not run as its program, or that is not edgesdk's console
    script, is not taken for it."""
    from edgesdk.runtime.huge_pages import REEXEC_PROGRAM, reexec_argv

    other = tmp_path / "edgesdk"
    other.write_text("print('not the console script')\n")
    assert reexec_argv([str(other), "run"]) == [sys.executable, "-c", REEXEC_PROGRAM, "run"]
    console = tmp_path / "console"
    console.write_text(CONSOLE_SCRIPT)  # edgesdk's script, but not what this interpreter runs as __main__
    assert reexec_argv([str(console), "serve"]) == [sys.executable, "-c", REEXEC_PROGRAM, "serve"]
