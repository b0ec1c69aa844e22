"""Review 46 of profiles and the bundle format: a profile's power entropy target must be one the power
controller accepts (above least_entropy, 0.366 nats at the window of 8 and the floor 0.01), and bundle
verification must not be bypassed by links that rglob does not yield: an unlisted file behind a linked
directory, or an unlisted link to nothing. A listed file may still be a link (test_bundle.py,
test_pack_stores_linked_files_as_files): its bytes are hashed and pack stores them."""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, pack_bundle, verify_bundle
from edgesdk.errors import BundleError, ProfileError
from edgesdk.power.distribution import least_entropy
from edgesdk.profile import parse_profile

MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


# --- the profile's entropy target -------------------------------------------------------------------

def _rpi5_with_target(value: str) -> str:
    text = (resources.files("edgesdk.targets") / "rpi5.yaml").read_text(encoding="utf-8")
    assert "entropy_target: 1.5" in text
    return text.replace("entropy_target: 1.5", f"entropy_target: {value}")


@pytest.mark.parametrize("value", ["0.2", "0.366", repr(least_entropy())])
def test_a_target_the_controller_refuses_is_refused_when_the_profile_loads(value):
    with pytest.raises(ProfileError) as info:
        parse_profile(_rpi5_with_target(value), "my-board.yaml")
    message = str(info.value)
    assert "power.entropy_target" in message
    assert "must lie in (0.366, 2.079) nats" in message
    assert f"got {float(value)}" in message


@pytest.mark.parametrize("value", [least_entropy() + 1e-3, 1.2, 1.5, 2.0])
def test_a_reachable_target_still_loads(value):
    assert parse_profile(_rpi5_with_target(repr(value)), "my-board.yaml").power.entropy_target == value


# --- links in a bundle ------------------------------------------------------------------------------

def _bundle(path: Path) -> Path:
    writer = BundleWriter(path)
    writer.write_text("report.md", "hello\n")
    writer.write_text("sub/notes.txt", "nested\n")
    return writer.commit(dict(MINIMAL_MANIFEST)).path


def _refused(path: Path, *parts: str) -> BundleError:
    with pytest.raises(BundleError) as info:
        verify_bundle(path)
    for part in parts:
        assert part in info.value.problem
    assert info.value.fix
    return info.value


def test_a_linked_directory_hiding_an_unlisted_file_is_refused(tmp_path):
    bundle = _bundle(tmp_path / "bundle")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(bundle / "sub", outside / "sub")
    (outside / "sub" / "unlisted.bin").write_bytes(b"never verified")
    (bundle / "sub").symlink_to(outside / "sub")
    error = _refused(bundle, "sub: not listed in the manifest (a link to a directory)")
    assert "unlisted.bin" not in error.problem  # the directory link itself is refused; nothing behind it is read
    with pytest.raises(BundleError, match="a link to a directory"):
        pack_bundle(bundle, tmp_path / "bundle.tar")
    assert not (tmp_path / "bundle.tar").exists()


@pytest.mark.parametrize(("target", "kind"), [("/nonexistent-edgesdk-46", "(a link to nothing)"), ("/", "(a link to a directory)")])
def test_an_unlisted_link_is_refused(tmp_path, target, kind):
    bundle = _bundle(tmp_path / "bundle")
    (bundle / "extra").symlink_to(target)
    _refused(bundle, f"extra: not listed in the manifest {kind}")


def test_links_that_stay_inside_still_verify(tmp_path):
    writer = BundleWriter(tmp_path / "bundle")
    writer.write_text("report.md", "hello\n")
    writer.write_text("sub/copy.md", "hello\n")
    bundle = writer.commit(dict(MINIMAL_MANIFEST)).path
    (bundle / "sub" / "copy.md").unlink()
    (bundle / "sub" / "copy.md").symlink_to("../report.md")  # a link to another listed file of the bundle
    (tmp_path / "current").symlink_to("bundle")  # the deploy root's 'current' link names the bundle itself
    assert verify_bundle(tmp_path / "current").bundle_id == verify_bundle(bundle).bundle_id


def test_pack_under_a_path_whose_parent_is_a_file_is_refused_with_the_fix(tmp_path):
    """The cleanup of the partial archive raised NotADirectoryError too and hid the real error in a traceback."""
    from edgesdk.bundle import pack_bundle
    from edgesdk.errors import BundleError
    from tests._utils.builds import build_tiny_bundle

    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host")
    (tmp_path / "somefile").write_text("not a directory")
    with pytest.raises(BundleError, match="cannot write the archive") as caught:
        pack_bundle(bundle.path, tmp_path / "somefile" / "x.tar")
    assert "existing, writable directory" in caught.value.fix
