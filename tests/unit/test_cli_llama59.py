"""llama.cpp's option names as its tools read them today (common/arg.cpp): the speculative-decoding options under
their ``--spec-draft-*`` names (the older --draft-max and --draft-min were removed there, and the
LLAMA_ARG_SPEC_DRAFT_* variables edgesdk read already carry the new names), and the note that an environment
variable is overridden naming the argument typed, as llama.cpp's "will be overwritten by command line argument %s"
does (``--no-context-shift`` was said as --context-shift, the opposite)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def _invoke(tmp_path, *args: str, command: str = "run", env: dict | None = None):
    """``command`` on a bundle that does not exist: parsing the options comes first, the missing bundle after."""
    extra = ("-p", "hi") if command == "run" else ()
    result = CliRunner().invoke(main, [command, str(tmp_path / "no-bundle"), *args, *extra], env=env)
    return result, " ".join(result.output.split())


@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize(("flag", "value"), [("--spec-draft-n-max", "4"), ("--spec-draft-n-min", "1"),
                                             ("--spec-draft-p-min", "0.5"), ("--spec-draft-model", None)])
def test_today_s_speculative_option_names_are_read(tmp_path, command, flag, value):
    """They were click's "No such option" (exit 2) though their variables, LLAMA_ARG_SPEC_DRAFT_*, were read."""
    if value is None:
        value = str(tmp_path)
    result, said = _invoke(tmp_path, flag, value, command=command)
    assert "No such option" not in said, said
    assert "does not exist" in said, said  # parsing went on to the bundle


def test_a_spec_draft_n_max_out_of_range_is_refused_as_draft_max(tmp_path):
    result, said = _invoke(tmp_path, "--spec-draft-n-max", "0")
    assert result.exit_code == 2, said
    assert "'--spec-draft-n-max'" in said, said
    assert "1<=x<=64" in said, said


def test_a_spec_draft_hf_repo_is_refused_by_name(tmp_path):
    """llama.cpp's --spec-draft-hf is its -hfd / --hf-repo-draft; it was "No such option" rather than said as that."""
    result, said = _invoke(tmp_path, "--spec-draft-hf", "org/name")
    assert result.exit_code == 2, said
    assert "--spec-draft-hf is llama.cpp's --hf-repo-draft" in said, said


def test_an_overridden_flag_variable_names_the_negated_flag_typed(tmp_path):
    """LLAMA_ARG_CONTEXT_SHIFT=1 with --no-context-shift said "--context-shift on the command line goes over it"."""
    result, said = _invoke(tmp_path, "--no-context-shift", env={"LLAMA_ARG_CONTEXT_SHIFT": "1"})
    assert "LLAMA_ARG_CONTEXT_SHIFT is set, but --no-context-shift on the command line goes over it" in said, said


@pytest.mark.parametrize(("args", "variable", "named"), [
    (("-n", "5"), "LLAMA_ARG_N_PREDICT", "--max-new-tokens on the command line goes over it (given as -n)"),
    (("--n_predict", "5"), "LLAMA_ARG_N_PREDICT",
     "--max-new-tokens on the command line goes over it (given as --n-predict)"),
    (("--temp", "0.5"), "LLAMA_ARG_TEMPERATURE", "--temperature on the command line goes over it (given as --temp)"),
    (("-t", "2"), "LLAMA_ARG_THREADS", "--threads on the command line goes over it (given as -t)"),
])
def test_an_overridden_variable_names_the_option_as_typed(tmp_path, args, variable, named):
    """llama.cpp names the argument typed; edgesdk named the option's first name alone (--max-new-tokens for -n)."""
    result, said = _invoke(tmp_path, *args, env={variable: "3"})
    assert f"{variable} is set, but {named}" in said, said


def test_an_option_given_twice_is_named_as_its_last_one(tmp_path):
    """The last one given is the one that counts, as in llama.cpp ("only last value will be used")."""
    result, said = _invoke(tmp_path, "-t", "1", "--threads", "2", env={"LLAMA_ARG_THREADS": "3"})
    assert "LLAMA_ARG_THREADS is set, but --threads on the command line goes over it" in said, said
    assert "given as" not in said, said
    result, said = _invoke(tmp_path, "--threads", "1", "-t", "2", env={"LLAMA_ARG_THREADS": "3"})
    assert "LLAMA_ARG_THREADS is set, but --threads on the command line goes over it (given as -t)" in said, said


def test_eval_s_c_overriding_the_context_variable_is_said_as_c(tmp_path):
    """eval reads llama-perplexity's -c as its --context: the note named --context alone, which was not typed."""
    result, said = _invoke(tmp_path, "-c", "64", command="eval", env={"LLAMA_ARG_CTX_SIZE": "128"})
    assert "LLAMA_ARG_CTX_SIZE is set, but --context on the command line goes over it (given as -c)" in said, said


def test_a_draft_setting_without_a_draft_is_said_by_the_name_typed(tiny_bundle):
    """--spec-draft-n-max without --draft was said as --draft-max, a name the user did not type."""
    result = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "-p", "hi", "-n", "1", "--raw",
                                       "--spec-draft-n-max", "4"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, said
    assert "--spec-draft-n-max is not used: it works with --draft BUNDLE" in said, said
