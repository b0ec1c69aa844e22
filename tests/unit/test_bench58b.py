"""``edgesdk bench``, review 58b: llama-bench's list values are ASCII digits (its ``std::regex``), where Python's ``\\d``
took a full-width or Arabic-Indic count ('５１２' ran pp512); and a record's ``test_time`` is when the test began,
before its ``--delay`` cool-off, as llama-bench's ``test`` is made before it sleeps (it was stamped after the sleep)."""

from __future__ import annotations

import calendar
import json
import time

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.runtime.bench import parse_int_range
from tests.unit.test_cli import assert_ok, invoke


@pytest.mark.parametrize("text", ["５１２", "١٢٨", "1-８", "128,２５６"])
def test_a_count_of_non_ascii_digits_is_no_llama_bench_count(text):
    with pytest.raises(ValueError, match="is not a count or range"):
        parse_int_range(text)
    assert parse_int_range("128,1-8+4") == [128, 1, 5]  # the ASCII forms still read


@pytest.mark.parametrize(("option", "named"), [("-p", "--prompt-tokens"), ("-n", "--new-tokens"), ("-t", "--threads")])
def test_a_full_width_count_is_a_usage_error_naming_the_option(tmp_path, option, named):
    result = CliRunner().invoke(main, ["bench", str(tmp_path / "no-bundle"), option, "５"])
    assert result.exit_code == 2, repr(result.exception)
    assert isinstance(result.exception, SystemExit)
    assert named in result.output
    assert "'５'" in result.output


def test_test_time_is_before_the_delay_as_llama_bench_stamps_it(tiny_bundle, monkeypatch):
    """The cool-off runs on a clock that --delay moves (no real wait): the record's test_time must be the clock's
    time before the sleep, llama-bench's ``test t(...)`` then ``sleep_for(delay)``."""
    real_gmtime = time.gmtime
    clock = {"now": 1_700_000_000.0}
    slept_from = []

    def sleep(seconds):
        slept_from.append(clock["now"])
        clock["now"] += seconds

    monkeypatch.setattr(time, "gmtime", lambda secs=None: real_gmtime(clock["now"] if secs is None else secs))
    monkeypatch.setattr(time, "sleep", sleep)
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 0, "-pg", "2,1", "-r", 1, "-t", 1, "--no-warmup",
                    "--delay", 600, "-o", "jsonl")
    assert_ok(result)
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    stamped = [calendar.timegm(time.strptime(record["test_time"], "%Y-%m-%dT%H:%M:%SZ")) for record in records]
    assert stamped == [int(start) for start in slept_from] == [1_700_000_000, 1_700_000_600]
