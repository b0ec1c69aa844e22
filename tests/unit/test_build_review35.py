"""Build pipeline, recipes, profiles and model sources: faults found in review."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.errors import BuildError


def _build(model_dir: Path, out: Path, recipe: str = "fp32-fused", **kwargs):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="host", model=str(model_dir), out=out, recipe=recipe,
                             export=ExportConfig(max_context=64), progress=False, **kwargs))


def test_a_build_into_a_folder_of_another_bundle_is_refused_and_leaves_that_bundle_whole(tiny_model_dir, tmp_path):
    """--out OUTER/inner with OUTER a bundle wrote the new bundle (and its work directory) inside OUTER, which
    then failed verification: files its manifest does not list."""
    from edgesdk.bundle import verify_bundle

    outer = _build(tiny_model_dir, tmp_path / "outer")
    for out in (tmp_path / "outer" / "inner", tmp_path / "outer" / "deeper" / "inner"):
        with pytest.raises(BuildError, match=r"lies in the bundle .*outer: the new bundle and its work directory "
                                             r"inner\.build would be files") as refused:
            _build(tiny_model_dir, out)
        assert f"e.g. {tmp_path / 'inner'}" in refused.value.fix
    assert sorted(p.name for p in outer.path.iterdir()) == sorted([*outer.manifest["files"], "manifest.json",
                                                                   "manifest.sha256"])
    assert verify_bundle(outer.path).bundle_id == outer.bundle_id
    assert _build(tiny_model_dir, tmp_path / "outer").bundle_id == outer.bundle_id  # the bundle itself is replaced


def test_a_model_directory_of_an_architecture_transformers_lacks_is_named_as_one_edgesdk_cannot_export(tmp_path):
    """A config.json whose model_type transformers does not know was 'cannot read the model config ... check that
    the file is a complete, uncorrupted ... model' with transformers' advice to upgrade it, where a known
    architecture edgesdk cannot export is refused by name (a GGUF's architecture is checked before transformers)."""
    import json

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    model_dir = tmp_path / "newarch"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "mamba9", "hidden_size": 64}))
    with pytest.raises(ModelSourceError, match=r"newarch has architecture 'mamba9', which edgesdk cannot build from; "
                                               r"supported: gemma3_text, llama") as refused:
        load_model(resolve_model(str(model_dir)))
    assert "Llama-family decoder" in refused.value.fix
    assert "uncorrupted" not in refused.value.fix


@pytest.mark.parametrize("key", ["cpu.cores", "cpu.max_ghz", "runtime.threads", "memory_budget_mb", "sparsity_block"])
def test_a_profile_number_written_as_yes_or_on_is_refused_naming_the_key(key):
    """YAML reads yes / on / true as a boolean, which pydantic took as the number 1: a profile with
    'threads: on' ran one thread, 'sparsity_block: on' asked for blocks of 1, without a word."""
    import yaml

    from edgesdk.errors import ProfileError
    from edgesdk.profile import parse_profile

    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "targets" / "rpi5.yaml").read_text(encoding="utf-8"))
    *sections, name = key.split(".")
    place = data
    for section in sections:
        place = place[section]
    place[name] = yaml.safe_load("on")
    with pytest.raises(ProfileError, match=rf"{key}: .*a true/false value .* where a number or a name is expected "
                                           r"\(got True\)"):
        parse_profile(yaml.safe_dump(data), "mine.yaml")
