"""A corrupt bundle is refused before it runs: copies of real bundles (the session's ort-fused one and a
zlib-coded one) are damaged with file operations, and each damage must end in an EdgeSDKError naming
the bundle or the file and the fix, from ``verify_bundle``, ``open_runtime`` and ``edgesdk run -n 1``
alike, with no token written. Manifest edits rewrite its digest too, as a careless user or an attacker
would, so only the manifest's own checks and the graph itself can catch them."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import zlib
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, verify_bundle  # noqa: E402
from edgesdk.cli import main  # noqa: E402
from edgesdk.errors import BundleError, EdgeSDKError  # noqa: E402
from edgesdk.hashing import sha256_file  # noqa: E402
from edgesdk.runtime.session import open_runtime  # noqa: E402
from edgesdk.weights_file import inflate_weights  # noqa: E402
from tests._utils.builds import build_tiny_bundle  # noqa: E402

ZLIB_RECIPE = """name: tiny-int4-zlib
stages: []
export: {form: ort-fused, weights: int4, embedding_bits: 8, weights_codec: zlib}
"""
CODED = "model.onnx.data.zlib"


@pytest.fixture(scope="module")
def zlib_bundle(tmp_path_factory):
    return build_tiny_bundle(tmp_path_factory.mktemp("zlib36"), ZLIB_RECIPE, "host", generated_sequences=0)


@pytest.fixture(params=["plain", "zlib"])
def bundle(request, tiny_bundle, zlib_bundle):
    built = tiny_bundle if request.param == "plain" else zlib_bundle
    assert built.manifest["graph"]["form"] == "ort-fused"
    assert ("weights" in built.manifest["graph"]) == (request.param == "zlib")
    return built


def copy_bundle(bundle, tmp_path: Path) -> Path:
    destination = tmp_path / "bundle"
    shutil.copytree(bundle.path, destination)
    return destination


def rewrite_manifest(path: Path, change) -> None:
    """Apply ``change`` to the manifest (or take the text it returns) and rewrite manifest.sha256 to match."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    text = change(manifest)
    if text is None:
        text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")


def relist(path: Path, name: str) -> None:
    """Record a changed file's size and sha256 in the manifest, so verification passes it."""
    facts = {"size": (path / name).stat().st_size, "sha256": sha256_file(path / name)}
    rewrite_manifest(path, lambda manifest: manifest["files"].update({name: facts}))


def refused_everywhere(path: Path, match: str, error: type[EdgeSDKError] = BundleError,
                       verified: bool = False) -> EdgeSDKError:
    """``open_runtime`` and ``edgesdk run -n 1`` refuse ``path`` with ``error`` matching ``match`` and a fix, and
    no token is written; ``verify_bundle`` refuses it too unless ``verified`` (what only opening finds)."""
    if verified:
        verify_bundle(path)
    else:
        with pytest.raises(error, match=match):
            verify_bundle(path)
    with pytest.raises(error, match=match) as info:
        open_runtime(path, threads=1, ignore_target=True)
    assert info.value.fix
    assert str(path) in str(info.value)
    result = CliRunner().invoke(main, ["run", str(path), "-p", "hi", "-n", "1", "--ignore-target", "--threads", "1"])
    assert result.exit_code == error.exit_code, (result.output, result.exception)
    assert "error:" in result.output
    assert "fix:" in result.output
    assert "Traceback" not in result.output
    assert result.stdout == "", result.stdout  # not one token
    return info.value


# --- damaged files -----------------------------------------------------------------------------------

def test_a_flipped_bit_anywhere_in_any_file_is_refused(bundle, tmp_path):
    """Five random bits of every file (the manifest's are caught by its digest, the digest's by the manifest)."""
    rng = random.Random(36)
    for name in sorted(p.name for p in bundle.path.iterdir()):
        size = (bundle.path / name).stat().st_size
        for offset in rng.sample(range(size), min(5, size)):
            path = copy_bundle(bundle, tmp_path / f"{name}-{offset}")
            data = bytearray((path / name).read_bytes())
            data[offset] ^= 1 << rng.randrange(8)
            (path / name).write_bytes(bytes(data))
            with pytest.raises(BundleError, match=r"sha256|differs") as info:
                open_runtime(path, threads=1, ignore_target=True)
            assert info.value.fix
            assert str(path) in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing", "directory", "link to nothing"])
def test_a_truncated_empty_missing_or_replaced_file_is_refused(bundle, tmp_path, damage):
    expected = {"truncated": r": \d+ bytes, manifest says", "empty": r": 0 bytes, manifest says", "missing": r": missing",
                "directory": r": a directory, not a file", "link to nothing": r": not a regular file"}[damage]
    for name in ("model.onnx", bundle.manifest["graph"].get("weights", {}).get("file", "model.onnx.data"),
                 "tokenizer.json", "chat_template.jinja", "report.md"):
        path = copy_bundle(bundle, tmp_path / name)
        file = path / name
        if damage == "truncated":
            file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
        elif damage == "empty":
            file.write_bytes(b"")
        else:
            file.unlink()
            if damage == "directory":
                file.mkdir()
            elif damage == "link to nothing":
                file.symlink_to(path / "gone")
        refused_everywhere(path, re.escape(name) + expected)


def test_an_extra_file_and_a_link_to_an_unlisted_sibling_are_refused(bundle, tmp_path):
    path = copy_bundle(bundle, tmp_path / "extra")
    (path / "notes.txt").write_text("added\n")
    refused_everywhere(path, "notes.txt: not listed in the manifest")
    path = copy_bundle(bundle, tmp_path / "sibling")
    shutil.move(path / "tokenizer.json", path / "tokenizer.copy.json")
    (path / "tokenizer.json").symlink_to("tokenizer.copy.json")
    refused_everywhere(path, "tokenizer.copy.json: not listed in the manifest")


# --- the manifest, edited with its digest ----------------------------------------------------------------

def _set(section: str, key: str, value):
    return lambda manifest: manifest[section].__setitem__(key, value)


def _drop(section: str, key: str):
    def drop(manifest) -> None:
        del manifest[section][key]
    return drop


def _twice(manifest) -> str:
    """report.md listed twice in 'files' (JSON keeps the last record; the first one here is false)."""
    text = json.dumps(manifest, indent=2, sort_keys=True)
    return text.replace('"files": {', '"files": {"report.md": {"size": 1, "sha256": "00"},', 1) + "\n"


def _alias(name: str):
    return lambda manifest: manifest["files"].__setitem__(name, dict(manifest["files"]["report.md"]))


MANIFEST_EDITS = {
    # each of these was a traceback from the backend or the tokenizer (KeyError, TypeError, ValueError, MemoryError)
    "kv_heads-missing": (_drop("graph", "kv_heads"), r"'graph.kv_heads' must be a non-empty list"),
    "kv_heads-number": (_set("graph", "kv_heads", 2), r"'graph.kv_heads' must be a non-empty list"),
    "kv_heads-text": (_set("graph", "kv_heads", [2, "2"]), r"'graph.kv_heads' must be a non-empty list"),
    "kv_heads-huge": (_set("graph", "kv_heads", [1 << 40, 1 << 40]), r"'graph.kv_heads' must be a non-empty list"),
    "head_dim-missing": (_drop("graph", "head_dim"), r"'graph.head_dim' must be a whole number from 1"),
    "head_dim-negative": (_set("graph", "head_dim", -1), r"'graph.head_dim' must be a whole number from 1"),
    "head_dim-huge": (_set("graph", "head_dim", 10 ** 30), r"'graph.head_dim' must be a whole number from 1"),
    "max_context-null": (_set("graph", "max_context", None), r"'graph.max_context' must be a whole number"),
    "max_context-negative": (_set("graph", "max_context", -1), r"'graph.max_context' must be a whole number"),
    "vocab_size-text": (_set("graph", "vocab_size", "320"), r"'graph.vocab_size' must be a whole number"),
    "num_layers-wrong": (_set("graph", "num_layers", 7), r"'graph.num_layers' must be the number of layers"),
    "inputs-null": (_set("graph", "inputs", None), r"'graph.inputs' must be a mapping, got None"),
    "min_onnxruntime-number": (_set("graph", "min_onnxruntime", 1), r"'graph.min_onnxruntime' must be a version"),
    "eos_token_ids-number": (_set("tokenizer", "eos_token_ids", 2), r"'tokenizer.eos_token_ids' must be a list"),
    "eos_token_ids-null": (_set("tokenizer", "eos_token_ids", None), r"'tokenizer.eos_token_ids' must be a list"),
    "eos_token_ids-nested": (_set("tokenizer", "eos_token_ids", [[2]]), r"'tokenizer.eos_token_ids' must be a list"),
    "chat_template-list": (_set("tokenizer", "chat_template", ["chat_template.jinja"]),
                           r"'tokenizer.chat_template' must be a string or null"),
    "bos_token-list": (_set("tokenizer", "bos_token", [1]), r"'tokenizer.bos_token' must be a string or null"),
    # accepted before: the id names engines/<bundle-id> directories, which '..' would put anywhere
    "bundle_id-path": (lambda m: m.update(bundle_id="../../elsewhere"), r"'bundle_id' must be a plain name"),
    "bundle_id-list": (lambda m: m.update(bundle_id=[1]), r"'bundle_id' must be a plain name"),
    "schema_version-true": (lambda m: m.update(schema_version=True), r"manifest schema version True"),
    # accepted before: JSON keeps the last of two records, other readers may keep the first
    "file-listed-twice": (_twice, r"gives the key 'report.md' more than once"),
    "file-listed-as-./name": (_alias("./report.md"), r"\./report\.md: not a plain relative path"),
    "file-listed-as-name/": (_alias("report.md/"), r"report\.md/: not a plain relative path"),
    "file-dotdot": (_alias("../report.md"), r"\.\./report\.md: path escapes the bundle"),
    "file-absolute": (_alias("/etc/hostname"), r"/etc/hostname: path escapes the bundle"),
    "size-disagrees": (lambda m: m["files"]["model.onnx"].update(size=10 ** 30), r"model.onnx: \d+ bytes, manifest"),
    # tracebacks from json: a number past int()'s digit limit, arrays nested past the recursion limit
    "huge-number-literal": (lambda m: json.dumps(m).replace('"max_context": ', '"max_context": ' + "9" * 5000),
                            r"manifest.json is not valid JSON \(Exceeds the limit"),
    "deep-nesting": (lambda m: json.dumps({**m, "eval": 0}).replace('"eval": 0', '"eval": ' + "[" * 100_000
                                                                    + "]" * 100_000),
                     r"manifest.json is not valid JSON \(maximum recursion depth"),
}


@pytest.mark.parametrize("edit", list(MANIFEST_EDITS))
def test_a_manifest_edited_with_its_digest_is_refused(bundle, tmp_path, edit):
    change, match = MANIFEST_EDITS[edit]
    path = copy_bundle(bundle, tmp_path)
    rewrite_manifest(path, change)
    refused_everywhere(path, match, verified=edit.endswith("-missing"))  # verification needs no graph facts


GRAPH_LIES = {
    # consistent types, false facts: onnxruntime errors in the first step, or logits read at the wrong width
    "one-layer-too-few": (lambda m: m["graph"].update(kv_heads=[2], num_layers=1),
                          r"'graph.kv_heads' lists 1 layers; the graph has 2"),
    "kv_heads": (_set("graph", "kv_heads", [2, 4]), r"'graph.kv_heads\[1\]' is 4; the graph's layer 1 has 2"),
    "head_dim": (_set("graph", "head_dim", 1 << 20), r"'graph.head_dim' is 1048576; the graph's KV cache has 16"),
    "vocab_size": (_set("graph", "vocab_size", 1000), r"'graph.vocab_size' is 1000; the graph's logits have 320"),
    "form-standard": (_set("graph", "form", "standard"), r"does not feed the graph's input 'seqlens_k'"),
    "form-missing": (_drop("graph", "form"), r"'graph.form' is 'standard', whose backend does not feed"),
    "form-gated": (_set("graph", "form", "ort-fused-gated"), r"needs the input 'tau' the graph lacks"),
}


@pytest.mark.parametrize("lie", list(GRAPH_LIES))
def test_graph_facts_that_do_not_describe_the_graph_are_refused_before_a_step(tiny_bundle, tmp_path, lie):
    change, match = GRAPH_LIES[lie]
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, change)
    error = refused_everywhere(path, match, verified=True)
    assert "do not describe model.onnx" in error.problem


def test_verification_accepts_a_manifest_without_graph_facts_but_running_needs_them(tiny_bundle, tmp_path):
    """Deploy and pack verify bundles whose manifests name no graph facts; the runtime sizes its cache by them."""
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, _drop("graph", "head_dim"))
    verify_bundle(path)
    refused_everywhere(path, r"cannot be run:\n  - 'graph.head_dim' must be a whole number", verified=True)


# --- the zlib-coded weights ----------------------------------------------------------------------------

def _recode(path: Path, data: bytes) -> None:
    (path / CODED).write_bytes(data)
    relist(path, CODED)


def test_coded_weights_that_do_not_inflate_to_the_manifests_bytes_are_refused(zlib_bundle, tmp_path):
    plain = zlib.decompress((zlib_bundle.path / CODED).read_bytes())
    stream = (zlib_bundle.path / CODED).read_bytes()
    cases = {
        "short": (zlib.compress(plain[:-100]), "differ from the manifest's"),
        "long": (zlib.compress(plain + bytes(100)), "differ from the manifest's"),
        "bomb": (zlib.compress(bytes(256 << 20), 9), r"length more than 60,672, expected 60,672"),  # stops past it
        "flipped": (stream[:5000] + bytes([stream[5000] ^ 4]) + stream[5001:], "could not be inflated"),
        "cut": (stream[:-1000], "differ from the manifest's"),
        "gzip": (__import__("gzip").compress(plain), "could not be inflated"),
        # accepted before: the inflated bytes matched, but the file is not the one stream store_weights writes
        "trailing bytes": (stream + b"appended", r"not one whole zlib stream \(bytes follow its end\)"),
        "no check value": (stream[:-4], r"not one whole zlib stream \(it ends before its check value\)"),
    }
    for name, (data, match) in cases.items():
        path = copy_bundle(zlib_bundle, tmp_path / name.replace(" ", "-"))
        _recode(path, data)
        refused_everywhere(path, match, verified=True)


def test_a_weights_length_past_what_zlib_counts_is_refused_as_the_bundles_fault(zlib_bundle, tmp_path):
    """It was onnxruntime's load failing with 'Python int too large to convert to C ssize_t' (exit 7)."""
    for claimed in (10 ** 30, (1 << 63) - 1):
        path = copy_bundle(zlib_bundle, tmp_path / str(claimed))
        rewrite_manifest(path, lambda manifest, n=claimed: manifest["graph"]["weights"].update(bytes=n))
        refused_everywhere(path, f"differ from the manifest's.*expected {claimed:,}", verified=True)


def test_a_weights_record_with_codec_none_is_named_for_what_it_is(zlib_bundle):
    record = {**zlib_bundle.manifest["graph"]["weights"], "codec": "none"}
    with pytest.raises(BundleError, match=r"uses weights codec 'none'; this edgesdk inflates 'zlib' \(a plain weights "
                                          r"file has no graph.weights record\)"):
        inflate_weights(zlib_bundle.path, record)
