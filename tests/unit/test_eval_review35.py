"""Review findings in the bundle write and the evaluation: each test failed before its fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

DEFAULT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
TOOL_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"


def test_a_tokenizer_with_named_chat_templates_gets_its_default_one_in_the_bundle(tiny_bundle, tiny_model_dir,
                                                                                    tmp_path):
    """transformers reads a tokenizer_config listing named chat templates as a dict of them; the write named
    chat_template.jinja in the manifest but wrote no such file, so the finished build was refused by its own
    verification as a manifest 'edited by hand'. The default template (the one apply_chat_template uses for a
    chat without tools) is the bundle's; with no default the tool_use one, with neither none."""
    from edgesdk.build.package import write_bundle
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_eval_bundle_review33 import _write_args

    args = _write_args(tiny_bundle, tiny_model_dir)
    args["tokenizer"].chat_template = {"default": DEFAULT_TEMPLATE, "tool_use": TOOL_TEMPLATE}
    written = write_bundle(tmp_path / "named", **args)
    assert written.manifest["tokenizer"]["chat_template"] == "chat_template.jinja"
    assert (written.path / "chat_template.jinja").read_text(encoding="utf-8") == DEFAULT_TEMPLATE
    tokenizer = open_runtime(written.path, threads=1).tokenizer
    assert tokenizer.has_chat_template

    # with no default, the tool_use template is the bundle's, as llama.cpp's common_chat_templates_init takes it
    args["tokenizer"].chat_template = {"tool_use": TOOL_TEMPLATE}
    written = write_bundle(tmp_path / "no-default", **args)
    assert written.manifest["tokenizer"]["chat_template"] == "chat_template.jinja"
    assert (written.path / "chat_template.jinja").read_text(encoding="utf-8") == TOOL_TEMPLATE
    args["tokenizer"].chat_template = {"rag": TOOL_TEMPLATE}
    written = write_bundle(tmp_path / "neither", **args)
    assert written.manifest["tokenizer"]["chat_template"] is None
    assert not (written.path / "chat_template.jinja").exists()


@pytest.fixture(scope="module")
def bos_power_runtime(tmp_path_factory):
    """A power-gated bundle of a tiny Llama whose tokenizer puts BOS (<s>, id 1) in front of a text, as Llama 2's
    and Llama 3's do (Gemma 3 is refused by the power stage)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import CORPUS, tiny_llama, tiny_llama2_tokenizer
    from tests.unit.test_power_export import TINY_POWER

    root = tmp_path_factory.mktemp("bos-power")
    model_dir = root / "model"
    tiny_llama(vocab_size=384).save_pretrained(model_dir, safe_serialization=True)
    tiny_llama2_tokenizer().save_pretrained(model_dir)
    text = root / "train.txt"
    text.write_text(" ".join(CORPUS), encoding="utf-8")
    bundle = build(BuildConfig(target="rpi5", model=str(model_dir), out=root / "b", recipe="power", progress=False,
                               export=ExportConfig(max_context=256), overrides=TINY_POWER,
                               data=DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)))
    return open_runtime(bundle.path, threads=1, ignore_target=True)


def test_the_gated_evaluation_chooses_its_thresholds_on_windows_with_bos(bos_power_runtime, monkeypatch):
    """The gated points score windows that start with BOS, but the controller's tau was found decoding the text
    from its first token and the budgets' taus from the first window's gates without BOS: thresholds read on
    sequences such a model never sees. Every sequence the evaluation runs now starts with BOS, and a budget's tau
    is read off the gates of the windows as scored."""
    import numpy as np

    from edgesdk.evaluate import BUDGET_TOLERANCE, PerplexityConfig, gated_perplexity, leading_bos
    from tests._utils.tiny import CORPUS

    runtime = bos_power_runtime
    backend = runtime.backend
    bos = leading_bos(runtime.tokenizer)
    assert bos == 1
    text = " ".join(CORPUS)
    config = PerplexityConfig(context=32, stride=32, max_chars=600)
    ids = runtime.tokenizer.encode(text[:600], add_special_tokens=False)
    assert ids[0] != bos


    fed, prefill = [], backend.prefill

    def recording(window, *args, **kwargs):
        fed.append(np.asarray(window).copy())
        return prefill(window, *args, **kwargs)

    monkeypatch.setattr(backend, "prefill", recording)
    result = gated_perplexity(runtime, text, config, (0.7,))
    assert fed
    assert [int(window[0]) for window in fed] == [bos] * len(fed)
    # the tau is read off the gates of the windows as scored (with BOS, gating on: review 49), so it runs the budget
    assert result["curve"][0]["executed_fraction"] == pytest.approx(0.7, abs=BUDGET_TOLERANCE + 1e-4)
    assert (backend.gating, backend.fixed_tau) == (False, None)


def test_an_archive_of_the_bundles_files_without_its_directory_is_named_as_such(tiny_bundle, tmp_path):
    """'tar -C BUNDLE -cf X.tar .' puts manifest.json and the rest at the archive's top level; unpack said its
    first member 'would escape the bundle or is not a plain file', which none of them does. It names the layout
    and how to make the archive unpack takes; nothing is written."""
    import tarfile

    from edgesdk.bundle import unpack_bundle
    from edgesdk.errors import BundleError

    archive = tmp_path / "flat.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tiny_bundle.path, arcname=".")
    with pytest.raises(BundleError, match=r"holds a bundle's files at its top level \(manifest\.json") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert "escape" not in info.value.problem
    assert "tar -C PARENT -cf ARCHIVE NAME" in info.value.fix
    assert "edgesdk pack" in info.value.fix
    assert not (tmp_path / "dest").exists()
