"""The special tokens a chat template is given, review 64: the build recorded only ``pad_token`` besides BOS and EOS,
so a template writing ``{{ unk_token }}`` or ``{{ mask_token }}`` rendered them empty from the bundle where
transformers' ``apply_chat_template`` (its tokenizer's ``special_tokens_map``) writes the token: SmolLM2's and Qwen's
``unk_token`` lives in tokenizer_config.json, not in tokenizer.json's model, a GGUF file's in
``tokenizer.ggml.unknown_token_id``, and Gemma's ``mask_token`` in neither. The manifest now records the tokenizer's
unk/sep/cls/mask text where it has one; verification takes them as strings, refuses another type, and still takes
a bundle built before they were recorded."""

from __future__ import annotations

import hashlib
import json
import warnings

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, verify_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle52 import write_bundle

pytest.importorskip("torch")
pytest.importorskip("transformers")

USER = [{"role": "user", "content": "hi"}]
# every special token transformers passes beside BOS and EOS, and whether it is passed at all
SPECIALS = ("{{ messages[0]['content'] }}[{{ pad_token }}][{{ unk_token }}][{{ sep_token }}][{{ cls_token }}]"
            "[{{ mask_token }}][{{ unk_token is defined }}|{{ sep_token is defined }}|{{ cls_token is defined }}"
            "|{{ mask_token is defined }}]")
NEW_KEYS = ("unk_token", "sep_token", "cls_token", "mask_token")


def _hf_source(root, kind: str):
    """A tiny Hugging Face model directory whose tokenizer (byte-level: unk_token only in tokenizer_config.json, as
    SmolLM2's; gemma: Gemma's <unk> and <mask>) renders with SPECIALS."""
    from transformers import AutoTokenizer

    from tests._utils.tiny import save_tiny_model_dir

    source = save_tiny_model_dir(root / "model", tokenizer=kind, hidden=32, heads=2, kv_heads=1, layers=1)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = SPECIALS
    tokenizer.save_pretrained(source)
    return source, lambda: AutoTokenizer.from_pretrained(source)


def _gguf_source(root):
    """A one-layer GGUF whose byte-level vocabulary names its unknown token by tokenizer.ggml.unknown_token_id,
    with SPECIALS as its tokenizer.chat_template."""
    gguf = pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

    tokens = [*"abcdefghi", "ab", "abc", "\u0120", "\u0120a", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    raw = one_layer_llama_gguf(root / "raw.gguf", "gpt2", tokens, [1] * 13 + [3] * 3,
                               merges=["a b", "ab c", "\u0120 a"], pre="smollm", bos=14, eos=15, unk=13)
    (root / "model").mkdir()
    source = rewrite_gguf(raw, root / "model" / "tiny.gguf",
                          fields={"tokenizer.chat_template": (SPECIALS, gguf.GGUFValueType.STRING)})
    return source, lambda: AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)


def _build(source, out):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and torch's notes on the tiny model
        return build(BuildConfig(target="host", model=str(source), out=out, export=ExportConfig(max_context=64),
                                 progress=False))


@pytest.mark.parametrize(("kind", "recorded"), [
    ("byte-level", {"unk_token": "<|endoftext|>"}),
    ("gemma", {"unk_token": "<unk>", "mask_token": "<mask>"}),
    ("gguf", {"unk_token": "<|endoftext|>"}),
])
def test_a_built_bundle_renders_the_special_tokens_as_transformers_does(tmp_path, kind, recorded):
    """Built from a Hugging Face directory or a GGUF file, the bundle records the tokenizer's unk/sep/cls/mask
    tokens it has (and no key for one it has not), and its chat prompt, rendered by the runtime a run opens, is
    transformers' apply_chat_template on the source tokenizer byte for byte: the tokens it has written, the others
    undefined in both."""
    from edgesdk.runtime.session import open_runtime

    source, reference = _gguf_source(tmp_path) if kind == "gguf" else _hf_source(tmp_path, kind)
    bundle = _build(source, tmp_path / "bundle")

    facts = bundle.manifest["tokenizer"]
    assert {key: facts[key] for key in NEW_KEYS if key in facts} == recorded
    expected = reference().apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    rendered = open_runtime(bundle.path, threads=1).tokenizer.render_chat(USER)
    assert rendered.encode() == expected.encode()
    assert rendered.startswith(f"hi[{facts['pad_token'] or ''}][{recorded['unk_token']}]")
    assert f"[{recorded.get('mask_token', '')}][True|" in rendered


def _rewrite_manifest(path, change) -> None:
    """Change a bundle's manifest.json in place and write its digest again (as an edit on purpose would)."""
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text)
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")


def test_verification_takes_the_recorded_tokens_as_strings_and_a_bundle_without_them(tmp_path):
    """The new keys are the token's text: a string verifies, a bundle built before they were recorded (no such keys)
    verifies, and a number, a list or null is refused naming the key and what it must be."""
    bundle = write_bundle(tmp_path / "b")
    assert not set(NEW_KEYS) & set(verify_bundle(bundle).manifest["tokenizer"])
    _rewrite_manifest(bundle, lambda manifest: manifest["tokenizer"].update(
        unk_token="<unk>", sep_token="[SEP]", cls_token="[CLS]", mask_token="<mask>"))
    assert verify_bundle(bundle).manifest["tokenizer"]["mask_token"] == "<mask>"

    for key, value in (("unk_token", 0), ("mask_token", ["<mask>"]), ("sep_token", None)):
        _rewrite_manifest(bundle, lambda manifest, key=key, value=value: manifest["tokenizer"].update({key: value}))
        with pytest.raises(BundleError) as refused:
            verify_bundle(bundle)
        assert f"'tokenizer.{key}' must be the token's text, a string" in str(refused.value)
        assert f"got {value!r}" in str(refused.value)
        _rewrite_manifest(bundle, lambda manifest, key=key: manifest["tokenizer"].update({key: "<t>"}))


def test_edgesdk_verify_refuses_a_recorded_token_that_is_no_string(tmp_path):
    """The command a user runs on a bundle says which key is wrong, and exits non-zero."""
    from tests._utils.deploy import edgesdk

    bundle = write_bundle(tmp_path / "b")
    _rewrite_manifest(bundle, lambda manifest: manifest["tokenizer"].update(unk_token=3))
    refused = edgesdk("verify", bundle, timeout=120)
    assert refused.returncode != 0
    assert "'tokenizer.unk_token' must be the token's text, a string" in refused.stderr
    assert "got 3" in refused.stderr
