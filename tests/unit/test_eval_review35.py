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
    chat without tools) is the bundle's; with no default there is none."""
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

    args["tokenizer"].chat_template = {"tool_use": TOOL_TEMPLATE}
    written = write_bundle(tmp_path / "no-default", **args)
    assert written.manifest["tokenizer"]["chat_template"] is None
    assert not (written.path / "chat_template.jinja").exists()
