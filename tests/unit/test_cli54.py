"""edgesdk serve against llama-server's command line: its spellings of -n (--n-predict, --predict, and every
option with '_' for '-', as common/arg.cpp reads them), its server options edgesdk has no counterpart for (each
taken or refused by its own name, never click's bare "No such option"), and refusals whose fix names an option
the command has."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_serve import serve


def _parsed(*args: str) -> dict:
    """serve's parameters as its command line (with a bundle path that need not exist) sets them."""
    # the group's settings, as the CLI gives them: click keeps a command's first help option (-h)
    with serve.make_context("serve", ["bundle", *args], **main.context_settings) as context:
        return context.params


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("spelling", ["-n", "--n-predict", "--predict", "--n_predict", "--max_new_tokens"])
def test_serve_reads_llama_servers_spellings_of_n_predict(spelling):
    assert _parsed(spelling, "7")["max_new_tokens"] == 7


@pytest.mark.parametrize(("args", "name", "value"), [
    (("--top_k", "5"), "top_k", 5), (("--cache_ram", "64"), "cache_ram_mib", 64),
    (("--api_key", "k"), "api_key", "k"), (("--reasoning_format", "none"), "reasoning_format", "none"),
])
def test_serve_reads_option_names_with_underscores_as_llama_server_does(args, name, value):
    assert _parsed(*args)[name] == value


@pytest.mark.parametrize(("args", "fix"), [
    (("--api-key-file", "keys.txt"), "EDGESDK_API_KEY"),
    (("--path", "public"), "no static files"),
    (("--props",), "GET /props"),
    (("--no-slots",), "GET /slots"),
    (("--api-prefix", "/v"), "reverse proxy"),
    (("--ssl-key-file", "k.pem"), "reverse proxy"),
    (("--webui",), "no web UI"),
])
def test_serve_refuses_llama_servers_own_options_by_name(args, fix):
    result = CliRunner().invoke(main, ["serve", "bundle", *args])
    said = _said(result)
    assert result.exit_code == 2, said
    assert f"{args[0]} is llama.cpp's {args[0]}, which edgesdk serve does not have" in said, said
    assert fix in said, said
    assert "No such option" not in said


@pytest.mark.parametrize("args", [("--slots",), ("--threads-http", "4"), ("--no-webui",)])
def test_serve_takes_llama_server_options_that_change_nothing_with_a_note(args):
    result = CliRunner().invoke(main, ["serve", "bundle", *args])
    said = _said(result)
    assert f"{args[0]} is accepted for llama.cpp's scripts and changes nothing here" in said, said
    assert "does not exist" in said  # parsing went on to the bundle


def test_chat_template_file_is_refused_as_itself_with_a_fix_serve_has():
    result = CliRunner().invoke(main, ["serve", "bundle", "--chat-template-file", "t.jinja"])
    said = _said(result)
    assert result.exit_code == 2
    assert "--chat-template-file is llama.cpp's --chat-template-file," in said, said
    assert "--raw" not in said  # serve has no --raw
    assert "/v1/completions" in said


def test_reasoning_is_refused_in_serve_pointing_at_reasoning_budget():
    result = CliRunner().invoke(main, ["serve", "bundle", "--reasoning", "off"])
    said = _said(result)
    assert result.exit_code == 2
    assert "--reasoning-budget 0" in said, said
    assert "--reasoning-budget" in [name for param in serve.params if isinstance(param, click.Option)
                                    for name in param.opts]


@pytest.mark.parametrize(("args", "named"), [(["-m", "given"], "-m on the command line"),
                                             (["given"], "the BUNDLE on the command line")])
def test_llama_arg_model_overridden_names_what_the_command_line_gave(monkeypatch, args, named):
    monkeypatch.setenv("LLAMA_ARG_MODEL", "from-env")
    result = CliRunner().invoke(main, ["serve", *args])
    said = _said(result)
    assert f"LLAMA_ARG_MODEL is set, but {named} goes over it" in said, said
    assert "bundle given does not exist" in said  # the command line's bundle, not the variable's
