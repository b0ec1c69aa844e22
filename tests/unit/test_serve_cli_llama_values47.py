"""``edgesdk serve`` reads -n, --temp and --top-k as llama-server reads them (common/arg.cpp), as ``run`` does."""

from __future__ import annotations

import socket

import pytest

from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_cli import invoke


@pytest.mark.parametrize("args", [("-n", -1), ("-n", -2), ("--temp", -1), ("--top-k", -1)],
                         ids=["n-1", "n-2", "temp-1", "top-k-1"])
def test_serve_takes_llama_server_s_negative_values(tiny_bundle, args):
    """The port is taken, so a serve that got past its options stops right after, at the bind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = invoke("serve", tiny_bundle.path, "--port", taken.getsockname()[1], "--threads", 1, *args)
    assert result.exit_code not in (0, 2), result.output
    assert "Invalid value" not in result.stderr
    # it got as far as the bind: any other refusal of the value (exit 1 too) would pass the lines above
    assert "cannot listen on" in result.stderr, result.stderr


def test_serve_refuses_n_zero_naming_what_n_takes(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "--port", 0, "--threads", 1, "-n", 0)
    assert result.exit_code == 2
    assert "-1 for no limit" in result.stderr


def test_the_unlimited_default_is_the_request_s_unlimited():
    """A request's max_tokens -1 and the server's -n -1 are one limit, so context shift caps both alike."""
    from edgesdk.cli_serve import _token_limit

    assert _token_limit(-1) == _token_limit(-2) == UNTIL_THE_CONTEXT_FILLS
    assert ServeDefaults(max_tokens=_token_limit(-1)).max_tokens == UNTIL_THE_CONTEXT_FILLS
