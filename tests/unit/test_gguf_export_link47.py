"""export_gguf writes its file at ``NAME.partial`` first: a link planted at that predictable name (a shared
directory) is not written through (the file now has a name of its own, and a link at the old name is left alone)."""

from __future__ import annotations

from edgesdk.export.gguf_export import export_gguf
from tests.unit.test_gguf_export import _bundle


def test_a_link_at_the_partial_name_is_not_written_through(tmp_path):
    bundle = _bundle(tmp_path, "fp32")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.gguf.partial").symlink_to(victim)
    report = export_gguf(bundle.path, out / "model.gguf")
    assert victim.read_text() == "keep me"
    assert report.path.read_bytes()[:4] == b"GGUF"
