"""``edgesdk eval``: the backends its figures came from, as the runtime kept them where it opened the chain
(edgesdk/runtime/session.py open_runtime, ``Runtime.backend_reasons``; edgesdk/evaluate.py backend_record reads
them and rebuilds no chain), and the default context on a bundle built shorter than 512 (edgesdk/cli_eval.py): the
bundle's own, said on stderr, where the plain command was refused. The tiny bundle's context is 256."""

from __future__ import annotations

import json
import shutil

import pytest

from tests._utils.tiny import CORPUS
from tests.unit.test_backend_names63 import _rewrite_manifest
from tests.unit.test_cli import assert_ok, invoke

NOTE = "the bundle's max_context (fixed when it was built): the default 512 is longer"


@pytest.fixture(scope="module")
def jetson_chain(tiny_bundle, tmp_path_factory):
    """The tiny bundle asking, as a Jetson bundle does, for tensorrt, then triton, then ort-cpu."""
    out = tmp_path_factory.mktemp("chain64") / "b-jet"
    shutil.copytree(tiny_bundle.path, out)
    _rewrite_manifest(out, lambda m: m["runtime"].update({"backend": "tensorrt", "fallbacks": ["triton", "ort-cpu"]}))
    return out


@pytest.fixture
def no_kernel_mode(monkeypatch):
    monkeypatch.delenv("EDGESDK_KERNELS", raising=False)
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)


@pytest.fixture(scope="module")
def long_text(tmp_path_factory):
    """Text of well over 2 x 256 tokens: llama-perplexity's rule needs two chunks of the context."""
    path = tmp_path_factory.mktemp("text64") / "text.txt"
    path.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    return path


# --- 1. the runtime keeps the backends it refused, and eval reads them ------------------------------------------------


def test_the_runtime_keeps_each_backend_it_refused_and_why(jetson_chain, no_kernel_mode):
    from edgesdk.evaluate import backend_record
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(jetson_chain, threads=1, terms="python")
    assert runtime.backend.name == "ort-cpu"
    assert list(runtime.backend_reasons) == ["tensorrt", "triton"]
    assert all(reason for reason in runtime.backend_reasons.values())
    # the notes say the same: one record, two views
    assert [f"{name}: {reason}" for name, reason in runtime.backend_reasons.items()] == runtime.notes[-3:-1]
    assert backend_record(runtime) == {"backend": "ort-cpu", "backend_reasons": runtime.backend_reasons}

    forced = open_runtime(jetson_chain, backend="ort-cpu", threads=1, terms="python")
    assert forced.backend_reasons == {}
    # no --backend passed to it: the record comes from the runtime, not from the manifest's chain rebuilt
    assert backend_record(forced) == {"backend": "ort-cpu", "backend_reasons": {}}


def test_backend_record_reads_the_runtimes_record_not_notes_that_look_like_one(tiny_bundle):
    """A note that starts with a backend's name (another bundle's, a draft's) was read as that backend's refusal
    by matching on the name; the runtime's own record is what the figures came from."""
    from edgesdk.evaluate import backend_record
    from edgesdk.runtime.session import Runtime, open_runtime

    opened = open_runtime(tiny_bundle.path, threads=1, terms="python")
    runtime = Runtime(bundle=opened.bundle, backend=opened.backend, tokenizer=opened.tokenizer,
                      notes=["ort-cuda: onnxruntime here lacks CUDAExecutionProvider", "ort-cpu: used"])
    assert backend_record(runtime)["backend_reasons"] == {}
    kept = Runtime(bundle=opened.bundle, backend=opened.backend, tokenizer=opened.tokenizer,
                   backend_reasons={"ort-cuda": "onnxruntime here lacks CUDAExecutionProvider"})
    assert backend_record(kept)["backend_reasons"] == {"ort-cuda": "onnxruntime here lacks CUDAExecutionProvider"}


def test_eval_json_still_records_the_chain(jetson_chain, no_kernel_mode, long_text):
    result = invoke("eval", jetson_chain, "-f", long_text, "--context", 32, "-t", 1, "--json")
    assert_ok(result)
    data = json.loads(result.stdout)
    assert data["backend"] == "ort-cpu"
    assert list(data["backend_reasons"]) == ["tensorrt", "triton"]
    chosen = invoke("eval", jetson_chain, "-f", long_text, "--context", 32, "-t", 1, "--json", "--backend", "ort-cpu")
    assert_ok(chosen)
    assert json.loads(chosen.stdout)["backend_reasons"] == {}


# --- 2. the default context on a bundle built shorter ------------------------------------------------------------


@pytest.mark.parametrize("method", ["windows", "llama-perplexity"])
def test_the_plain_command_runs_on_a_shorter_bundle_at_its_context(tiny_bundle, long_text, method):
    """``edgesdk eval BUNDLE -f TEXT`` on a bundle built with --max-context 256 was refused ("512 (the default) is
    longer"); it scores at 256, says so once on stderr, and gives the figure --context 256 gives."""
    plain = invoke("eval", tiny_bundle.path, "-f", long_text, "--method", method, "-t", 1, "--json")
    assert_ok(plain)
    said = " ".join(plain.stderr.split())
    assert said.count(NOTE) == 1, plain.stderr
    assert "edgesdk eval: context 256, " in said
    data = json.loads(plain.stdout)
    assert data["context"] == 256
    explicit = invoke("eval", tiny_bundle.path, "-f", long_text, "--method", method, "-t", 1, "--json",
                      "--context", 256)
    assert_ok(explicit)
    assert NOTE not in " ".join(explicit.stderr.split())
    assert json.loads(explicit.stdout)["bundle"] == data["bundle"]


def test_a_context_asked_for_past_the_bundle_is_still_refused(tiny_bundle, long_text):
    result = invoke("eval", tiny_bundle.path, "-f", long_text, "--context", 512, "-t", 1)
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "512 is longer than the bundle's max_context 256; pass --context 256 or less" in said
    assert NOTE not in said
    from_env = invoke("eval", tiny_bundle.path, "-f", long_text, "-t", 1, env={"LLAMA_ARG_CTX_SIZE": "512"})
    assert from_env.exit_code == 2, from_env.output
    assert "512 (from LLAMA_ARG_CTX_SIZE, llama.cpp's -c) is longer" in " ".join(from_env.stderr.split())


def test_a_stride_past_the_shortened_context_is_refused_by_name(tiny_bundle, long_text):
    result = invoke("eval", tiny_bundle.path, "-f", long_text, "--stride", 300, "-t", 1)
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "stride 300 is outside 1 .. 256" in said
    assert NOTE in said  # the context it was checked against, and why


def test_an_accuracy_task_with_no_context_runs_in_the_bundles_without_a_note(tiny_bundle, tmp_path):
    from tests.unit.test_accuracy_files39 import HELLASWAG_TEXT

    tasks = tmp_path / "hellaswag.txt"
    tasks.write_text(HELLASWAG_TEXT, encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", tasks, "-t", 1, "--json")
    assert_ok(result)
    assert json.loads(result.stdout)["task"] == "hellaswag"
    assert NOTE not in " ".join(result.stderr.split())
    asked = invoke("eval", tiny_bundle.path, "--hellaswag", "-f", tasks, "-t", 1, "--context", 512)
    assert asked.exit_code == 2, asked.output
    assert "512 is longer than the bundle's max_context 256" in " ".join(asked.stderr.split())
