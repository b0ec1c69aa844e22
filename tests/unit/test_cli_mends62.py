"""Mends from a last read of round 62's CLI changes: -cd (--ctx-size-draft) was taken with a note on a --draft bundle
by embed, eval and bench, which have no --draft (and refuse -md by name); eval --reference-model's refusals said
"--reference" and "drop --reference"; a GGUF head count written as text was refused as "'8' attention heads ... at
least one" instead of by its type; run -n's help left 0 out; and with -n 0, --draft still loaded its bundle while
--lookup, the sampling and constraint options and --ignore-eos were taken without a word."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgesdk.errors import ModelSourceError
from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


def _said(result) -> str:
    return " ".join(result.output.split())


# --- -cd only where there is a --draft ------------------------------------------------------------------------------


def test_ctx_size_draft_is_taken_by_run_and_serve_only():
    from edgesdk.cli_llama import _llama_only_by_name

    option = _llama_only_by_name()["-cd"]
    assert [command for command in ("run", "serve", "embed", "eval", "bench") if option.accepted_in(command)] == \
        ["run", "serve"]


@pytest.mark.parametrize("command", ["embed", "eval", "bench"])
@pytest.mark.parametrize("spelling", [("-cd", "0"), ("--ctx-size-draft=4096",)])
def test_ctx_size_draft_is_refused_by_name_where_the_command_has_no_draft(tiny_bundle, tmp_path, command, spelling):
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    args = {"embed": ("-p", "hi"), "eval": ("-f", str(text)), "bench": ("-p", "4", "-n", "0", "-r", "1")}[command]
    result = invoke(command, tiny_bundle.path, *args, *spelling)
    assert result.exit_code == 2, result.output
    said = _said(result)
    name = spelling[0].partition("=")[0]
    assert f"{name} is llama.cpp's --ctx-size-draft, which edgesdk {command} does not have" in said, said
    assert "takes no draft model (edgesdk run and serve take one with --draft): leave it out" in said, said
    assert "changes nothing here" not in said, said


def test_ctx_size_draft_is_still_taken_by_run(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "hi", "-n", 1, "--threads", 1, "-cd", "0")
    assert_ok(result)
    assert "-cd is accepted for llama.cpp's scripts and changes nothing here: a --draft bundle's" in _said(result)


def test_ctx_size_draft_s_variable_is_not_read_by_embed(tiny_bundle):
    result = invoke("embed", tiny_bundle.path, "-p", "hi", env={"LLAMA_ARG_CTX_SIZE_DRAFT": "0"})
    assert_ok(result)
    said = _said(result)
    assert "not read: LLAMA_ARG_CTX_SIZE_DRAFT" in said, said
    assert "is accepted for llama.cpp's scripts" not in said, said


# --- eval --reference-model names itself ----------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "asked", "drop"), [
    (("--reference-model", "somewhere"), "--reference-model scores", "drop --reference-model to score"),
    (("--reference", "--reference-model", "somewhere"), "--reference-model scores",
     "drop --reference-model and --reference to score"),
    (("--reference",), "--reference scores", "drop --reference to score"),
])
def test_the_missing_host_dependencies_refusal_names_the_option_given(tiny_bundle, tmp_path, monkeypatch, args,
                                                                      asked, drop):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    result = invoke("eval", tiny_bundle.path, "-f", text, *args)
    assert result.exit_code != 0, result.output
    said = _said(result)
    assert f"{asked} the PyTorch source model and needs torch and transformers" in said, said
    assert drop in said, said
    if "--reference-model" in args:
        assert "--reference scores" not in said, said


def _adapter_record(where: Path) -> dict:
    return {"path": str(where), "form": "peft", "file": "adapter_model.safetensors", "sha256": "ab" * 32,
            "config_sha256": "cd" * 32, "scale": 1.0}


def test_a_missing_adapter_under_reference_model_says_it_is_read_at_the_build_host_s_path(tiny_bundle,
                                                                                       tiny_model_dir, tmp_path):
    """--reference-model moves the source model; the adapters merged into it are still read where the manifest
    records them, and there is no option to give them elsewhere: the refusal said --reference and nothing of it."""
    from edgesdk.cli_eval import _reference_source

    gone = tmp_path / "my-adapter"
    manifest = {"model": {"before": {"source": "/build-host/base", "adapters": [_adapter_record(gone)]}}}
    runtime = SimpleNamespace(bundle=SimpleNamespace(manifest=manifest))
    with pytest.raises(ModelSourceError) as raised:
        _reference_source(runtime, tiny_bundle.path, str(tiny_model_dir))
    error = raised.value
    assert error.problem.startswith(f"--reference-model scores the model {tiny_bundle.path} was built from"), \
        error.problem
    assert f"weights {gone / 'adapter_model.safetensors'} is not here" in error.problem
    assert f"--reference-model {tiny_model_dir} gives the source model only" in error.problem
    assert "the build host's paths, and no option gives them elsewhere" in error.problem
    assert f"back at {gone}, or drop --reference-model to score the bundle alone" in error.fix


def test_a_missing_adapter_under_reference_is_said_as_before(tmp_path):
    from edgesdk.cli_eval import _recorded_adapters

    gone = tmp_path / "my-adapter"
    with pytest.raises(ModelSourceError) as raised:
        _recorded_adapters([_adapter_record(gone)], Path("bundle"))
    error = raised.value
    assert error.problem.startswith("--reference scores the model bundle was built from"), error.problem
    assert "--reference-model" not in error.problem
    assert error.fix.endswith("or drop --reference to score the bundle alone"), error.fix


# --- a GGUF head count written as text --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gqa_gguf(tmp_path_factory):
    from tests._utils.tiny import tiny_llama
    from tests.unit.test_gguf_meta62 import _llama_gguf

    model = tiny_llama(heads=4, kv_heads=2, hidden=64, intermediate=128, vocab_size=256)
    return _llama_gguf(model, tmp_path_factory.mktemp("gguf") / "gqa.gguf")


@pytest.mark.parametrize("per_layer", [False, True], ids=["one", "per-layer"])
def test_a_head_count_written_as_text_is_refused_by_its_type(gqa_gguf, tmp_path, per_layer):
    """It was refused as "gives '4' attention heads (llama.attention.head_count), where each layer ... has at least
    one": the number is right, its type is not."""
    gguf = pytest.importorskip("gguf")
    from tests._utils.gguf_files import rewrite_gguf
    from tests.unit.test_gguf_meta62 import _load

    value = ["4", "4"] if per_layer else "4"
    kind = gguf.GGUFValueType.ARRAY if per_layer else gguf.GGUFValueType.STRING
    path = rewrite_gguf(gqa_gguf, tmp_path / "text-heads.gguf",
                        fields={"llama.attention.head_count": (value, kind)})
    with pytest.raises(ModelSourceError) as refused:
        _load(path)
    message = str(refused.value)
    assert f"gives llama.attention.head_count as {type(value).__name__} {value!r}" in message, message
    assert "wrong type" in message
    assert "at least one" not in message


def test_a_head_count_of_0_is_still_refused_as_no_heads(gqa_gguf, tmp_path):
    gguf = pytest.importorskip("gguf")
    from tests._utils.gguf_files import rewrite_gguf
    from tests.unit.test_gguf_meta62 import _load

    path = rewrite_gguf(gqa_gguf, tmp_path / "no-heads.gguf",
                        fields={"llama.attention.head_count": (0, gguf.GGUFValueType.UINT32)})
    with pytest.raises(ModelSourceError, match=r"gives 0 attention heads \(llama\.attention\.head_count\)"):
        _load(path)


# --- run -n 0 ---------------------------------------------------------------------------------------------------------


def test_run_help_gives_n_zero():
    result = invoke("run", "--help")
    assert_ok(result)
    assert "0: prefill the prompt only (with -p / -f), as llama.cpp" in " ".join(result.output.split())


def test_token_count_s_doc_does_not_say_token_limit_refuses_0():
    from edgesdk.api_checks import token_count

    doc = " ".join(token_count.__doc__.split())
    assert "which refuses 0)" not in doc
    assert "run's prompt prefilled only" in doc


def test_n_zero_does_not_load_the_draft(tiny_bundle, tmp_path):
    """--draft's bundle was opened (and checked against the target) for an answer -n 0 never generates: a directory
    that is no bundle failed the run."""
    not_a_bundle = tmp_path / "not-a-bundle"
    not_a_bundle.mkdir()
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-p", "hi", "-n", 0, "--draft", not_a_bundle,
                    "--draft-max", 3)
    assert_ok(result)
    assert result.stdout == ""
    said = " ".join(result.stderr.split())
    assert "--draft, --draft-max are not used: -n 0 prefills the prompt and generates no token" in said, said
    assert "it works with --draft BUNDLE" not in said, said


def test_n_zero_says_the_answer_s_options_unused(tiny_bundle):
    schema = '{"type": "object"}'
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-p", "hi", "-n", 0, "--temp", 0.7, "--top-p", 0.9,
                    "--lookup", 2, "--json-schema", schema, "--ignore-eos", "-s", 5)
    assert_ok(result)
    assert result.stdout == ""
    said = " ".join(result.stderr.split())
    assert ("--temp, --top-p, -s, --ignore-eos, --json-schema, --lookup are not used: -n 0 prefills the prompt and "
            "generates no token (pass -n N, the most tokens to answer with, to use them)") in said, said
    assert said.count("is not used") == 0, said  # no second word on --top-p or --seed


def test_n_zero_from_the_environment_says_one_option_by_its_long_name(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-p", "hi", env={"LLAMA_ARG_N_PREDICT": "0",
                                                                            "LLAMA_ARG_TEMPERATURE": "0.5"})
    assert_ok(result)
    said = " ".join(result.stderr.split())
    assert "--temperature is not used: -n 0 prefills the prompt and generates no token" in said, said
    assert "to use it)" in said, said


def test_a_run_that_answers_says_nothing_of_n_zero(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--threads", 1, "-p", "hi", "-n", 1, "--ignore-eos", "--lookup", 2)
    assert_ok(result)
    assert "-n 0" not in result.stderr
