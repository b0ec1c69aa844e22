"""Review 48 of the Python API's area (edgesdk/api.py, edgesdk/bundle.py, edgesdk/profile.py): a manifest that is
valid JSON of the wrong shape is refused by name before anything runs (its 'model' and 'stages' sections, and a
'target' section the thermal guard cannot read), and a target profile's name must be a plain name. Real tiny
bundles, edited and hashed again as a hand edit would be."""

from __future__ import annotations

import hashlib
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest

import edgesdk
from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter, read_manifest, verify_bundle
from edgesdk.errors import BundleError, ProfileError
from edgesdk.profile import parse_profile

MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


def _rehashed(path: Path, change) -> Path:
    """``path``'s bundle with ``change(manifest)`` applied and its digest written again (an edit on purpose)."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")
    return path


def _edited_copy(tiny_bundle, tmp_path: Path, change) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(tiny_bundle.path, copy)
    return _rehashed(copy, change)


def _minimal(tmp_path: Path, **sections) -> Path:
    writer = BundleWriter(tmp_path / "minimal")
    writer.write_text("report.md", "hello\n")
    return writer.commit({**MINIMAL_MANIFEST, **sections}).path


# --- the manifest's 'model' and 'stages' sections -------------------------------------------------------------


@pytest.mark.parametrize(("change", "named"), [
    (lambda manifest: manifest["model"]["before"].pop("source"), "'model.before' must be a mapping with a 'source'"),
    (lambda manifest: manifest.__setitem__("model", {}), "'model.before' must be a mapping with a 'source'"),
    (lambda manifest: manifest["model"]["after"].pop("hidden_size"), "'model.after.hidden_size' must be a whole"),
], ids=["no-source", "no-facts", "no-hidden-size"])
def test_load_refuses_a_manifest_without_the_model_facts_it_reads(tiny_bundle, tmp_path, change, named):
    """load() named the model with the manifest's model.before.source once the backend had opened: a manifest
    without it (edited by hand and hashed again) raised a bare KeyError('source'); a missing hidden_size was a
    KeyError in create_embedding. Both are refused as the graph facts are, naming the key, before any backend."""
    bundle = _edited_copy(tiny_bundle, tmp_path, change)
    verify_bundle(bundle)  # deploy and pack need none of it
    with pytest.raises(BundleError) as refused:
        edgesdk.load(bundle, threads=1)
    assert "cannot be run" in refused.value.problem
    assert named in refused.value.problem
    assert "rebuild the bundle" in refused.value.fix


@pytest.mark.parametrize(("sections", "named"), [
    ({"model": "smollm2"}, "'model' must be a mapping"),
    ({"model": {"before": ["x"]}}, "'model.before' must be a mapping"),
    ({"stages": {}}, "'stages' must be a list of mappings with a 'stage' string"),
    ({"stages": [{"name": "qat"}]}, "'stages' must be a list of mappings with a 'stage' string"),
], ids=["model-str", "before-list", "stages-dict", "stage-without-name"])
def test_a_model_or_stages_section_of_the_wrong_shape_is_refused_when_read(tmp_path, sections, named):
    """The manifest's 'model' and 'stages' passed verification whatever their type ('model': "x" failed load() with
    AttributeError, 'stages': 5 failed 'edgesdk inspect' with TypeError)."""
    bundle = _rehashed(_minimal(tmp_path), lambda manifest: manifest.update(sections))
    with pytest.raises(BundleError) as refused:
        read_manifest(bundle)
    assert "is malformed" in refused.value.problem
    assert named in refused.value.problem


def test_minimal_model_and_stages_sections_still_verify(tmp_path):
    """An empty 'model' mapping and an empty 'stages' list (what deploy's and pack's own tests write) stay valid."""
    assert verify_bundle(_minimal(tmp_path)).manifest["model"] == {}


# --- the manifest's 'target' section under the thermal guard --------------------------------------------------


def test_watch_thermal_refuses_a_target_section_that_is_not_a_profile(tiny_bundle, tmp_path, monkeypatch):
    """load(watch_thermal=True) reads the manifest's copy of the target profile: one that is not a profile (edited
    by hand) raised pydantic's bare ValidationError; now a BundleError names the bundle and the keys."""
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    bundle = _edited_copy(tiny_bundle, tmp_path, lambda manifest: manifest["target"].pop("thermal"))
    with edgesdk.load(bundle, threads=1) as model:  # without the guard the profile's copy is not needed
        assert model.notes
    with pytest.raises(BundleError) as refused:
        edgesdk.load(bundle, threads=1, watch_thermal=True)
    assert "in the manifest of bundle" in refused.value.problem
    assert "thermal: Field required" in refused.value.problem
    assert "rebuild the bundle" in refused.value.fix


# --- a target profile's name ----------------------------------------------------------------------------------


def _rpi5_named(name: str) -> str:
    text = (resources.files("edgesdk.targets") / "rpi5.yaml").read_text(encoding="utf-8")
    assert "\nname: rpi5\n" in f"\n{text}"
    return f"\n{text}".replace("\nname: rpi5\n", f"\nname: {json.dumps(name)}\n", 1)


@pytest.mark.parametrize("name", ["", "../boards", "lab/pi", "my board", ".hidden", "board.yaml"])
def test_a_profile_name_that_is_not_a_plain_name_is_refused(name):
    """A user's profile named '../boards' built into bundles/../boards-like directories (the default bundle
    directory is bundles/<model>-<name>), 'lab/pi' into a nested one, and a name with '/' or a .yaml suffix is
    read as a file by --target: each is refused when the profile loads, naming the key."""
    with pytest.raises(ProfileError) as refused:
        parse_profile(_rpi5_named(name), "my-board.yaml")
    assert "name: Value error" in refused.value.problem
    assert "is not a plain board name" in refused.value.problem


@pytest.mark.parametrize("name", ["my-board", "pi5_lab.2", "rpi5"])
def test_a_plain_profile_name_loads(name):
    assert parse_profile(_rpi5_named(name), "my-board.yaml").name == name


# --- detokenize's token ids -----------------------------------------------------------------------------------


def test_detokenize_names_its_own_argument_for_an_id_past_the_vocabulary(tiny_bundle):
    """An id past the vocabulary was refused naming 'tokens[1]' (the HTTP route's JSON field) with the fix of an
    OpenAI request body; the method's argument is ids, as its other refusals (ids[0] is -1) name it."""
    from edgesdk.api import RequestError

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        vocabulary = model._completer.vocabulary()
        with pytest.raises(RequestError) as refused:
            model.detokenize([1, vocabulary])
        assert refused.value.param == "tokens[1]"
        assert f"tokens[1] is {vocabulary}; this model's vocabulary has ids 0 to {vocabulary - 1}" in str(refused.value)
        assert "tokenize() gives them" in refused.value.fix
        assert model.detokenize(model.tokenize("hi")) == b"hi"


@pytest.mark.parametrize("command", ["run", "plan"])
def test_the_cli_names_a_target_section_that_is_not_a_profile(tiny_bundle, tmp_path, monkeypatch, command):
    """``run --simulate-thermal`` and ``thermal plan BUNDLE`` read the same copy of the profile: pydantic's bare
    ValidationError came out of them as a traceback; now the refusal names the bundle and the keys."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    bundle = _edited_copy(tiny_bundle, tmp_path, lambda manifest: manifest["target"].pop("thermal"))
    args = ["run", str(bundle), "-p", "hi", "-n", "2", "-t", "1", "--simulate-thermal"] if command == "run" else \
        ["thermal", "plan", str(bundle), "--minutes", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # the CLI's refusal, not a traceback
    assert "in the manifest of bundle" in result.stderr
    assert "thermal: Field required" in result.stderr


def test_a_bundle_built_for_a_profile_whose_name_predates_the_rule_still_runs_guarded(tiny_bundle, tmp_path,
                                                                                        monkeypatch):
    """A profile file's name must be a plain name (what --target and the default bundle directory take), but a
    bundle built before that rule carries its profile's copy with the name as it was: the guard reads it as
    written, not refused."""
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    bundle = _edited_copy(tiny_bundle, tmp_path, lambda manifest: manifest["target"].__setitem__("name", "lab pi"))
    with pytest.raises(ProfileError, match="not a plain board name"):
        parse_profile(_rpi5_named("lab pi"))
    with edgesdk.load(bundle, threads=1, watch_thermal=True) as model:
        assert model.notes
