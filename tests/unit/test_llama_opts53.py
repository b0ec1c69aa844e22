"""llama.cpp's options edgesdk refuses are refused by their own name however they are spelled (``--opt=VALUE``,
``--opt VALUE``, or last with no value), and ``edgesdk bench -pg P,0`` / ``-pg 0,N`` too long for the bundle's context
is refused naming the -pg the user gave, not a -p or -n they never passed."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from edgesdk.bundle import read_manifest
from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.bench import BenchConfig, check_room


def _refused_by_name(args: list[str], long: str, command: str) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"is llama.cpp's {long}, which edgesdk {command} does not have" in result.output, result.output
    assert "is a switch and takes no value" not in result.output
    assert "needs a value" not in result.output
    return result.output


@pytest.mark.parametrize(("command", "given", "long"), [
    ("run", "--binary-file=prompt.bin", "--binary-file"),  # common/arg.cpp: -bf, --binary-file FNAME
    ("embed", "--system-prompt-file=system.txt", "--system-prompt-file"),  # -sysf FNAME
    ("embed", "--json-schema-file=schema.json", "--json-schema-file"),  # -jf FILE
    ("run", "--lookup-cache-static=cache.bin", "--lookup-cache-static"),  # -lcs FNAME
    ("run", "--mmproj=mmproj.gguf", "--mmproj"),  # -mm FILE
    ("run", "--fit-print=on", "--fit-print"),  # -fitp on|off
    ("run", "--hf-repo=org/model", "--hf-repo"),  # -hf <user>/<model>[:quant]
    ("run", "--timeout=30", "--timeout"),  # -to N
    ("bench", "--numa=distribute", "--numa"),  # llama-bench's --numa TYPE
])
def test_a_refused_option_given_with_its_value_inline_is_refused_by_name(command, given, long):
    _refused_by_name([command, "some-bundle", given], long, command)


def test_a_refused_option_that_takes_a_value_is_refused_by_name_with_or_without_it():
    output = _refused_by_name(["embed", "some-bundle", "-sysf", "system.txt"], "--system-prompt-file", "embed")
    assert "-sysf is llama.cpp's" in output
    _refused_by_name(["embed", "some-bundle", "-sysf"], "--system-prompt-file", "embed")
    _refused_by_name(["run", "some-bundle", "-hf"], "--hf-repo", "run")


def test_llama_cpp_s_other_long_names_of_a_refused_option_are_refused_by_name():
    """-hfd is also --spec-draft-hf, -decay-epochs --learning-rate-decay-epochs, -epochs --epochs (common/arg.cpp)."""
    _refused_by_name(["run", "some-bundle", "--spec-draft-hf", "a/b"], "--hf-repo-draft", "run")
    _refused_by_name(["run", "some-bundle", "--epochs=2"], "--epochs", "run")
    _refused_by_name(["run", "some-bundle", "--learning-rate-decay-epochs", "2"], "--learning-rate-decay-epochs", "run")


@pytest.mark.parametrize(("prompt", "gen", "needed", "fix"), [
    (0, 300, 301, "lower -pg 0,300 to TG at most 255"),
    (300, 0, 300, "lower -pg 300,0 to PP at most 256"),
])
def test_a_lone_pg_test_too_long_is_refused_naming_its_pg(prompt, gen, needed, fix):
    with pytest.raises(EdgeSDKError) as refused:
        check_room(BenchConfig(prompt_tokens=prompt, new_tokens=gen, from_pg=True), 256)
    text = str(refused.value)
    assert f"the bench needs {needed} positions" in text
    assert fix in text
    assert "-n 300" not in text
    assert "-p 300" not in text


def test_p_and_n_tests_too_long_still_name_p_and_n():
    with pytest.raises(EdgeSDKError, match=r"lower -n 300 to at most 255"):
        check_room(BenchConfig(prompt_tokens=0, new_tokens=300), 256)
    with pytest.raises(EdgeSDKError, match=r"lower -p 300 to at most 256"):
        check_room(BenchConfig(prompt_tokens=300, new_tokens=0), 256)


def test_bench_pg_with_a_zero_too_long_for_the_bundle_names_the_pg_given(tiny_bundle, tmp_path):
    """The check runs on the manifest before the model loads: the graph's weights can be gone."""
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle.path, copy)
    graph = read_manifest(copy)["graph"]
    (copy / graph["file"]).unlink()
    limit = graph["max_context"]
    for pg, fix in ((f"0,{limit}", f"lower -pg 0,{limit} to TG at most {limit - 1}"),
                    (f"{limit + 1},0", f"lower -pg {limit + 1},0 to PP at most {limit}")):
        result = CliRunner().invoke(main, ["bench", str(copy), "-p", "0", "-n", "0", "-pg", pg, "--threads", "1"])
        assert result.exit_code != 0
        assert fix in result.output, result.output
        assert "lower -n" not in result.output
        assert "lower -p " not in result.output
