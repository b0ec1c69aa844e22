"""llama.cpp's option values and environment variables as serve and embed read them: a number written in digits
other than ASCII ones refused by name, and a value serve refuses blamed on the variable that gave it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_llama import CTX_SIZE_ENV, _ctx_size_env_unlike


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("command", [("serve", "bundle"), ("embed", "bundle", "-p", "x")], ids=["serve", "embed"])
@pytest.mark.parametrize("size", ["²", "¹²⁸"])
def test_a_context_size_in_superscript_digits_is_refused_naming_c(command, size):
    """str.isdigit takes '²', which int() refuses: the check passed it on and the command crashed (ValueError)."""
    result = CliRunner().invoke(main, [*command, "-c", size])
    said = _said(result)
    assert result.exit_code == 2, (said, result.exception)
    assert f"{size!r} is not a context size" in said, said


def test_a_context_size_variable_in_superscript_digits_is_said_not_crashed(monkeypatch):
    monkeypatch.setenv(CTX_SIZE_ENV, "²")
    why = _ctx_size_env_unlike(256, "bundle")
    assert why is not None
    assert f"set {CTX_SIZE_ENV} to at most 256" in why


@pytest.mark.parametrize(("variable", "value", "option", "problem"), [
    ("LLAMA_ARG_HOST", " ", "--host", "is empty"),
    ("LLAMA_ARG_HOST", "/run/llama.sock", "--host", "is a unix socket path"),
    ("LLAMA_ARG_ALIAS", " ", "--model-name", "is empty"),
    ("LLAMA_ARG_N_PREDICT", "0", "--max-new-tokens", "is 0"),
    ("LLAMA_ARG_MODELS_DIR", "no-such-dir", "--models-dir", "is not a directory"),
])
def test_a_value_serve_refuses_names_the_variable_that_gave_it(variable, value, option, problem):
    """The option was never typed: the refusal names the variable, its value, and that unsetting it is a fix."""
    result = CliRunner().invoke(main, ["serve", "bundle"], env={variable: value})
    said = _said(result)
    assert result.exit_code == 2, said
    assert problem in said, said
    assert option in said, said
    assert f"read from the environment, {variable}={value!r}: set it right or unset it" in said, said


@pytest.mark.parametrize("variable", ["EDGESDK_API_KEY", "LLAMA_API_KEY"])
@pytest.mark.parametrize(("value", "problem"), [(" , ", "is empty"), ("s3cret\x01key", "control character U+0001")])
def test_an_api_key_serve_refuses_names_its_variable_but_never_shows_the_key(variable, value, problem):
    result = CliRunner().invoke(main, ["serve", "bundle"], env={variable: value})
    said = _said(result)
    assert result.exit_code == 2, said
    assert problem in said, said
    assert f"read from the environment, {variable}: set it right or unset it" in said, said
    assert "s3cret" not in result.output


def test_an_api_key_on_the_command_line_is_refused_without_the_environment_s_note():
    result = CliRunner().invoke(main, ["serve", "bundle", "--api-key", ","])
    said = _said(result)
    assert result.exit_code == 2, said
    assert "is empty" in said, said
    assert "read from the environment" not in said
