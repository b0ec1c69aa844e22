"""Two loose ends: ``edgesdk eval --reference`` merges a bundle's LoRA adapters again, and the modules an adapter's
adapter_config.json leaves out reached the user as a raw Python warning (LoraMergeNote) where ``edgesdk build`` logs
its own line: eval now says the same line (one function words it). ``run -c N`` past the bundle's context hinted at
'edgesdk build --max-context N' without the model's max_position_embeddings, which the manifest did not record: the
build records it in the model's facts now, and the hint names the largest --max-context the model allows; a bundle
without it (built before) keeps loading, verifying, exporting and getting the former hint."""

from __future__ import annotations

import contextlib
import io
import json
import warnings

import click
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.cli import main  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir  # noqa: E402

EMBEDDING = "model.embed_tokens"


# ------------------------------------------------------------------------------------------ LoRA: eval's own line


@pytest.fixture(scope="module")
def adapter_bundle(tmp_path_factory):
    """A bundle built with a PEFT adapter whose adapter_config.json names q_proj only while it holds factors of
    v_proj, up_proj and the embedding too (left out, not merged), the adapter, the build's stderr and a text."""
    from transformers import AutoModelForCausalLM

    import edgesdk
    from tests.unit._lora_files41 import random_factors, write_peft

    root = tmp_path_factory.mktemp("loose61")
    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    factors = random_factors(base, targets=("q_proj", "v_proj", "up_proj"), rank=2)
    generator = torch.Generator().manual_seed(4)
    rows, width = base.model.embed_tokens.weight.shape
    embedding = {EMBEDDING: (torch.randn(2, rows, generator=generator), torch.randn(width, 2, generator=generator))}
    adapter = write_peft(root / "adapter", factors, {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]},
                         embedding=embedding)
    text = root / "text.txt"
    text.write_text("\n".join(CORPUS * 3))
    said = io.StringIO()
    with contextlib.redirect_stderr(said), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = edgesdk.build_bundle("host", str(model_dir), out=root / "b", recipe="fp32-standard", max_context=64,
                                   progress=False, lora=adapter)
    return out, adapter, said.getvalue(), text


def _eval(bundle, text, *extra):
    from edgesdk.models.lora import LoraMergeNote

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(main, ["eval", str(bundle), "--text", str(text), "--reference", "--threads", "1",
                                           *extra], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    return result, [item for item in caught if issubclass(item.category, LoraMergeNote)]


def test_eval_reference_says_the_modules_left_out_as_its_own_line_worded_as_the_build_s(adapter_bundle):
    """eval --reference printed the merge's LoraMergeNote as Python prints a warning (file, line, class name); the
    build logged its own line. Both now print the line lora.left_out_warning words."""
    bundle, adapter, built, text = adapter_bundle
    (record,) = json.loads((bundle / "manifest.json").read_text())["model"]["before"]["adapters"]
    left_out = record["ignored"]
    assert left_out == sorted([EMBEDDING, *(f"model.layers.{i}.{m}" for i in (0, 1)
                                            for m in ("mlp.up_proj", "self_attn.v_proj"))])

    result, notes = _eval(bundle, text, "--context", "32", "--json")
    assert notes == []
    assert "LoraMergeNote" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "are not merged" in line]
    assert lines == [
        f"edgesdk eval: warning: {len(left_out)} module(s) whose LoRA factors {adapter.resolve()} holds are not "
        "merged: its adapter_config.json's target_modules / layers_to_transform / exclude_modules leave them out, and "
        f"PEFT does not load them ({', '.join(left_out[:3])} and {len(left_out) - 3} more; the bundle's manifest "
        "records them all)"]
    json.loads(result.stdout)  # the figures alone on stdout

    from edgesdk.models.lora import left_out_warning  # one wording, the build's and eval's

    assert lines[0] == "edgesdk eval: " + left_out_warning(record, "the bundle's manifest")
    build_lines = [line for line in built.splitlines() if "are not merged" in line]
    assert build_lines == [f"edgesdk build:   {left_out_warning(record)}"]


def test_eval_reference_of_an_accuracy_task_says_the_line_too(adapter_bundle, tmp_path):
    bundle, _, _, _ = adapter_bundle
    tasks = tmp_path / "winogrande.csv"
    tasks.write_text("0,The fox jumped over the _ quickly.,dog,cat,1\n1,The runtime keeps _ cool.,boards,models,1\n")
    result, notes = _eval(bundle, tasks, "--winogrande")
    assert notes == []
    assert len([line for line in result.stderr.splitlines()
                if line.startswith("edgesdk eval: warning: ") and "are not merged" in line]) == 1


def test_a_bundle_whose_manifest_does_not_list_the_modules_is_not_said_to(adapter_bundle, capfd):
    """A bundle built before the build recorded them (its adapter record has no 'ignored'): the line names the
    first three and how many more, and does not send the user to a manifest that lacks them."""
    from edgesdk.cli_eval import _load_reference_model
    from edgesdk.models.lora import LoraAdapter
    from edgesdk.models.sources import resolve_model

    bundle, adapter, _, _ = adapter_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    source = resolve_model(manifest["model"]["before"]["source"])
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load_reference_model((source, (LoraAdapter(str(adapter)),)), 1, [{"path": str(adapter)}])
    assert not caught or all("LoraMergeNote" not in item.category.__name__ for item in caught)
    (line,) = [line for line in capfd.readouterr().err.splitlines() if "are not merged" in line]
    assert line.startswith("edgesdk eval: warning: 5 module(s) whose LoRA factors ")
    assert line.endswith(f"({EMBEDDING}, model.layers.0.mlp.up_proj, model.layers.0.self_attn.v_proj and 2 more)")
    assert "records them all" not in line


# ------------------------------------------------------------------------------- the model's positions, recorded


def test_the_build_records_the_model_s_positions_before_and_after(tiny_bundle, adapter_bundle):
    """tests/_utils/tiny.py's model has 512 positions; the tiny bundle is built at 256 tokens."""
    model = tiny_bundle.manifest["model"]
    assert model["before"]["max_position_embeddings"] == model["after"]["max_position_embeddings"] == 512
    assert tiny_bundle.manifest["graph"]["max_context"] == 256
    built = json.loads((adapter_bundle[0] / "manifest.json").read_text())["model"]
    assert built["before"]["max_position_embeddings"] == built["after"]["max_position_embeddings"] == 512


def test_a_loaded_model_s_facts_hold_its_positions(tmp_path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model(str(save_tiny_model_dir(tmp_path / "m", max_positions=300))))
    assert loaded.facts()["max_position_embeddings"] == 300


def _with_positions(source, destination, value):
    """``source``'s files in a new bundle whose model facts (before and after) hold ``value`` as
    max_position_embeddings (None: without the key, as a bundle built before it was recorded)."""
    from edgesdk.bundle import BundleWriter

    writer = BundleWriter(destination)
    for name in source.manifest["files"]:
        writer.add_file(source.path / name, name)
    body = {key: value for key, value in source.manifest.items()
            if key not in ("schema_version", "edgesdk_version", "created", "files", "bundle_id")}
    model = {}
    for key in ("before", "after"):
        facts = {name: fact for name, fact in body["model"][key].items() if name != "max_position_embeddings"}
        model[key] = facts if value is None else {**facts, "max_position_embeddings": value}
    body["model"] = {**body["model"], **model}
    return writer.commit(body)


@pytest.fixture(scope="module")
def older_bundle(tiny_bundle, tmp_path_factory):
    return _with_positions(tiny_bundle, tmp_path_factory.mktemp("older") / "b", None)


def test_a_bundle_without_the_positions_verifies_loads_and_exports_as_one_with_them(tiny_bundle, older_bundle,
                                                                                   tmp_path):
    """Every reader of the facts: verification (deploy and pack verify), opening to run, the power/thermal guard's
    FFN share (model.after), the GGUF export and the bundle's report."""
    from gguf import GGUFReader

    from edgesdk.bundle import verify_bundle
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime
    from edgesdk.thermal.guard import ffn_weight_share
    from edgesdk.thermal.watch import bundle_gate

    assert "max_position_embeddings" not in older_bundle.manifest["model"]["before"]
    shares, files = [], []
    for bundle in (tiny_bundle, older_bundle):
        verified = verify_bundle(bundle.path)
        runtime = open_runtime(bundle.path, threads=1)
        assert runtime.backend.max_context == 256
        gate = bundle_gate(runtime)
        shares.append(ffn_weight_share(verified.manifest["model"]["after"]))
        assert gate is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = export_gguf(bundle.path, tmp_path / f"{len(files)}.gguf")
        files.append(int(GGUFReader(str(report.path)).fields["llama.context_length"].contents()))
    assert shares[0] is not None
    assert shares[0] == shares[1]
    # the GGUF writes the model's trained context (max_position_embeddings, as llama.cpp's converter), and a bundle
    # whose manifest lacks it the graph's context
    assert files == [tiny_bundle.manifest["model"]["after"]["max_position_embeddings"], 256]


@pytest.mark.parametrize("value", ["512", 0, 2.5, True])
def test_a_recorded_position_limit_that_is_not_a_whole_number_is_refused(tiny_bundle, tmp_path, value):
    from edgesdk.errors import BundleError

    with pytest.raises(BundleError) as refused:
        _with_positions(tiny_bundle, tmp_path / "bad", value)
    assert f"'model.before.max_position_embeddings' must be a whole number from 1 to {(1 << 31) - 1} (the model's " \
           f"positions, in tokens), got {value!r}" in refused.value.problem
    assert "'model.after.max_position_embeddings' must be a whole number" in refused.value.problem


# ------------------------------------------------------------------------------------------------ run -c's hint


def _run_c(bundle, size) -> str:
    result = CliRunner().invoke(main, ["run", str(bundle), "-p", "hi", "-n", "1", "-t", "1", "-c", str(size)])
    assert result.exit_code == 2, result.output
    return " ".join(result.output.split())


def test_c_past_the_bundle_names_the_largest_max_context_the_model_allows(tiny_bundle):
    """The tiny bundle is 256 tokens of a 512-position model, built with --max-context 256: the hint said 256 was
    the model's cap and no build went past it; a build at --max-context 512 gives 512."""
    said = _run_c(tiny_bundle.path, 4096)
    assert "is 256 tokens, fixed when it was built" in said, said
    assert said.endswith("for a longer context rebuild the bundle with 'edgesdk build --max-context 512', the most "
                         "the model's max_position_embeddings (512) allows"), said
    assert "no build of the model goes past it" not in said, said


def test_c_past_the_bundle_within_the_model_s_positions_keeps_the_plain_hint(tiny_bundle):
    said = _run_c(tiny_bundle.path, 400)
    assert said.endswith("for another size rebuild the bundle with 'edgesdk build --max-context 400'"), said


def test_c_past_a_bundle_at_the_model_s_positions_says_no_build_goes_past_it(tiny_bundle, tmp_path):
    at_cap = _with_positions(tiny_bundle, tmp_path / "at-cap", 256)
    said = _run_c(at_cap.path, 4096)
    assert said.endswith("the model's max_position_embeddings is 256, this bundle's context: no build of the model "
                         "goes past it"), said
    assert "--max-context 4096" not in said, said


def test_c_past_a_bundle_without_the_positions_keeps_the_former_hint(older_bundle):
    said = _run_c(older_bundle.path, 4096)
    assert "'edgesdk build --max-context 4096', which the model's max_position_embeddings caps: where this bundle " \
           "was built without --max-context (4096 by default), 256 is that cap" in said, said


def test_the_context_variable_gets_the_model_s_limit_too(tiny_bundle, monkeypatch):
    from edgesdk.cli_llama import ctx_size_env_note

    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "4096")
    note = ctx_size_env_note(256, tiny_bundle.path)
    assert note.endswith("'edgesdk build --max-context 512', the most the model's max_position_embeddings (512) "
                         "allows"), note
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "lots")  # no size: the largest the model allows
    note = ctx_size_env_note(256, tiny_bundle.path)
    assert note.endswith("'edgesdk build --max-context N', N up to 512 (the model's max_position_embeddings)"), note


def test_serve_s_c_past_the_bundle_names_the_model_s_limit(tiny_bundle):
    from edgesdk.cli_serve import _check_ctx_size

    with click.Context(main.commands["serve"], **main.context_settings) as ctx:
        ctx.meta["edgesdk.llama.ctx_size"] = ("-c", 1024)
        with pytest.raises(click.BadParameter) as refused:
            _check_ctx_size([tiny_bundle.path])
    assert "'edgesdk build --max-context 512', the most the model's max_position_embeddings (512) allows" in \
        refused.value.message
