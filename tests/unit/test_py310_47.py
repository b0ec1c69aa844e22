"""The product runs on Python 3.10 (requires-python, and JetPack 6's Python): no standard-library name or syntax
that only 3.11 or later has, which byte-compiling on 3.10 does not catch where the name is looked up at run time.

The scan runs everywhere; the runs under a Python 3.10 need one that has the base install's dependencies
(numpy, onnxruntime, tokenizers, ...): set EDGESDK_PY310 to it (e.g. a venv made with
``python3.10 -m venv V && V/bin/pip install -e .``), else they are skipped."""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(path for folder in ("edgesdk", "export", "targets") for path in (ROOT / folder).rglob("*.py"))

# module -> names it has only from Python 3.11 (or later)
NEWER_NAMES = {
    "datetime": {"UTC"},
    "enum": {"StrEnum", "ReprEnum", "EnumCheck", "FlagBoundary", "verify", "member", "nonmember", "global_enum",
             "property", "show_flag_values"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override", "get_overloads",
               "clear_overloads", "ReadOnly", "TypeIs"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier", "BrokenBarrierError"},
    "hashlib": {"file_digest"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "itertools": {"batched"},
    "math": {"cbrt", "exp2", "sumprod", "fma"},
    "sys": {"exception", "monitoring", "activate_stack_trampoline"},
    "logging": {"getLevelNamesMapping", "getHandlerByName", "getHandlerNames"},
    "inspect": {"markcoroutinefunction", "getmembers_static"},
    "os": {"process_cpu_count"},
    "string": set(),
    "re": {"NOFLAG"},
}
NEWER_MODULES = {"tomllib", "wsgiref.types"}
NEWER_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
NEWER_METHODS = {"add_note"}  # BaseException.add_note
RE_FUNCTIONS = {"compile", "match", "fullmatch", "search", "sub", "subn", "split", "findall", "finditer"}
# an atomic group or a possessive quantifier (3.11's re); a backslash before the quantifier makes it a literal
NEWER_RE = re.compile(r"\(\?>|(?<!\\)[*+?}]\+")


def _newer_uses(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    aliases: dict[str, str] = {}  # local name -> module it stands for
    found = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(root)}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
                if alias.name in NEWER_MODULES:
                    say(node, f"import {alias.name} (Python 3.11+)")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in NEWER_MODULES:
                say(node, f"from {node.module} import ... (Python 3.11+)")
            for alias in node.names:
                if alias.name in NEWER_NAMES.get(node.module, ()) or f"{node.module}.{alias.name}" in NEWER_MODULES:
                    say(node, f"from {node.module} import {alias.name} (Python 3.11+)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and node.attr in NEWER_NAMES.get(module, ()):
                say(node, f"{module}.{node.attr} (Python 3.11+)")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and aliases.get(node.value.value.id) == "datetime" \
                and node.value.attr == "datetime" and node.attr == "UTC":
            say(node, "datetime.datetime.UTC (no such name; datetime.UTC is 3.11+)")
        if isinstance(node, ast.Attribute) and node.attr in NEWER_METHODS:
            say(node, f".{node.attr}() (Python 3.11+)")
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS and node.id not in aliases:
            say(node, f"{node.id} (a builtin from Python 3.11)")
        elif getattr(ast, "TryStar", None) is not None and isinstance(node, ast.TryStar):
            say(node, "except* (Python 3.11+)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and aliases.get(node.func.value.id) == "re" \
                and node.func.attr in RE_FUNCTIONS and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and NEWER_RE.search(node.args[0].value):
            say(node, "an atomic group or possessive quantifier in a regular expression (Python 3.11+)")
    return found


def test_the_product_uses_no_name_or_syntax_python_3_10_lacks():
    found = [use for path in SOURCES for use in _newer_uses(path)]
    assert not found, "Python 3.10 lacks these (requires-python >= 3.10):\n  " + "\n  ".join(found)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The scan itself: each kind of 3.11-only use is named (else the test above passes on anything)."""
    sample = tmp_path / "sample.py"
    sample.write_text("import datetime as _dt\nimport re\nimport tomllib\nfrom enum import StrEnum\n"
                      "from typing import Self\n_dt.datetime.now(_dt.UTC)\ne = ExceptionGroup('x', [])\n"
                      "re.compile(r'(?>ab)c')\nre.match('a++', 'a')\ne.add_note('n')\n")
    found = _newer_uses(sample, tmp_path)
    text = "\n".join(found)
    for what in ("import tomllib", "StrEnum", "Self", "datetime.UTC", "ExceptionGroup", "atomic group",
                 ".add_note"):
        assert what in text, text
    assert len([line for line in found if "regular expression" in line]) == 2, text


def _python310() -> str:
    """A Python 3.10 that has the base install's dependencies; the test is skipped where there is none."""
    candidates = [os.environ.get("EDGESDK_PY310") or "", sys.executable if sys.version_info[:2] == (3, 10) else "",
                  shutil.which("python3.10") or "",
                  *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")))]
    for python in filter(None, candidates):
        try:
            probe = subprocess.run([python, "-c", "import sys; assert sys.version_info[:2] == (3, 10); import numpy, "
                                    "onnxruntime, tokenizers, click, pydantic, yaml, jinja2, tqdm"],
                                   capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return python
    pytest.skip("no Python 3.10 with the base install's dependencies (set EDGESDK_PY310 to one)")


IMPORT_ALL = """
import importlib, json, pkgutil
import edgesdk
HOST_ONLY = {"torch", "transformers", "onnx", "safetensors", "gguf", "accelerate", "matplotlib", "triton", "jtop",
             "tensorrt", "pycuda", "cuda", "onnxscript"}
bad, imported = [], 0
for info in pkgutil.walk_packages(edgesdk.__path__, "edgesdk."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
        imported += 1
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in HOST_ONLY:
            bad.append(f"{info.name}: {exc!r}")
    except Exception as exc:
        bad.append(f"{info.name}: {exc!r}")
print(json.dumps({"file": edgesdk.__file__, "imported": imported, "bad": bad}))
"""


def _run310(python: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGESDK_HUGE_PAGES": "0"}
    return subprocess.run([python, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_every_module_imports_under_python_3_10():
    """Each module imports under 3.10 (those needing torch or another host-only package aside)."""
    proc = _run310(_python310(), "-c", IMPORT_ALL)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(ROOT), result["file"]  # this checkout's, not another
    assert not result["bad"], "\n".join(result["bad"])
    assert result["imported"] > 50, result


def test_board_commands_run_under_python_3_10(tmp_path):
    """A few board commands that need no bundle, and the thermal guard's levels as 3.10 formats them."""
    python = _python310()
    for args in (("targets", "list"), ("thermal", "sensors", "--target", "rpi5"), ("env",)):
        proc = _run310(python, "-m", "edgesdk.cli", *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
    proc = _run310(python, "-c", "from edgesdk.thermal.guard import Level; print(Level.HOT.value, Level.HOT.rank)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["hot", "2"]
