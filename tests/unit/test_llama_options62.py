"""llama.cpp's options as its tools read them (common/arg.cpp), on a tiny bundle: the command line goes over the
variable of an option edgesdk accepts with a note (LLAMA_ARG_N_PARALLEL=4 with -np 1 typed was refused as -np 4,
LLAMA_ARG_BATCH=abc with -b 16 as -b abc); -cd (--ctx-size-draft) was read by click as -c and refused as "No such
option '-c'", -md as -m d in embed and eval; the CPU placement options -C, --cpu-strict, --poll, --prio (and their
-batch forms) were "No such option" though -Cr and -Cb were taken; LLAMA_ARG_NO_PERF, --no-perf's variable, was said
as not read."""

from __future__ import annotations

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")


def _said(result) -> str:
    return " ".join(result.output.split())


def run(bundle, *args, env=None):
    return invoke("run", bundle.path, "-p", "hi", "-n", 1, "--threads", 1, *args, env=env)


# --- the command line goes over an accepted option's variable ------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "embed"])
def test_np_1_typed_goes_over_llama_arg_n_parallel(tiny_bundle, command):
    """llama.cpp reads the variable, then the command line over it; edgesdk refused the variable's 4 though -np 1
    was typed."""
    args = ("-n", 1) if command == "run" else ()
    result = invoke(command, tiny_bundle.path, "-p", "hi", *args, "-np", "1", env={"LLAMA_ARG_N_PARALLEL": "4"})
    assert_ok(result)
    said = _said(result)
    assert "LLAMA_ARG_N_PARALLEL is set, but -np on the command line goes over it" in said, said
    assert "is 4" not in said, said


def test_the_variable_alone_is_still_checked(tiny_bundle):
    result = run(tiny_bundle, env={"LLAMA_ARG_N_PARALLEL": "4"})
    assert result.exit_code == 2, result.output
    assert "LLAMA_ARG_N_PARALLEL='4'" in _said(result)


def test_a_bad_variable_under_the_option_typed_is_not_read(tiny_bundle):
    result = run(tiny_bundle, "--batch_size", "16", env={"LLAMA_ARG_BATCH": "abc"})
    assert_ok(result)
    said = _said(result)
    assert "LLAMA_ARG_BATCH is set, but --batch-size on the command line goes over it" in said, said
    assert "--batch-size is accepted for llama.cpp's scripts" in said, said


def test_an_overridden_variable_with_two_names_is_said_once(tiny_bundle):
    env = {"LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K": "q8_0", "LLAMA_ARG_CACHE_TYPE_K_DRAFT": "q8_0"}
    result = run(tiny_bundle, "-ctkd", "f16", env=env)
    assert_ok(result)
    assert _said(result).count("on the command line goes over it") == 1, result.output


# --- llama.cpp's options that click misread or did not know -------------------------------------------------------


@pytest.mark.parametrize("args", [("-cd", "0"), ("--ctx-size-draft", "4096"), ("--ctx_size_draft=0",)])
def test_ctx_size_draft_is_taken_with_a_note(tiny_bundle, args):
    result = run(tiny_bundle, *args)
    assert_ok(result)
    said = _said(result)
    assert "No such option" not in said, said
    assert "is accepted for llama.cpp's scripts and changes nothing here: a --draft bundle's context" in said, said


def test_a_ctx_size_draft_that_is_no_size_is_refused_by_name(tiny_bundle):
    result = run(tiny_bundle, "-cd", "-1")
    assert result.exit_code == 2, result.output
    assert "'-cd' (llama.cpp's --ctx-size-draft)" in _said(result), result.output


def test_ctx_size_draft_s_variable_is_read_as_the_option(tiny_bundle):
    result = run(tiny_bundle, env={"LLAMA_ARG_CTX_SIZE_DRAFT": "0"})
    assert_ok(result)
    assert "LLAMA_ARG_CTX_SIZE_DRAFT (llama.cpp's --ctx-size-draft) is accepted" in _said(result), result.output


@pytest.mark.parametrize("args", [
    ("-C", "0xF"), ("--cpu-mask", "ff"), ("--cpu-strict", "1"), ("--poll", "50"), ("--prio", "0"),
    ("--cpu-strict-batch", "0"), ("--poll_batch", "1"), ("--prio-batch", "0"),
])
def test_cpu_placement_options_are_taken_with_a_note(tiny_bundle, args):
    result = run(tiny_bundle, *args)
    assert_ok(result)
    said = _said(result)
    assert "No such option" not in said, said
    assert "is accepted for llama.cpp's scripts and changes nothing here" in said, said


@pytest.mark.parametrize(("value", "fix"), [("2", "run it under nice"), ("-1", "run it under nice"),
                                            ("9", "give -1 (low), 0 (normal)"), ("high", "give -1 (low)")])
def test_a_priority_edgesdk_does_not_set_is_refused_by_name(tiny_bundle, value, fix):
    result = run(tiny_bundle, "--prio", value)
    assert result.exit_code == 2, result.output
    said = _said(result)
    assert "'--prio' (llama.cpp's --prio)" in said, said
    assert fix in said, said


@pytest.mark.parametrize("command", ["embed", "eval"])
def test_md_is_refused_by_name_where_the_command_has_no_draft(tiny_bundle, tmp_path, command):
    """click read -md x as -m d, then x as an extra argument."""
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 50)
    args = ("-p", "hi") if command == "embed" else ("-f", str(text))
    result = invoke(command, tiny_bundle.path, *args, "-md", "x")
    assert result.exit_code == 2, result.output
    said = _said(result)
    assert f"-md is llama.cpp's --model-draft, which edgesdk {command} does not have" in said, said


def test_md_is_still_run_s_draft(tiny_bundle):
    assert_ok(run(tiny_bundle, "-md", tiny_bundle.path, "--draft-max", "2"))


def test_no_perf_s_variable_is_read_as_no_perf(tiny_bundle):
    result = run(tiny_bundle, env={"LLAMA_ARG_NO_PERF": "1"})
    assert_ok(result)
    said = _said(result)
    assert "LLAMA_ARG_NO_PERF (llama.cpp's --no-perf) is accepted" in said, said
    assert "not read" not in said, said
