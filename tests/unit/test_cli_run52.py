"""``edgesdk run`` against llama-cli (common/arg.cpp, tools/main/main.cpp, now tools/completion): -i beside -no-cnv
goes on reading stdin, a LLAMA_ARG_MODEL the command line goes over is said, and a gate value the controller refuses
is told under its option."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)

pytest.importorskip("torch")


def stats_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if re.match(r"\[[\w-]+\] prompt \d+ tok", line)]


def run(bundle, *args, input=None):
    return invoke("run", bundle.path, "-n", 1, "--threads", 1, *args, input=input)


def test_interactive_with_no_cnv_goes_on_reading_stdin_after_the_prompt(tiny_bundle):
    """llama-cli's -no-cnv -i -p TEXT is interactive completion: the prompt answered as it is, then each line read
    from stdin answered too, as -i does with --raw; -no-cnv silently dropped -i, ending after the prompt."""
    # -n 20 (the last -n given) is the session's budget, which the lines' tokens spend too (llama-completion's
    # n_remain): room for each line and an answer
    result = run(tiny_bundle, "-no-cnv", "-i", "-p", "first", "--stats", "-n", 20, "--ignore-eos",
                 input="second\nthird\n")
    assert_ok(result)
    assert len(stats_lines(result)) == 3, result.stderr
    alone = run(tiny_bundle, "-no-cnv", "-p", "first", "--stats", input="second\n")  # without -i: the prompt alone
    assert_ok(alone)
    assert len(stats_lines(alone)) == 1
    single = run(tiny_bundle, "-no-cnv", "-i", "-st", "-p", "first", "--stats", input="second\n")
    assert_ok(single)
    assert len(stats_lines(single)) == 1


@pytest.mark.parametrize("given", ["bundle", "-m"])
def test_a_model_variable_the_command_line_goes_over_is_said(tiny_bundle, tmp_path, given):
    """llama-cli warns where LLAMA_ARG_MODEL "is set, but will be overwritten by command line argument"; run went
    over it silently, where eval and embed say so."""
    args = ["-p", "hi", "-n", 1, "--threads", 1]
    where = [tiny_bundle.path] if given == "bundle" else ["-m", tiny_bundle.path]
    result = invoke("run", *where, *args, env={"LLAMA_ARG_MODEL": str(tmp_path / "other")})
    assert_ok(result)
    said = "the BUNDLE" if given == "bundle" else "-m"
    assert f"edgesdk: LLAMA_ARG_MODEL is set, but {said} on the command line goes over it" in result.stderr
    from_env = invoke("run", *args, env={"LLAMA_ARG_MODEL": str(tiny_bundle.path)})  # read where none is given
    assert_ok(from_env)
    assert "LLAMA_ARG_MODEL is set" not in from_env.stderr


@pytest.mark.parametrize(("option", "value", "field"), [("--compute-budget", 2, "compute_budget"),
                                                        ("--entropy-target", 5, "entropy_target")])
def test_a_gate_value_the_controller_refuses_is_told_under_its_option(power_bundle, option, value, field):  # noqa: F811
    """A value the gate controller refuses was told as "Invalid value: compute_budget must be ...", naming its field
    and no option; it is told under the option typed, as a refused sampling value is."""
    result = invoke("run", power_bundle.path, "-p", "hi", "-n", 1, "--threads", 1, "--ignore-target", option, value)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': {field} must" in result.stderr
    assert result.stdout == ""
