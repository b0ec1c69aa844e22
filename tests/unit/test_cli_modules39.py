"""The CLI's command modules (``edgesdk/cli_<name>.py``): each is registered on the group in ``edgesdk/cli.py``
and never imports that module, so ``python -m edgesdk.cli`` (which runs it as ``__main__``) builds one group,
and importing any of them stays as lean as ``import edgesdk.cli``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from edgesdk.cli import main

COMMAND_MODULES = ["cli_bench", "cli_build", "cli_deploy", "cli_embed", "cli_engine", "cli_eval", "cli_interactive",
                   "cli_options", "cli_prompt_cache", "cli_run", "cli_serve", "cli_thermal"]
COMMANDS = ["bench", "build", "deploy", "embed", "engine", "env", "eval", "export", "inspect", "models", "pack", "run",
            "serve", "targets", "thermal", "unpack", "verify"]


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_command_module_imports_neither_the_group_nor_heavy_packages(module, tmp_path):
    code = textwrap.dedent(
        f"""
        import json, sys
        import edgesdk.{module}
        heavy = ("torch", "transformers", "onnxruntime")
        print(json.dumps(sorted(m for m in sys.modules if m == "edgesdk.cli" or m.split(".")[0] in heavy)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_every_command_is_registered_in_help_order():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = result.output.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed if line.strip()] == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: main {command} ")
