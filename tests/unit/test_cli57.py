"""Host CLI commands (edgesdk/cli_embed.py, cli_deploy.py, cli_bench.py): errors whose fix fits the input, and
bench's table naming the bundle a relative path leads to."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_embed import _inputs
from edgesdk.errors import EdgeSDKError


def refusal(prompts, text_file=None, separator="\n") -> EdgeSDKError:
    with pytest.raises(EdgeSDKError) as caught:
        _inputs(prompts, text_file, separator)
    return caught.value


def test_an_empty_prompt_is_asked_for_text_not_for_an_empty_line_removed():
    error = refusal(("",))
    assert error.problem == "--prompt is empty: there is nothing to embed"
    assert "remove the empty" not in error.fix  # there is no line to remove: the whole value is empty
    assert "give --prompt the text to embed" in error.fix
    error = refusal(("a cat", ""))
    assert error.problem.startswith("--prompt 2 is empty")
    assert "give --prompt the text to embed" in error.fix


def test_an_empty_file_is_asked_for_text_not_for_an_empty_line_removed(tmp_path):
    for content in ("", "\n"):  # one trailing newline is dropped, as llama.cpp's -f drops it
        path = tmp_path / "passages.txt"
        path.write_text(content, encoding="utf-8")
        error = refusal((), path)
        assert error.problem == f"--file {path} is empty: there is nothing to embed"
        assert "remove the empty" not in error.fix
        assert "write the text to embed into the file" in error.fix


def test_an_empty_piece_between_separators_still_asks_for_it_removed():
    error = refusal(("one\n\nthree",))
    assert error.problem.startswith("line 2 of --prompt is empty")
    assert error.fix.startswith("remove the empty line")
    error = refusal(("a<#sep#><#sep#>b",), separator="<#sep#>")
    assert error.fix.startswith("remove the empty piece")


@pytest.mark.parametrize(("mode", "does"), [("--status", "--status only shows the board's releases"),
                                            ("--rollback", "--rollback restarts a unit")])
def test_service_beside_status_or_rollback_says_what_that_mode_does_and_the_fix(tmp_path, mode, does):
    result = CliRunner().invoke(main, ["deploy", mode, "--service", "--to", str(tmp_path / "root")])
    assert result.exit_code == 2, result.output
    assert does in result.stderr
    assert "drop --service" in result.stderr
    assert not (tmp_path / "root").exists()


TABLE_ROW = re.compile(r"^\| (?P<bundle>[^|]*) \| [^|]* \| [^|]* \| (?P<backend>[^|]*) \| \d+ \| (?P<test>pp\d+|tg\d+) \|")


def bench_rows(stdout: str) -> list[str]:
    return [match.group("bundle") for line in stdout.splitlines() if (match := TABLE_ROW.match(line))]


def test_bench_table_names_the_bundle_given_as_dot_or_through_a_link(tiny_bundle, tmp_path, monkeypatch):
    args = ["-t", "1", "-p", "4", "-n", "0", "-r", "1", "--no-warmup"]
    monkeypatch.chdir(tiny_bundle.path)
    result = CliRunner().invoke(main, ["bench", ".", *args])
    assert result.exit_code == 0, result.output + result.stderr
    assert bench_rows(result.stdout) == [tiny_bundle.path.name]  # Path(".").name is ""
    current = tmp_path / "current"  # a deploy root's link to its release keeps its own name
    current.symlink_to(tiny_bundle.path, target_is_directory=True)
    result = CliRunner().invoke(main, ["bench", str(current), *args])
    assert result.exit_code == 0, result.output + result.stderr
    assert bench_rows(result.stdout) == ["current"]


def test_bench_refuses_a_delay_longer_than_llama_bench_reads_before_loading_the_model(tiny_bundle):
    # llama-bench reads --delay with std::stoi (at most INT_MAX); one past what time.sleep takes ended the run in an
    # OverflowError after the model had loaded
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle.path), "-t", "1", "-p", "4", "-n", "0", "-r", "1",
                                       "--delay", str(10**10)])
    assert result.exit_code == 2, (result.exception, result.output)
    assert "--delay" in result.stderr
    assert "10000000000" in result.stderr
    assert "2147483647" in result.stderr


@pytest.mark.parametrize("mode", [[], ["--status"], ["--rollback"]])
def test_deploy_to_an_empty_path_is_refused_not_read_as_the_current_directory(tiny_bundle, tmp_path, monkeypatch,
                                                                                mode):
    # --to "$SDCARD" with the variable unset: pathlib reads '' as '.', and the deploy went into the working directory
    monkeypatch.chdir(tmp_path)
    args = mode or [str(tiny_bundle.path)]
    result = CliRunner().invoke(main, ["deploy", *args, "--to", ""])
    assert result.exit_code == 2, (result.exception, result.output)
    assert "'--to'" in result.stderr
    assert "empty path" in result.stderr
    assert "--to ." in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_empty_inventory_path_is_refused_as_empty_not_as_the_directory_dot(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["deploy", str(tiny_bundle.path), "--hosts", ""])
    assert result.exit_code == 2, (result.exception, result.output)
    assert "'--hosts'" in result.stderr
    assert "empty path" in result.stderr
    assert "inventory (--hosts) ." not in result.stderr


def test_an_empty_file_path_is_refused_as_empty_not_as_the_directory_dot(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "-f", ""])
    assert result.exit_code == 2, (result.exception, result.output)
    assert "empty path names no file" in result.stderr
    assert "'.'" not in result.stderr
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "-f", "."])  # '.' itself is still named
    assert result.exit_code == 2
    assert "'.' is not a file (it is a directory)" in result.stderr
