"""llama.cpp's LLAMA_ARG_* variables in run: a refusal made in the command's body names the variable that gave the
value, and the variable of an option run accepts with a note (-ngl, --jinja, -fa, -cb, -np) is read as that option."""

from __future__ import annotations

from click.testing import CliRunner

from edgesdk.cli import main


def _run(env: dict[str, str]):
    return CliRunner().invoke(main, ["run", "no-such-bundle", "-p", "hi"], env=env)


def test_run_token_limit_from_env_names_the_variable():
    # -n 0 in a chat (-cnv) is refused: it would leave every answer empty (-n 0 with one prompt is taken)
    result = CliRunner().invoke(main, ["run", "no-such-bundle", "-p", "hi", "-cnv"], env={"LLAMA_ARG_N_PREDICT": "0"})
    assert result.exit_code == 2
    assert "LLAMA_ARG_N_PREDICT='0'" in result.output
    assert "unset it" in result.output


def test_run_sampling_value_from_env_names_the_variable():
    result = _run({"LLAMA_ARG_TOP_P": "nan"})
    assert result.exit_code == 2
    assert "'--top-p'" in result.output
    assert "LLAMA_ARG_TOP_P='nan'" in result.output


def test_run_says_accepted_option_variables_as_their_options():
    result = _run({"LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_JINJA": "1", "LLAMA_ARG_FLASH_ATTN": "on",
                   "LLAMA_ARG_CONT_BATCHING": "1"})
    for variable in ("LLAMA_ARG_N_GPU_LAYERS", "LLAMA_ARG_JINJA", "LLAMA_ARG_FLASH_ATTN", "LLAMA_ARG_CONT_BATCHING"):
        assert f"{variable} (llama.cpp's" in result.output
    assert "not read" not in result.output
    assert "changes nothing here" in result.output


def test_run_refuses_parallel_from_env_as_np():
    result = _run({"LLAMA_ARG_N_PARALLEL": "4"})
    assert result.exit_code == 2
    assert "LLAMA_ARG_N_PARALLEL" in result.output
    assert "one sequence at a time" in result.output


def test_run_still_names_variables_of_options_it_lacks():
    result = _run({"LLAMA_ARG_HF_REPO": "org/model"})
    assert "not read: LLAMA_ARG_HF_REPO" in result.output


def test_serve_sampling_value_from_env_names_the_variable():
    """serve's sampling refusal, made in its body, named '--top-p' alone for a value LLAMA_ARG_TOP_P gave."""
    result = CliRunner().invoke(main, ["serve", "no-such-bundle"], env={"LLAMA_ARG_TOP_P": "nan"})
    assert result.exit_code == 2
    assert "'--top-p'" in result.output
    assert "LLAMA_ARG_TOP_P='nan'" in result.output
