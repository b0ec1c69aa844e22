"""``edgesdk run``: option errors name the option as it is typed."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


@pytest.mark.parametrize(("option", "value", "named"), [
    ("--max-new-tokens", "many", "'--max-new-tokens' / '-n' / '--predict' / '--n-predict'"),  # any negative is llama-cli's no limit
    ("--temperature", "nan", "'--temperature'"),
    ("--top-p", "-0.1", "'--top-p'"),
], ids=["max-new-tokens-not-a-number", "temperature-nan", "top-p-negative"])
def test_a_bad_sampling_option_is_named_as_typed(tiny_bundle, option, value, named):
    result = invoke("run", tiny_bundle.path, "--prompt", "hi", option, value)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {named}:" in result.stderr, result.stderr
    assert result.stdout == ""
