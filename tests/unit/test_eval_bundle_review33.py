"""Bundle writing, verification and evaluation: faults found in review, each shown on real files and a
real (tiny) bundle."""

from __future__ import annotations

import os

import pytest

from edgesdk.errors import BundleError


def _write_args(tiny_bundle, tiny_model_dir) -> dict:
    """write_bundle's inputs for the session's tiny bundle, taken from it (its graph and weights are the export)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgesdk.build.recipes import load_recipe
    from edgesdk.profile import get_profile

    manifest = tiny_bundle.manifest
    return {"export_dir": tiny_bundle.path, "graph": {k: v for k, v in manifest["graph"].items() if k != "file"},
            "validation": manifest["export_validation"], "profile": get_profile("host"),
            "recipe": load_recipe(manifest["recipe"]["name"]), "stages": [],
            "model": AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            "tokenizer": AutoTokenizer.from_pretrained(tiny_model_dir),
            "facts_before": manifest["model"]["before"], "facts_after": manifest["model"]["after"]}


def test_a_bundle_write_that_fails_leaves_no_hidden_partial_copy(tiny_bundle, tiny_model_dir, tmp_path):
    """The write stages the whole bundle (weights included) in .NAME.partial beside the output; a write refused
    or stopped (here: the output directory came to hold the user's files while the build ran) removed nothing,
    so a copy of the weights stayed there, hidden, until another build to the same output."""
    from edgesdk.build.package import write_bundle

    args = _write_args(tiny_bundle, tiny_model_dir)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(BundleError, match="holds files and is not a bundle"):
        write_bundle(out, **args)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no .out.partial
    assert sorted(os.listdir(out)) == ["notes.txt"]

    written = write_bundle(tmp_path / "fresh", **args)  # the same inputs make a bundle where nothing is in the way
    assert sorted(os.listdir(tmp_path)) == ["fresh", "out"]
    assert written.manifest["graph"] == tiny_bundle.manifest["graph"]


def _copy(bundle, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(bundle.path, copy)
    return copy


def _unreadable_file(path, monkeypatch):
    """``path`` made unreadable (chmod 000); root reads past that, so there opening it for reading is refused as
    an ordinary user is refused (the sha256 of a bundle file reads it with open)."""
    import builtins
    import errno

    from tests._utils.unreadable import make_unreadable

    make_unreadable(path, monkeypatch)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        original = builtins.open

        def refuse(file, *args, **kwargs):
            if os.fspath(file) == os.fspath(path):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
            return original(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", refuse)
    return path


def test_a_bundle_file_this_user_cannot_read_is_a_named_refusal(tiny_bundle, tmp_path, monkeypatch):
    """A bundle copied by another user with a tight umask (or read off a failing card): the hash of a file it
    cannot read ended verification, so run, eval, bench and pack, in a PermissionError traceback."""
    from edgesdk.bundle import verify_bundle

    copy = _copy(tiny_bundle, tmp_path)
    _unreadable_file(copy / "model.onnx.data", monkeypatch)
    with pytest.raises(BundleError) as refused:
        verify_bundle(copy)
    assert "model.onnx.data: cannot be read (Permission denied)" in refused.value.problem
    assert f"chmod -R a+rX {copy}" in refused.value.fix
    assert "for the other files" not in refused.value.fix  # the only problem


def test_a_manifest_digest_this_user_cannot_read_is_a_named_refusal(tiny_bundle, tmp_path, monkeypatch):
    from edgesdk.bundle import MANIFEST_DIGEST, read_manifest, verify_bundle
    from tests._utils.unreadable import make_unreadable

    copy = _copy(tiny_bundle, tmp_path)
    make_unreadable(copy / MANIFEST_DIGEST, monkeypatch)
    for check in (read_manifest, verify_bundle):
        with pytest.raises(BundleError, match=f"{MANIFEST_DIGEST} cannot be read \\(Permission denied\\)") as refused:
            check(copy)
        assert f"chmod -R a+rX {copy}" in refused.value.fix


# Words the tiny tokenizer splits into many tokens: 60 words past 256 tokens, the tiny bundle's max_context.
LONG_PARAGRAPH = " ".join(["extraordinarily complicated"] * 30) + " and then it slept ."


def test_a_last_word_paragraph_longer_than_the_bundle_keeps_its_last_tokens(tiny_bundle, tmp_path):
    """lm-evaluation-harness cuts a request longer than the model's max_length to its last tokens; here the
    bundle's prefill refused the paragraph ('exceeds the bundle's max_context ... shorten the prompt or
    --max-new-tokens'), ending 'eval --last-word' on text it had already read."""
    import json

    import numpy as np

    from edgesdk.evaluate import bundle_scorer, last_word_accuracy, last_word_documents
    from edgesdk.runtime.logprobs import log_softmax
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_cli import assert_ok, invoke

    runtime = open_runtime(tiny_bundle.path, threads=1)

    def encode(text):
        return runtime.tokenizer.encode(text, add_special_tokens=False)

    documents = last_word_documents(LONG_PARAGRAPH)
    context, word = documents[0]
    prefix, whole = encode(context), encode(f"{context} {word}")
    limit = runtime.backend.max_context
    assert len(whole) > limit + 1
    result = last_word_accuracy(bundle_scorer(runtime), encode, documents)

    fed = whole[-(limit + 1):-1]  # the harness's window: the last max_length tokens but the final one
    runtime.backend.reset()
    rows = log_softmax(runtime.backend.prefill(np.asarray(fed), keep_logits=len(fed)))
    word_rows, targets = rows[len(fed) - (len(whole) - len(prefix)):], whole[len(prefix):]
    expected = sum(row[target] for row, target in zip(word_rows, targets, strict=True))
    assert result.word_perplexity == pytest.approx(np.exp(-expected), rel=1e-5)
    assert result.accuracy == float(all(int(row.argmax()) == t for row, t in zip(word_rows, targets, strict=True)))

    text = tmp_path / "long.txt"
    text.write_text(LONG_PARAGRAPH + "\n", encoding="utf-8")
    answer = invoke("eval", tiny_bundle.path, "--text", text, "--last-word", "--json", "--context", 128,
                    "--threads", 1)
    assert_ok(answer)
    assert json.loads(answer.stdout)["last_word"]["documents"] == 1


def test_pack_or_unpack_into_another_bundle_is_refused_and_that_bundle_kept(tiny_bundle, tmp_path):
    """'pack A B' with B another bundle put A.tar inside B, and 'unpack X.tar B' its bundle and staging directory
    there: B then failed verification (a file its manifest does not list) at its next run or deploy."""
    from edgesdk.bundle import pack_bundle, unpack_bundle, verify_bundle

    source = _copy(tiny_bundle, tmp_path / "a")
    other = _copy(tiny_bundle, tmp_path / "b")
    archive = pack_bundle(source, tmp_path / "a.tar")
    for attempt in (lambda: pack_bundle(source, other), lambda: pack_bundle(source, other / "a.tar"),
                    lambda: pack_bundle(source, other / "sub")):
        with pytest.raises(BundleError, match=f"would be written inside the bundle {other}"):
            attempt()
    for destination in (other, other / "unpacked"):
        with pytest.raises(BundleError, match=f"lies in the bundle {other}"):
            unpack_bundle(archive, destination)
    assert sorted(os.listdir(other)) == sorted(os.listdir(tiny_bundle.path))
    assert verify_bundle(other).bundle_id == tiny_bundle.bundle_id
    # beside the bundles, both still work
    assert unpack_bundle(pack_bundle(source, tmp_path / "b"), tmp_path / "out").bundle_id == tiny_bundle.bundle_id
