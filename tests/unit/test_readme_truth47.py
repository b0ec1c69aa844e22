"""The command line's own help says what README.md says the commands do (review 47).

Each test reads a command's help text from its click object (no rendering, so no line wrapping) and checks it
names what the README documents and the code does.
"""

from __future__ import annotations

import re

import pytest

from edgesdk.cli import main


def _words(text: str | None) -> str:
    """``text`` with its whitespace runs made single spaces (docstrings are indented and wrapped)."""
    return " ".join((text or "").split())


def _option_help(command: str, name: str) -> str:
    """The help of option ``name`` (its parameter name) of ``edgesdk COMMAND``."""
    params = {param.name: param for param in main.commands[command].params}
    return _words(params[name].help)


def test_export_help_names_every_architecture_the_export_writes():
    """README's GGUF export section: Llama, Mistral, SmolLM3, Qwen2, Qwen3 and Gemma 3 bundles export."""
    pytest.importorskip("gguf")
    from edgesdk.export.gguf_export import ARCHITECTURES

    said = _words(main.commands["export"].help)
    written = {architecture for architecture, _ in ARCHITECTURES.values()} | {"mistral"}
    missing = sorted(name for name in written if not re.search(rf"\b{name}\b", said))
    assert not missing, f"'edgesdk export --help' does not name {missing}: {said!r}"


@pytest.mark.parametrize("command", ["run", "serve"])
def test_sampler_chain_help_names_the_infill_sampler(command):
    """README: every route's samplers and run's --sampling-seq take llama.cpp's infill sampler (letter i)."""
    from edgesdk.runtime.generate import SAMPLER_LETTERS

    assert SAMPLER_LETTERS.get("i") == "infill"
    assert "i infill" in _option_help(command, "sampling_seq")
    assert "infill" in _option_help(command, "samplers")


def test_pack_help_names_every_archive_name_it_compresses():
    """README: pack compresses .tar.gz / .tgz / .gz, .tar.bz2 / .tbz2 / .bz2 and .tar.xz / .txz / .xz."""
    from edgesdk.bundle import COMPRESSED_SUFFIXES

    said = _words(main.commands["pack"].help)
    missing = [suffix for suffix in COMPRESSED_SUFFIXES
               if not re.search(rf"(?<![\w.]){re.escape(suffix)}(?![\w.])", said)]
    assert not missing, f"'edgesdk pack --help' does not name {missing}: {said!r}"
