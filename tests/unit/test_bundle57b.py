"""Bundle integrity, review 57: a bundle whose files verify but whose manifest or files hold what the runtime cannot
use is refused with a BundleError that names the file or field and the fix, not a raw traceback: a chat template
that is not UTF-8 text, and a manifest without the facts the runtime reads, in ``edgesdk bench`` and in
``edgesdk serve`` with several bundles as in ``edgesdk run``."""

from __future__ import annotations

import pytest

from edgesdk.bundle import BundleWriter, verify_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle57 import MINIMAL_MANIFEST, rewrite_manifest

# A manifest check_runnable passes: the graph facts the runtime sizes its KV cache with, the model's facts
RUNNABLE_MANIFEST = {**MINIMAL_MANIFEST,
                     "model": {"before": {"source": "org/tiny-model", "hidden_size": 8}},
                     "graph": {"file": "report.md", "kv_heads": [1], "head_dim": 4, "max_context": 64,
                               "vocab_size": 16}}


def _write_bundle(path, manifest, files: dict[str, bytes]):
    writer = BundleWriter(path)
    writer.write_text("report.md", "# report\n")
    for name, data in files.items():
        (writer.staging / name).write_bytes(data)
    return writer.commit(manifest)


def _tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str().encode()


@pytest.mark.parametrize("template", ["chat_template.jinja", "model.onnx.data"])
def test_a_chat_template_that_is_not_utf8_is_a_bundle_error_naming_it(tmp_path, template):
    """A manifest whose tokenizer.chat_template names the weights, or a chat_template.jinja that is not UTF-8 (its
    digest matching), gave a raw UnicodeDecodeError from the tokenizer: in open_runtime, and in serve's
    description of a model not yet loaded."""
    from edgesdk.serve.completion import ServeDefaults
    from edgesdk.serve.model_pool import described

    manifest = {**RUNNABLE_MANIFEST, "tokenizer": {"file": "tokenizer.json", "chat_template": template}}
    bundle = _write_bundle(tmp_path / "bundle", manifest,
                           {"tokenizer.json": _tokenizer_json(), template: b"\x80\xff{{ messages }}\xfe"})
    bundle = verify_bundle(bundle.path)
    with pytest.raises(BundleError, match=f"{bundle.path / template} is not a chat template: it does not read as "
                                          "UTF-8 text") as caught:
        described(bundle, ServeDefaults(), None)
    if template == "chat_template.jinja":  # the manifest already names it: pointing it there again changes nothing
        assert caught.value.fix == "rebuild the bundle with 'edgesdk build'"
    else:
        assert caught.value.fix.startswith("point the manifest's 'tokenizer.chat_template' at the bundle's "
                                           "chat_template.jinja")


def test_bench_refuses_a_bundle_without_max_context_as_run_does(tmp_path):
    """``edgesdk bench`` read graph.max_context from the manifest before any check: a verified manifest without it
    gave a raw KeyError: 'max_context', where ``edgesdk run`` refuses the bundle by name (check_runnable)."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    bundle = _write_bundle(tmp_path / "bundle", RUNNABLE_MANIFEST, {})
    rewrite_manifest(bundle.path, lambda manifest: manifest["graph"].pop("max_context"))
    verify_bundle(bundle.path)  # verification accepts it: deploy and pack need no graph facts
    result = CliRunner().invoke(main, ["bench", str(bundle.path), "-p", "8", "-n", "0"])
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert f"error: bundle {bundle.path}: manifest.json cannot be run:" in result.output
    assert "'graph.max_context' must be a whole number" in result.output
    assert "fix: the manifest was edited by hand; rebuild the bundle with 'edgesdk build'" in result.output


def test_serve_with_several_bundles_refuses_one_without_model_before_as_run_does(tmp_path):
    """``edgesdk serve B1 B2`` named every bundle's model from its manifest first: a B2 without model.before gave a
    raw KeyError: 'before' (served_model_name), where ``edgesdk run B2`` refuses it by name (check_runnable)."""
    from edgesdk.cli_serve import _served_models

    first = _write_bundle(tmp_path / "first", RUNNABLE_MANIFEST, {})
    second = _write_bundle(tmp_path / "second", {**RUNNABLE_MANIFEST, "model": {}}, {})
    with pytest.raises(BundleError, match=r"'model\.before' must be a mapping with a 'source' string") as caught:
        _served_models([first.path, second.path], ())
    assert str(second.path) in str(caught.value)
    assert caught.value.fix == "the manifest was edited by hand; rebuild the bundle with 'edgesdk build'"
    assert _served_models([first.path], ()) == [("tiny-model-host", first.path)]
