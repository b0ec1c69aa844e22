"""Last read of this round's fixes: what they still got wrong for some inputs."""

from __future__ import annotations

import pytest

from edgesdk.cli_thermal import _seconds
from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig
from edgesdk.serve.model_pool import ollama_key
from edgesdk.serve.ollama import served_names


@pytest.mark.parametrize(("value", "shown"), [(0.914, "0.914"), (60, "60"), (999.4, "999"), (999.6, "1,000"),
                                              (3600, "3,600")])
def test_seconds_are_never_written_in_exponent_form(value, shown):
    assert _seconds(value) == shown  # 999.6 was '1e+03'


@pytest.mark.parametrize("stride", [0, -3])
def test_a_too_short_context_under_a_bad_stride_suggests_a_context_that_can_work(stride):
    with pytest.raises(ValueError, match="pass a context of 2 or more") as refused:
        PerplexityConfig(method=LLAMA_PERPLEXITY, context=1, ppl_stride=stride)
    assert "context of 1 or more" not in str(refused.value)  # was ppl_stride + 1: 1, or -2


def test_a_served_name_with_a_port_in_its_host_lists_its_latest_form_as_requests_match_it():
    names = served_names("localhost:5000/me/qwen")  # ':5000' is the host's port, not a tag
    assert names == ("localhost:5000/me/qwen", "localhost:5000/me/qwen:latest")
    assert {ollama_key(name) for name in names} == {ollama_key("localhost:5000/me/qwen")}
    assert served_names("qwen:7b") == ("qwen:7b",)


def test_a_too_short_plan_never_suggests_minutes_the_plan_size_check_refuses():
    """The note's --minutes was capped at a day only, not at the steps a plan may simulate: it said "pass --minutes
    407 or more" where check_plan_size refuses anything past 85.4 for these requests."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    args = ["thermal", "plan", "--target", "rpi5", "--decode-tok-s", "2000", "--prefill-tok-s", "1",
            "--prompt-tokens", "2000", "--new-tokens", "100000", "--minutes", "30"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "a plan of these requests simulates at most --minutes 85.4: pass fewer --prompt-tokens or --new-tokens" \
        in result.output
    assert "or more" not in result.output.split("no step was timed;")[1]
    refused = CliRunner().invoke(main, [*args[:-1], "86"])
    assert "pass --minutes 85.4 or less" in refused.output  # the cap the note names is check_plan_size's own


def test_a_number_format_on_a_string_alone_is_still_refused_by_name():
    """int64 on a string alone (protobuf's JSON form of an int64: decimal digits) is not followed: refused by name,
    as before, not taken as any string; beside a type list with a number type it bounds the numbers only."""
    from edgesdk.runtime.json_schema import SchemaError, compile_schema

    with pytest.raises(SchemaError, match='format "int64" is not supported'):
        compile_schema({"type": "object", "properties": {"a": {"type": "string", "format": "int64"}}})
    compile_schema({"type": "object", "properties": {"a": {"type": ["integer", "string"], "format": "int64"}}})


def test_seconds_below_a_thousandth_are_not_written_as_zero():
    assert _seconds(1e-5) == "1e-05"  # the exponent form is kept where it is the only way to show the value
    assert _seconds(0.0) == "0"
