"""edgesdk pack writes the same bytes for the same bundle files, leaves no .partial when stopped, and a built
bundle's report.md lists every file of the bundle with the bundle's whole size."""

from __future__ import annotations

import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import pack_bundle, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle52 import write_bundle

SUFFIXES = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz"]


def _copy_elsewhere(bundle: Path, parent: Path) -> Path:
    """The bundle copied under the same name into ``parent``: its files' bytes alike, their times and modes not."""
    copy = parent / bundle.name
    shutil.copytree(bundle, copy, copy_function=shutil.copyfile)
    for number, path in enumerate(sorted(p for p in copy.rglob("*") if p.is_file())):
        os.utime(path, (1_000_000_000 + number, 1_000_000_000 + number))
        path.chmod(0o600)
    return copy


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_copy_of_a_bundle_packs_to_the_same_bytes(tmp_path, suffix, monkeypatch):
    """The tar recorded each file's time, owner and mode and the gzip header the time of the pack, so a copy of
    the bundle (or the same bundle a second later, as .tar.gz) packed to other bytes."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    bundle = write_bundle(tmp_path / "one" / "b")
    copy = _copy_elsewhere(bundle, tmp_path / "two")
    first = pack_bundle(bundle, tmp_path / "one" / f"b{suffix}")
    second = pack_bundle(copy, tmp_path / "two" / f"b{suffix}")
    assert first.read_bytes() == second.read_bytes()
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["b/manifest.json", "b/manifest.sha256", "b/kernels/index.json",
                                         "b/report.md"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert not any(m.pax_headers for m in members)  # no fractional time or long owner name left in a pax header
    if suffix in (".tar.gz", ".tgz"):
        assert first.read_bytes()[4:8] == b"\0\0\0\0"  # the gzip header's time
    unpacked = unpack_bundle(second, tmp_path / "out")
    assert verify_bundle(unpacked.path).bundle_id == verify_bundle(bundle).bundle_id


def test_an_executable_file_keeps_its_execute_bit_and_source_date_epoch_sets_the_time(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    bundle = write_bundle(tmp_path / "b")
    (bundle / "kernels" / "index.json").chmod(0o700)
    (bundle / "report.md").chmod(0o600)
    with tarfile.open(pack_bundle(bundle, tmp_path / "b.tar.gz")) as tar:
        modes = {m.name: (m.mode, m.mtime) for m in tar.getmembers()}
    assert modes["b/kernels/index.json"] == (0o755, 1_700_000_000)
    assert modes["b/report.md"] == (0o644, 1_700_000_000)


@pytest.mark.parametrize("value", ["yesterday", "-5", "1.5"])
def test_a_source_date_epoch_that_is_no_whole_number_is_named(tmp_path, monkeypatch, value):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    bundle = write_bundle(tmp_path / "b")
    with pytest.raises(BundleError, match=rf"SOURCE_DATE_EPOCH is '{re.escape(value)}', expected a whole number") as info:
        pack_bundle(bundle, tmp_path / "b.tar")
    assert "unset it" in info.value.fix
    assert sorted(os.listdir(tmp_path)) == ["b"]


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_a_pack_stopped_by_ctrl_c_leaves_no_partial_archive(tmp_path, monkeypatch, suffix):
    """Only tar and OS errors removed the .partial file: a Ctrl-C while the files were added left it there."""
    bundle = write_bundle(tmp_path / "b")
    added = []
    original = tarfile.TarFile.addfile

    def interrupted(self, tarinfo, fileobj=None, *args, **kwargs):
        if added:
            raise KeyboardInterrupt
        added.append(tarinfo.name)
        return original(self, tarinfo, fileobj, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "addfile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pack_bundle(bundle, tmp_path / f"b{suffix}")
    assert added == ["b/manifest.json"]
    assert sorted(os.listdir(tmp_path)) == ["b"]


def _files_table(text: str) -> dict[str, int]:
    section = text.split("\n## Files\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[1].strip(): int(cells[2].strip().replace(",", "")) for cells in rows[1:]}


def test_the_report_lists_every_file_of_the_bundle_and_its_whole_size(tiny_bundle, tiny_model_dir, tmp_path):
    """The Files table and the size on disk held the graph, weights and tokenizer alone: chat_template.jinja and
    report.png, which manifest.json lists, were left out. The table lists every file but the report and the
    manifest's two, which the line after it names."""
    pytest.importorskip("matplotlib")
    from edgesdk.build.package import write_bundle as write_built_bundle
    from tests.unit.test_eval_bundle_review33 import _write_args

    args = _write_args(tiny_bundle, tiny_model_dir)
    parameters = tiny_bundle.manifest["model"]["before"]["parameters"]
    bundle = write_built_bundle(tmp_path / "built", **args,
                                baseline={"parameters": parameters, "weight_bytes": parameters * 4})
    on_disk = {path.relative_to(bundle.path).as_posix(): path.stat().st_size
               for path in bundle.path.rglob("*") if path.is_file()}
    assert {"chat_template.jinja", "report.png", "report.md", "manifest.json", "manifest.sha256"} <= set(on_disk)
    text = (bundle.path / "report.md").read_text(encoding="utf-8")
    staged = {name: size for name, size in on_disk.items()
              if name not in ("report.md", "manifest.json", "manifest.sha256")}
    assert _files_table(text) == staged
    assert ("and report.md (this report), manifest.json, which lists every file's size and sha256, and "
            "manifest.sha256, its digest") in text
    assert set(on_disk) - {"manifest.json", "manifest.sha256"} == set(bundle.manifest["files"])
    total = sum(staged.values())
    assert f"- size: {total / 1e6:.1f} MB on disk vs " in text
