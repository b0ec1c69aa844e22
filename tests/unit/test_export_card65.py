"""Round 65's export and board-reading fixes: temporary GGUF files that a killed export left are cleared by the next
export (never a live one's), the GGUF card says nothing the bundle made untrue and names the default model as it is
published, a README with a byte order mark still gives its card, a Jetson's nvpmodel.conf link is followed inside a
mounted root, and --clock-cap's note is left out on a Raspberry Pi 5 only."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from edgesdk.errors import ExportError

gguf = pytest.importorskip("gguf")

HOUR = 3600.0
SMOLLM2_CARD = {  # the general.* keys of the default alias's file, SmolLM2-135M-Instruct.Q4_1.gguf
    "name": "Smollm2 135M 8k Lc100K Mix1 Ep2", "organization": "HuggingFaceTB", "finetune": "8k-lc100k-mix1-ep2",
    "basename": "smollm2", "size_label": "135M", "license": "apache-2.0", "languages": ["en"]}


def _fields(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _manifest(before: dict | None = None, after: dict | None = None, source: str = "smollm2-135m") -> dict:
    card = dict(SMOLLM2_CARD)
    return {"model": {"before": {"source": source, "parameters": 134_515_008, "card": card, **(before or {})},
                      "after": {"source": source, "parameters": 134_515_008, "card": card, **(after or {})}},
            "recipe": {"name": "int8-fused"}, "bundle_id": "abc"}


def _card_written(tmp_path, manifest: dict, parameters: int | None = None) -> dict:
    from edgesdk.export.gguf_export import add_card
    from tests._utils.gguf_files import close_gguf

    path = tmp_path / "card.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    if parameters is None:
        add_card(writer, manifest)
    else:
        add_card(writer, manifest, parameters)
    return _fields(close_gguf(writer, path))


# --- 1. temporary files of killed exports ---------------------------------------------------------------------------


def _partial(directory: Path, random: str = "0123456789ab", age: float = 2 * HOUR, now: float = 1e9) -> Path:
    path = directory / f"model.gguf.{random}.partial"
    path.write_bytes(b"GGUF half a file")
    os.utime(path, (now - age, now - age))
    return path


def test_a_killed_exports_partial_file_is_removed_and_a_recent_one_is_left_with_a_note(tmp_path):
    """Each export writes NAME.<random>.partial; one killed by SIGKILL, the OOM killer or a power cut left its file
    (the model's size, on a board's card) for good, where the old fixed name was written over by the next export."""
    from edgesdk.export.gguf_export import clear_stale_partials

    now = 1e9
    old = _partial(tmp_path, "0123456789ab", age=2 * HOUR, now=now)
    recent = _partial(tmp_path, "ba9876543210", age=60, now=now)
    names = ["model.gguf.partial", "model.gguf.xyz.partial", "other.gguf.0123456789ab.partial",
             "model.gguf.0123456789AB.partial"]
    others = [tmp_path / name for name in names]
    for path in others:
        path.write_text("not an export's temporary file of model.gguf")
        os.utime(path, (now - 2 * HOUR, now - 2 * HOUR))
    notes = clear_stale_partials(tmp_path / "model.gguf", now=now)
    assert not old.exists()
    assert recent.exists()
    assert all(path.exists() for path in others)
    assert len(notes) == 2
    assert notes[0].startswith(f"removed {old}")
    assert "120 minutes ago" in notes[0]
    assert notes[1].startswith(f"left {recent} in place")
    assert "modified 60 s ago" in notes[1]


def test_an_old_partial_file_a_running_export_holds_is_left(tmp_path):
    """A large model's verification can leave its file unmodified for minutes: the export holds a lock on it until it
    renames or removes it, and a locked file is never removed, whatever its age."""
    pytest.importorskip("fcntl")
    from edgesdk.export.gguf_export import _lock_partial, clear_stale_partials

    held = _partial(tmp_path)
    with held.open("r+b") as handle:  # the export locks through its write handle (a copy of its descriptor)
        lock = _lock_partial(handle)
    assert lock is not None
    try:
        notes = clear_stale_partials(tmp_path / "model.gguf", now=1e9)
        assert held.exists()
        assert notes == [f"left {held} in place: another export still holds it open; remove it once no export is "
                         f"writing it (rm {held})"]
    finally:
        os.close(lock)
    notes = clear_stale_partials(tmp_path / "model.gguf", now=1e9)  # its writer gone: the lock with it
    assert not held.exists()
    assert notes[0].startswith(f"removed {held}")


def test_a_link_at_a_partial_name_is_left(tmp_path):
    """Nothing planted at such a name (a link in a shared directory) is removed."""
    from edgesdk.export.gguf_export import clear_stale_partials

    target = tmp_path / "precious"
    target.write_text("keep")
    link = tmp_path / "model.gguf.0123456789ab.partial"
    link.symlink_to(target)
    notes = clear_stale_partials(tmp_path / "model.gguf")
    assert link.is_symlink()
    assert target.read_text() == "keep"
    assert "it is no regular file" in notes[0]


def test_the_name_collision_error_says_what_it_would_mean(tmp_path, monkeypatch):
    """'16 random names were all taken ... remove the stale partial files' cannot be what happened: 48 random bits do
    not collide; only a file system answering 'file exists' for new names would end there."""
    import secrets

    from edgesdk.export.gguf_export import _open_partial

    monkeypatch.setattr(secrets, "token_hex", lambda size: "0" * (2 * size))
    (tmp_path / "model.gguf.000000000000.partial").write_text("x")
    with pytest.raises(ExportError) as refused:
        _open_partial(tmp_path / "model.gguf")
    assert "'file exists' under fresh random names, which a working file system does not do" in str(refused.value)
    assert "stale" not in refused.value.fix
    assert f"ls -la {tmp_path}" in refused.value.fix


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from tests._utils.builds import build_tiny_bundle

    return build_tiny_bundle(tmp_path_factory.mktemp("card65"),
                             "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                             generated_sequences=0)


def test_an_export_clears_a_killed_exports_file_and_says_so(bundle, tmp_path):
    import time

    import edgesdk

    left = _partial(tmp_path, now=time.time())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = edgesdk.export_gguf(bundle.path, tmp_path / "model.gguf")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.gguf"]
    assert len(report.partial_notes) == 1
    assert report.partial_notes[0].startswith(f"removed {left}")
    assert any(str(warning.message) == report.partial_notes[0] for warning in caught)


# --- 2. the card ----------------------------------------------------------------------------------------------------


def test_the_default_models_file_is_named_as_it_is_published():
    """general.name was the card's 'Smollm2 135M 8k Lc100K Mix1 Ep2 (...)', which its converter took from a training
    checkpoint's directory: 'Instruct' was lost."""
    from edgesdk.export.gguf_export import gguf_name

    assert gguf_name(_manifest()) == "SmolLM2 135M Instruct (int8-fused, edgesdk bundle abc)"
    other = _manifest(source="/models/smollm2-checkpoint.gguf")  # a file of the user's own keeps its card's name
    assert gguf_name(other) == "Smollm2 135M 8k Lc100K Mix1 Ep2 (int8-fused, edgesdk bundle abc)"


def test_the_real_default_files_card_is_the_one_named(tmp_path):
    """The card above is the cached alias file's own, where the fixtures fetched it."""
    from edgesdk.models.loader import source_card
    from edgesdk.models.sources import ALIASES, ModelSource, cache_dir

    path = cache_dir() / "models" / "smollm2-135m" / Path(ALIASES["smollm2-135m"].member).name
    if not path.is_file():
        pytest.skip("the default model is not fetched")
    assert source_card(ModelSource(kind="gguf", path=path, name="smollm2-135m")) == SMOLLM2_CARD


def test_a_pruned_bundles_size_label_is_its_own(tmp_path):
    """After pruning, general.size_label still said the source's '135M'."""
    pruned = _manifest(after={"parameters": 87_001_000})
    assert _card_written(tmp_path, pruned, parameters=87_123_456)["general.size_label"] == "87M"
    assert "general.size_label" not in _card_written(tmp_path, pruned)  # no count given: no label rather than 135M
    assert _card_written(tmp_path, _manifest(), parameters=87_123_456)["general.size_label"] == "135M"  # unchanged


def test_a_merged_adapter_drops_the_sources_finetune(tmp_path):
    adapter = {"path": "/a/adapter_model.safetensors", "form": "peft", "rank": 8, "scale": 1.0, "sha256": "0" * 64}
    merged = _card_written(tmp_path, _manifest(before={"adapters": [adapter]}))
    assert "general.finetune" not in merged
    assert merged["general.basename"] == "smollm2"
    assert merged["general.license"] == "apache-2.0"
    assert _card_written(tmp_path, _manifest())["general.finetune"] == "8k-lc100k-mix1-ep2"


# --- 3. a README with a byte order mark -----------------------------------------------------------------------------


def test_a_readme_with_a_byte_order_mark_gives_its_card(tmp_path):
    from edgesdk.models.loader import source_card
    from edgesdk.models.sources import ModelSource

    (tmp_path / "README.md").write_bytes("\ufeff---\nlicense: mit\nlanguage: fr\n---\n# model\n".encode())
    assert source_card(ModelSource(kind="hf-dir", path=tmp_path, name=str(tmp_path))) == {
        "license": "mit", "languages": ["fr"]}


# --- 4. nvpmodel.conf as JetPack links it ---------------------------------------------------------------------------


def _jetson_root(root: Path, link: str) -> Path:
    (root / "etc" / "nvpmodel").mkdir(parents=True)
    (root / "etc" / "nvpmodel" / "nvpmodel_p3767_0000.conf").write_text(
        "< POWER_MODEL ID=0 NAME=MAXN >\n< POWER_MODEL ID=2 NAME=15W >\n")
    (root / "etc" / "nvpmodel.conf").symlink_to(link)
    (root / "var" / "lib" / "nvpmodel").mkdir(parents=True)
    (root / "var" / "lib" / "nvpmodel" / "status").write_text("pmode:0002 fmode:quiet\n")
    return root


@pytest.mark.parametrize("link", ["/etc/nvpmodel/nvpmodel_p3767_0000.conf", "nvpmodel/nvpmodel_p3767_0000.conf",
                                  "../../etc/./nvpmodel/nvpmodel_p3767_0000.conf"])
def test_a_linked_nvpmodel_conf_is_read_inside_the_mounted_root(tmp_path, link):
    """JetPack's /etc/nvpmodel.conf links to /etc/nvpmodel/nvpmodel_p3767_0000.conf; with the board's root mounted at
    /host that target was looked up in the container's own root, and the mode read as 'mode 2' without its name."""
    from edgesdk.thermal.sensors import NvpmodelStatus

    root = _jetson_root(tmp_path / "host", link)
    assert NvpmodelStatus.available(root)
    status = NvpmodelStatus(root)
    assert status.names == {0: "MAXN", 2: "15W"}
    assert status.read().nvpmodel == "15W"


def test_a_link_loop_reads_as_missing(tmp_path):
    from edgesdk.thermal.sensors import NvpmodelStatus

    root = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nvpmodel.conf").symlink_to("/etc/nvpmodel.conf")
    (root / "var" / "lib" / "nvpmodel").mkdir(parents=True)
    (root / "var" / "lib" / "nvpmodel" / "status").write_text("pmode:0002\n")
    status = NvpmodelStatus(root)
    assert status.names == {}
    assert status.read().nvpmodel == "mode 2"


# --- 5. --clock-cap's note on the Raspberry Pi family ---------------------------------------------------------------


def test_the_clock_cap_note_is_left_out_on_a_pi_5_only():
    """The whole rpi family went without the note, where the simulated cap follows the Pi 5's 1.5-2.4 GHz points and
    a Pi 4 runs 1.5 (1.8) GHz at other voltages."""
    from edgesdk.cli_thermal import clock_cap_notes
    from edgesdk.profile import get_profile

    pi4 = clock_cap_notes(get_profile("rpi4"), True)
    assert len(pi4) == 1
    assert "Raspberry Pi 5's clock and voltage points" in pi4[0]
    assert "Raspberry Pi 4's" in pi4[0]
    pi5 = get_profile("rpi5")
    assert clock_cap_notes(pi5, True) == []
    assert clock_cap_notes(pi5.model_copy(update={"name": "rpi5-16gb"}), True) == []  # a copy for another memory
    assert clock_cap_notes(get_profile("rpi4"), False) == []
