"""The JSON schema constraint's ``duration`` format and a number's format beside a type list
(edgesdk/runtime/json_schema.py, edgesdk/runtime/json_pattern.py)."""

from __future__ import annotations

import datetime
import json

import pytest
from pydantic import TypeAdapter

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from tests.unit.test_json_schema_bounds37 import _complete

DURATION = {"type": "string", "format": "duration"}


@pytest.mark.parametrize("text", ["P1Y2W", "P1W1D", "P1WT1H", "P3M2W", "-P1Y1W"])
def test_duration_writes_no_weeks_beside_other_units(text):
    """RFC 3339 appendix A (which JSON Schema's ``duration`` names) writes weeks alone (``dur-week``), and the
    JSON Schema test suite refuses "P1Y2W"; the constraint wrote it, so a validator refused the answer."""
    assert not _complete(DURATION, json.dumps(text))


@pytest.mark.parametrize("text", ["P2W", "-P9999W", "P1Y2M3DT4H5M6.5S", "P1DT12H", "PT36H", "P0D"])
def test_duration_still_writes_weeks_alone_and_the_other_units(text):
    assert _complete(DURATION, json.dumps(text))
    TypeAdapter(datetime.timedelta).validate_python(text)


@pytest.mark.parametrize("name", ["int32", "int64", "float", "double"])
def test_a_number_format_beside_a_type_list_with_string_bounds_the_numbers_only(name):
    """``{"type": ["integer", "string"], "format": "int32"}`` was refused as 'format "int32" is not supported
    (supported: date, time, ...)', though int32 is followed on the integer and constrains no string."""
    schema = {"type": ["integer", "string"], "format": name}
    compile_schema({"type": "object", "properties": {"v": schema}})
    assert _complete(schema, "5")
    assert _complete(schema, '"any text"')
    if name == "int32":
        assert not _complete(schema, str(2 ** 31))


def test_a_string_format_not_followed_is_still_refused_by_name():
    with pytest.raises(SchemaError, match="uint8"):
        compile_schema({"type": "object", "properties": {"v": {"type": ["integer", "string"], "format": "uint8"}}})
