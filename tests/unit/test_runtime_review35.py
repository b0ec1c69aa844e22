"""The generation loop's inputs at their edges: JSON schemas holding integers past Python's digit limit, logit bias
ids past any array, and draft settings that are not numbers."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.runtime.generate import LogitBiasError, SamplingConfig, generate
from edgesdk.runtime.json_schema import SchemaError, compile_schema
from edgesdk.runtime.speculative import DraftConfig

LONG = "1" + "0" * 5000  # past Python's 4,300-digit limit on integers read from or written as text

needs_digit_limit = pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"),
                                       reason="Python before 3.11 reads integers of any length")


@needs_digit_limit
def test_a_schema_text_holding_an_integer_past_pythons_digit_limit_is_a_schema_error():
    text = '{"type": "object", "properties": {"a": {"const": ' + LONG + '}}, "required": ["a"]}'
    with pytest.raises(SchemaError, match="integer longer than Python reads") as caught:
        compile_schema(text)
    assert "shorten that integer" in caught.value.fix
    schema = {"type": "object", "properties": {"a": {"enum": [[int(LONG[:4000]) * 10 ** 1000]]}}}
    with pytest.raises(SchemaError, match=r"\$\.properties\.a\.enum: a value holds an integer longer"):
        compile_schema(schema)


@needs_digit_limit
def test_run_refuses_such_a_schema_as_a_usage_error(tiny_bundle):
    schema = '{"type": "object", "properties": {"a": {"const": ' + LONG + '}}}'
    result = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "-p", "hi", "--json-schema", schema],
                                prog_name="edgesdk")
    assert result.exit_code == 2, result.output
    assert "--json-schema" in result.output
    assert "integer longer than Python reads" in result.output


def test_a_logit_bias_id_past_a_64_bit_integer_is_named_as_past_the_vocabulary(runtime):
    config = SamplingConfig(logit_bias={2**70: 5.0})
    with pytest.raises(LogitBiasError, match=rf"logit_bias names token id {2**70}; this model's vocabulary has ids 0 "
                                             rf"to {runtime.backend.vocab_size - 1}"):
        generate(runtime.backend, runtime.tokenizer.encode("hi"), config, set())


@pytest.mark.parametrize("p_min", ["0.5", None, True, [0.5]])
def test_a_draft_p_min_that_is_no_number_is_named(p_min):
    with pytest.raises(ValueError, match=r"p_min must be in \[0, 1\), got "):
        DraftConfig(p_min=p_min)
    assert DraftConfig(p_min=0).p_min == 0
