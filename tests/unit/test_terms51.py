"""Review 51 (terms): a tokenizer whose chat templates are named ({"tool_use": ...} without a "default") is built
with the template llama.cpp takes for it; the build's refusals a build_bundle() caller meets in the target profile,
model source, output directory and power stage name its arguments, not edgesdk build's flags."""

from __future__ import annotations

import json
import shutil

import pytest

from edgesdk.errors import BuildError
from tests._utils.tiny import CHAT_TEMPLATE

TOOL_TEMPLATE = CHAT_TEMPLATE.replace("<|im_start|>assistant", "<|im_start|>assistant tool")


def _named_templates_dir(tiny_model_dir, folder, templates: dict):
    """A copy of the tiny model directory whose tokenizer_config.json lists ``templates`` by name, as a Hub
    tokenizer with several does (``"chat_template": [{"name": ..., "template": ...}, ...]``) and no
    chat_template.jinja."""
    model = shutil.copytree(tiny_model_dir, folder)
    for file in model.glob("chat_template*"):
        file.unlink()
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["chat_template"] = [{"name": name, "template": text} for name, text in templates.items()]
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return model


def test_a_tool_use_template_without_a_default_is_the_bundles_template(tiny_model_dir, tmp_path):
    """llama.cpp (common/chat.cpp, common_chat_templates_init) takes the tool_use template as the default where
    the model has no default one; edgesdk kept only "default" and built the bundle with no chat template at all."""
    from edgesdk.api import build_bundle

    model = _named_templates_dir(tiny_model_dir, tmp_path / "model", {"tool_use": TOOL_TEMPLATE, "rag": "RAG"})
    out = build_bundle("host", str(model), out=tmp_path / "b", recipe="fp32-fused", max_context=32, progress=False)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["tokenizer"]["chat_template"] == "chat_template.jinja"
    assert manifest["tokenizer"]["chat_template_name"] == "tool_use"
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == TOOL_TEMPLATE
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "- chat template: the tokenizer's 'tool_use' template, of 'rag', 'tool_use' (it has no 'default'" in report


def _tokenizer_with(templates):
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = templates
    return tokenizer


@pytest.mark.parametrize(("templates", "expected"), [
    ({"default": CHAT_TEMPLATE, "tool_use": TOOL_TEMPLATE}, (CHAT_TEMPLATE, "default")),
    ({"tool_use": TOOL_TEMPLATE}, (TOOL_TEMPLATE, "tool_use")),
    ({"default": "", "tool_use": TOOL_TEMPLATE}, (TOOL_TEMPLATE, "tool_use")),  # llama.cpp: an empty default
    ({"rag": "RAG"}, (None, None)),
    (CHAT_TEMPLATE, (CHAT_TEMPLATE, None)),
])
def test_the_template_kept_of_named_ones(templates, expected):
    from edgesdk.build.package import chat_template, chosen_chat_template

    tokenizer = _tokenizer_with(templates)
    assert chosen_chat_template(tokenizer) == expected
    assert chat_template(tokenizer) == expected[0]


def test_the_report_says_when_no_named_template_is_kept():
    from edgesdk.build.package import _template_line

    assert _template_line(_tokenizer_with({"rag": "RAG", "x": "X"})) == [
        "- chat template: none kept: the tokenizer's named templates ('rag', 'x') include neither 'default' nor "
        "'tool_use', the ones llama.cpp reads"]
    assert _template_line(_tokenizer_with(CHAT_TEMPLATE)) == []


# --- build_bundle()'s refusals in its own terms ---------------------------------------------------------------------

def _power_refusal(terms, model, out, overrides):
    """The power stage's refusal of a build given ``overrides``, run as build_bundle() runs it (terms "python") or
    as edgesdk build does (a BuildConfig with the default terms)."""
    from edgesdk.api import build_bundle
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    if terms == "python":
        def run():
            build_bundle("host", str(model), out=out, recipe="power", max_context=32, overrides=overrides,
                         generated_sequences=2, progress=False)
    else:
        def run():
            build(BuildConfig(target="host", model=str(model), out=out, recipe="power", overrides=tuple(overrides),
                              data=DataConfig(generated_sequences=2), export=ExportConfig(max_context=32),
                              progress=False))
    with pytest.raises(BuildError) as refused:
        run()
    return refused.value


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_the_power_stages_refusals_name_the_callers_terms(tiny_model_dir, tmp_path, terms):
    """A peak layer the model lacks, and too little training text for the prompts: the fix named edgesdk build's
    --set and --data to a build_bundle() caller, who passes overrides=[...] and data."""
    peak = _power_refusal(terms, tiny_model_dir, tmp_path / "a",
                          ["power.peak_layers=[5]", "power.bucket_size=8", "power.profile_up_to=16"])
    assert peak.problem.startswith("power.peak_layers names layer 5, but the model has 2 decoder layers")
    few = _power_refusal(terms, tiny_model_dir, tmp_path / "b", ["power.prompt_tokens=440"])
    assert "too few for prompts of 440" in few.problem
    if terms == "cli":
        assert peak.fix == "set power.peak_layers to layers the model has, e.g. --set 'power.peak_layers=[-1]' (the last)"
        assert few.fix == "pass more --data text or lower power.prompt_tokens"
    else:
        assert peak.fix == ("set power.peak_layers to layers the model has, e.g. overrides=['power.peak_layers=[-1]'] "
                            "(the last)")
        assert few.fix == ("pass more training text in data, or lower power.prompt_tokens "
                           "(overrides=['power.prompt_tokens=N'])")


def _mount_point():
    import os

    return next((path for path in ("/proc", "/sys", "/dev") if os.path.ismount(path)), None)


def test_a_mount_point_as_out_is_refused_in_build_bundles_terms():
    """build_bundle(out=<a mount point>): the fix said 'pass out a new directory', not a directory inside it as the
    CLI's says; it names out= with the directory to pass now."""
    from pathlib import Path

    from edgesdk.api import build_bundle
    from edgesdk.bundle import check_replaceable
    from edgesdk.errors import BundleError

    mount = _mount_point()
    if mount is None:
        pytest.skip("no mount point among /proc, /sys, /dev")
    with pytest.raises(BundleError, match="is a mount point") as refused:
        build_bundle("rpi5", out=mount, progress=False)
    assert refused.value.fix == f"pass out a directory inside it instead, e.g. out={str(Path(mount) / 'bundle')!r}"
    with pytest.raises(BundleError) as cli:  # edgesdk build's wording kept
        check_replaceable(Path(mount))
    assert cli.value.fix == f"pass --out a directory inside it instead, e.g. {Path(mount) / 'bundle'}"


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_an_output_directory_taken_while_writing_names_the_callers_terms(tmp_path, terms):
    """Files put in the output directory after the build's check and before the bundle is moved there: the
    commit's refusal named --out to a build_bundle() caller."""
    from edgesdk.bundle import BundleWriter
    from edgesdk.errors import BundleError

    out = tmp_path / "b"
    writer = BundleWriter(out, terms)
    writer.write_text("report.md", "r")
    out.mkdir()
    (out / "mine.txt").write_text("mine", encoding="utf-8")
    manifest = {key: {} for key in ("target", "model", "graph", "tokenizer", "runtime")} | {"stages": []}
    with pytest.raises(BundleError, match="holds files and is not a bundle") as refused:
        writer.commit(manifest)
    writer.discard()
    assert refused.value.fix == ("pass --out a new directory (or an earlier bundle to replace)" if terms == "cli"
                                 else "pass out a new directory (or an earlier bundle to replace)")
    assert (out / "mine.txt").read_text(encoding="utf-8") == "mine"


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_an_unknown_target_names_the_callers_terms(terms):
    from edgesdk.errors import ProfileError
    from edgesdk.profile import get_profile

    with pytest.raises(ProfileError, match="unknown target 'rpi9'; known targets: ") as refused:
        get_profile("rpi9", terms)
    assert refused.value.fix == (
        "run 'edgesdk targets list', or pass the path of your own profile YAML" if terms == "cli" else
        "pass one of the known targets as target (e.g. target='rpi5'), or the path of your own profile YAML")


@pytest.mark.parametrize("terms", ["cli", "python"])
def test_a_profile_file_that_is_not_valid_names_the_callers_terms(tmp_path, terms):
    from edgesdk.errors import ProfileError
    from edgesdk.profile import get_profile

    profile = tmp_path / "board.yaml"
    profile.write_text("name: board\n", encoding="utf-8")
    with pytest.raises(ProfileError) as refused:
        get_profile(str(profile), terms)
    assert refused.value.fix == (
        "compare the file with a shipped profile (edgesdk targets show rpi5)" if terms == "cli" else
        "compare the file with a shipped profile "
        "(print(yaml.safe_dump(edgesdk.profile.get_profile('rpi5').summary(), sort_keys=False)))")


def _model_refusal(spec, terms):
    from edgesdk.errors import ModelSourceError
    from edgesdk.models.sources import resolve_model

    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(spec), progress=False, terms=terms)
    return refused.value


def test_model_refusals_name_the_callers_terms(tmp_path):
    """The model source's refusals: the CLI's fixes as they were, build_bundle()'s naming model (and lora), never
    --model or an edgesdk command."""
    import shlex

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}", encoding="utf-8")
    (hf / "model.safetensors").write_bytes(b"x")
    ggufs = tmp_path / "ggufs"
    ggufs.mkdir()
    (ggufs / "a.gguf").write_bytes(b"GGUF")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "/models/base"}', encoding="utf-8")
    (adapter / "adapter_model.safetensors").write_bytes(b"x")
    quantized = tmp_path / "quantized"
    quantized.mkdir()
    (quantized / "config.json").write_text('{"quantization_config": {"quant_method": "awq"}}', encoding="utf-8")
    cases = [  # (spec, the CLI's fix, build_bundle()'s fix)
        ("no-such-model", "run 'edgesdk models list', or pass a Hugging Face directory or a .gguf file",
         "pass one of the aliases named above as model, or a Hugging Face directory or a .gguf file"),
        (hf / "model.safetensors", f"pass the directory: --model {shlex.quote(str(hf))}",
         f"pass the directory: model={str(hf)!r}"),
        (ggufs, f"pass one GGUF file with --model, e.g. --model {shlex.quote(str(ggufs / 'a.gguf'))}",
         f"pass one GGUF file as build_bundle()'s model, e.g. model={str(ggufs / 'a.gguf')!r}"),
        (adapter, "pass the base model with --model and the adapter with --lora: edgesdk build --model /models/base "
                  f"--lora {shlex.quote(str(adapter))} (the base as a local directory or .gguf file: edgesdk does not "
                  "download Hub ids)",
         f"pass the base model as model and the adapter as lora: build_bundle(target, model='/models/base', "
         f"lora={str(adapter)!r}) (the base as a local directory or .gguf file: edgesdk does not download Hub ids)"),
        (quantized, "build from the unquantized checkpoint this one was made from (pass its directory with --model), "
                    "or pass a GGUF file of the model with --model (F16, Q8_0, or a k-quant such as Q4_K_M: edgesdk "
                    "reads GGUF and de-quantizes it to float32)",
         "build from the unquantized checkpoint this one was made from (pass its directory as build_bundle()'s "
         "model), or pass a GGUF file of the model as build_bundle()'s model (F16, Q8_0, or a k-quant such as "
         "Q4_K_M: edgesdk reads GGUF and de-quantizes it to float32)"),
    ]
    for spec, cli, python in cases:
        assert _model_refusal(spec, "cli").fix == cli
        assert _model_refusal(spec, "python").fix == python
        assert "--" not in python
        assert "edgesdk build" not in python


@pytest.mark.parametrize(("terms", "option", "expected"), [
    ("cli", "--model", "pass one snapshot directory with --model, e.g. --model {}"),
    ("python", "--model", "pass one snapshot directory as build_bundle()'s model, e.g. model={!r}"),
    ("cli", "--lora", "pass one snapshot directory with --lora, e.g. --lora {}"),
    ("python", "--lora", "pass one snapshot directory as build_bundle()'s lora, e.g. lora={!r}"),
])
def test_a_hub_cache_entry_with_several_snapshots_names_the_option_it_was_given_as(tmp_path, terms, option, expected):
    """A Hub cache entry with two snapshots and no refs/main: the fix names the option the entry was given with
    (edgesdk/models/lora.py reads an adapter's entry with it too) in the caller's terms."""
    from edgesdk.errors import ModelSourceError
    from edgesdk.models.sources import _hub_cache_snapshot

    entry = tmp_path / "models--org--name"
    for name in ("a1", "b2"):
        (entry / "snapshots" / name).mkdir(parents=True)
    with pytest.raises(ModelSourceError, match="has no refs/main and 2 snapshots") as refused:
        _hub_cache_snapshot(entry, terms, option)
    assert refused.value.fix == expected.format(str(entry / "snapshots" / "a1"))


def test_build_bundle_s_own_target_and_model_refusals_are_in_its_terms(tmp_path):
    """build_bundle() passes its terms to the profile and the model source (edgesdk/build/pipeline.py): an unknown
    target or model names the ``target`` / ``model`` arguments, never ``edgesdk targets list`` or ``--model``."""
    from edgesdk import build_bundle
    from edgesdk.errors import EdgeSDKError

    with pytest.raises(EdgeSDKError) as refused:
        build_bundle("rpi9", "smollm2-135m", out=tmp_path / "a", progress=False)
    assert "target=" in refused.value.fix
    assert "edgesdk targets" not in refused.value.fix
    with pytest.raises(EdgeSDKError) as refused:
        build_bundle("host", "no-such-model-alias", out=tmp_path / "b", progress=False)
    assert "--model" not in str(refused.value) + refused.value.fix
