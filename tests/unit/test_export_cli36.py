"""``edgesdk export`` prints where llama.cpp will tokenize the exported file differently as its own notes on stderr,
not as a Python warning."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")


def test_export_prints_the_tokenizer_notes(tmp_path):
    from tests._utils.tiny import tiny_llama2_tokenizer
    from tests.unit.test_cli import assert_ok, invoke
    from tests.unit.test_gguf_tokenizer_parity36 import _export

    with pytest.warns(UserWarning, match="begins with a space"):
        bundle, report = _export(tmp_path / "first", tiny_llama2_tokenizer())
    result = invoke("export", bundle.path, tmp_path / "again.gguf")
    assert_ok(result)
    notes = [line for line in result.stderr.splitlines() if line.startswith("edgesdk: note: llama.cpp tokenizes ")]
    assert [line.removeprefix("edgesdk: note: llama.cpp tokenizes ") for line in notes] == \
        [note.replace("\n", "\\n") for note in report.notes]
    assert "UserWarning" not in result.stderr
