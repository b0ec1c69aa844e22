"""``edgesdk bench`` option values, review 56: a digit sign that is no ASCII digit ("²", which ``str.isdigit`` takes
and ``int`` refuses) in ``-pg`` or ``-t`` is a usage error naming the option, as in ``-p``, not a traceback."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


@pytest.mark.parametrize(("option", "value", "named"), [("-pg", "²,1", "-pg"), ("-pg", "512,¹²⁸", "-pg"),
                                                         ("-t", "²", "--threads"), ("-t", "-²", "--threads")])
def test_a_superscript_digit_is_a_usage_error(tmp_path, option, value, named):
    result = CliRunner().invoke(main, ["bench", str(tmp_path / "no-bundle"), option, value])
    assert result.exit_code == 2, repr(result.exception)
    assert isinstance(result.exception, SystemExit)
    assert named in result.output
    assert value in result.output
