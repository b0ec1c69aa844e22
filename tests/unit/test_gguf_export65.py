"""GGUF export, round 65, as a llama.cpp user meets it: the file's context is the model's trained one, not the
bundle's --max-context; a pruned bundle's deci file is refused by a build with its own reason; two exports to the same
path each write their own temporary file; the source's model card, unknown token and name survive; X.GGUF is a GGUF
name; edgesdk.export_gguf is the Python API."""

from __future__ import annotations

import warnings

import pytest

from edgesdk.errors import ExportError, ModelSourceError

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

MODEL_POSITIONS = 512  # the tiny model's max_position_embeddings (tests/_utils/tiny.py), the bundles' context 64
README = """---
license: apache-2.0
language:
- en
tags:
- tiny
---
# A tiny model
"""


def _fields(path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A float32 bundle of a tiny model directory whose README.md has a model card's front matter."""
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("gguf65")
    model_dir = save_tiny_model_dir(root / "tiny-card", hidden=64, heads=4, kv_heads=2)
    (model_dir / "README.md").write_text(README, encoding="utf-8")
    return build_tiny_bundle(root, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                             model_dir=model_dir, generated_sequences=0)


def _export(bundle, out, **kwargs):
    import edgesdk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return edgesdk.export_gguf(bundle.path, out, **kwargs)


def test_the_context_length_is_the_models_trained_context_not_the_bundles(bundle, tmp_path):
    """llama.context_length was the bundle's --max-context (64 here, 4096 for SmolLM2's default bundle of a model
    trained on 8192), which llama.cpp and Ollama read as the trained context and a build from the file inherited."""
    assert bundle.manifest["graph"]["max_context"] != MODEL_POSITIONS
    report = _export(bundle, tmp_path / "model.gguf")
    assert _fields(report.path)["llama.context_length"] == MODEL_POSITIONS


def test_a_manifest_without_the_models_positions_gives_the_bundles_context():
    """Bundles built before the manifest recorded max_position_embeddings keep what the export wrote for them."""
    from types import SimpleNamespace

    from edgesdk.export.gguf_export import trained_context

    decoder = SimpleNamespace(max_context=64)
    assert trained_context({"model": {"before": {}, "after": {}}}, decoder) == 64
    assert trained_context({"model": {"before": {"max_position_embeddings": 8192}, "after": {}}}, decoder) == 8192


def test_two_exports_to_one_path_each_write_their_own_file(bundle, tmp_path, monkeypatch):
    """Both wrote DEST.partial: the second removed the first's, the first then verified and renamed the second's
    file, and the second failed with 'No such file or directory ... pick a path in an existing directory'. Here the
    second export runs while the first is writing its keys; both now finish, and no temporary file is left."""
    from edgesdk.export import gguf_export

    destination = tmp_path / "out" / "model.gguf"
    destination.parent.mkdir()
    add_tokenizer = gguf_export.add_tokenizer
    inner = []

    def with_a_second_export(writer, vocab, template):
        if not inner:  # the first export's: the second runs to its end here (its own call goes straight on)
            inner.append(None)
            inner[0] = _export(bundle, destination)
        add_tokenizer(writer, vocab, template)

    monkeypatch.setattr(gguf_export, "add_tokenizer", with_a_second_export)
    outer = _export(bundle, destination)
    assert inner[0].path == outer.path == destination
    assert outer.verified_tensors == inner[0].verified_tensors > 0
    assert _fields(destination)["general.architecture"] == "llama"
    assert sorted(path.name for path in destination.parent.iterdir()) == ["model.gguf"]


def test_a_stale_file_at_the_old_partial_name_is_left_alone(bundle, tmp_path):
    """Another export's (or anyone's) file at NAME.partial is no longer removed or written through."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.gguf.partial").write_text("another export's")
    report = _export(bundle, out / "model.gguf")
    assert (out / "model.gguf.partial").read_text() == "another export's"
    assert report.path.read_bytes()[:4] == b"GGUF"


def test_the_model_card_the_unknown_token_and_a_name_without_a_file_type_are_written(bundle, tmp_path):
    """The source's license, languages and tags were dropped, tokenizer.ggml.unknown_token_id was missing where the
    BPE model's own unk_token is null (the tokenizer's is <|endoftext|>, id 0, as SmolLM2's)."""
    assert bundle.manifest["tokenizer"]["unk_token"] == "<|endoftext|>"
    fields = _fields(_export(bundle, tmp_path / "model.gguf").path)
    assert fields["tokenizer.ggml.unknown_token_id"] == 0
    assert bundle.manifest["model"]["before"]["card"] == {"license": "apache-2.0", "languages": ["en"]}
    assert fields["general.license"] == "apache-2.0"
    assert fields["general.languages"] == ["en"]
    assert fields["general.name"] == f"tiny-card (r, edgesdk bundle {bundle.bundle_id})"


def test_a_gguf_sources_card_is_read_and_its_name_replaces_the_files(tmp_path):
    """general.name was the source file's name with its quantization type ('SmolLM2-135M-Instruct.Q4_1.gguf (fp32-
    fused, ...)') for a file of F32 weights; the card's name now, else the file's without type and extension."""
    from edgesdk.export.gguf_export import add_card, gguf_name
    from tests._utils.gguf_files import close_gguf

    manifest = {"model": {"before": {}, "after": {"source": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}},
                "recipe": {"name": "fp32-fused"}, "bundle_id": "abc"}
    assert gguf_name(manifest) == "SmolLM2-135M-Instruct (fp32-fused, edgesdk bundle abc)"
    card = {"name": "Smollm2 135M", "basename": "smollm2", "license": "apache-2.0", "languages": ["en"],
            "size_label": 135, "organization": ""}  # values a file cannot hold as the card's strings: left out
    manifest["model"]["before"]["card"] = card
    assert gguf_name(manifest) == "Smollm2 135M (fp32-fused, edgesdk bundle abc)"
    path = tmp_path / "card.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    add_card(writer, manifest)
    fields = _fields(close_gguf(writer, path))
    assert {key: value for key, value in fields.items() if key != "general.architecture"} == {
        "general.basename": "smollm2", "general.license": "apache-2.0", "general.languages": ["en"]}


def test_the_card_of_a_gguf_source_is_recorded(tmp_path):
    from edgesdk.models.loader import source_card
    from edgesdk.models.sources import ModelSource
    from tests._utils.gguf_files import close_gguf

    path = tmp_path / "card.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("name", "Smollm2 135M 8k"), ("basename", "smollm2"), ("finetune", "8k"),
                       ("size_label", "135M"), ("organization", "HuggingFaceTB"), ("license", "apache-2.0")):
        writer.add_string(f"general.{key}", value)
    writer.add_array("general.languages", ["en"])
    close_gguf(writer, path)
    assert source_card(ModelSource(kind="gguf", path=path, name=str(path))) == {
        "name": "Smollm2 135M 8k", "basename": "smollm2", "finetune": "8k", "size_label": "135M",
        "organization": "HuggingFaceTB", "license": "apache-2.0", "languages": ["en"]}


def test_an_upper_case_gguf_suffix_is_a_gguf_file(bundle, tmp_path):
    report = _export(bundle, tmp_path / "MODEL.GGUF", verify=False)
    assert report.path.name == "MODEL.GGUF"
    assert report.path.read_bytes()[:4] == b"GGUF"
    with pytest.raises(ExportError, match="does not end in .gguf"):
        _export(bundle, tmp_path / "model.bin")


def test_a_deci_file_is_refused_by_a_build_with_its_reason(tmp_path):
    """edgesdk writes deci for pruned bundles; a build from such a file was told 'which edgesdk cannot export' and
    given the list of architectures, not why or what to build from."""
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

    tokens = ["<unk>", "<s>", "</s>"] + [chr(code) for code in range(97, 123)]
    source = one_layer_llama_gguf(tmp_path / "llama.gguf", "llama", tokens, [2, 3, 3] + [1] * 26,
                                  scores=[0.0] * len(tokens))
    for arch in ("deci", "mamba"):
        path = rewrite_gguf(source, tmp_path / f"{arch}.gguf", architecture=arch)
        with pytest.raises(ModelSourceError) as refused:
            load_model(resolve_model(str(path)), progress=False)
        assert "cannot export" not in str(refused.value)
        if arch == "deci":
            assert "edgesdk writes 'deci' for pruned bundles" in str(refused.value)
            assert "cannot build from it" in str(refused.value)
            assert "build from the original model" in refused.value.fix
        else:
            assert "which edgesdk cannot build from" in str(refused.value)
