"""The iconv fix of a file that is not UTF-8 (edgesdk/errors.py), embed's --file refusals (edgesdk/cli_embed.py) and
edgesdk env's onnxruntime row (edgesdk/envinfo.py)."""

from __future__ import annotations

import shlex

import pytest

from edgesdk.errors import EdgeSDKError, read_utf8


def _fix_command(path) -> list[str]:
    """The command of the fix read_utf8 gives for ``path`` (its words as a shell splits them)."""
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "training text")
    return shlex.split(refused.value.fix.split("e.g. ", 1)[1])


def test_windows_1252_text_is_named_cp1252_not_latin1(tmp_path):
    """Windows' "ANSI" text has its curly quotes and dashes at 0x80-0x9F, where Latin-1 has C1 control codes:
    'iconv -f latin1' turned them into invisible controls without an error."""
    path = tmp_path / "notes.txt"
    text = "\u201cHello\u201d \u2013 caf\u00e9\n"
    path.write_bytes(text.encode("cp1252"))
    command = _fix_command(path)
    assert command[:5] == ["iconv", "-f", "cp1252", "-t", "utf-8"]
    assert path.read_bytes().decode(command[2]) == text


def test_latin1_text_without_windows_characters_is_still_named_latin1(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin1") * 20)
    assert _fix_command(path)[:3] == ["iconv", "-f", "latin1"]


@pytest.mark.parametrize("damage", [b"\xe2\x82", b" \xe9 "], ids=["cut-inside-a-character", "one-latin1-byte"])
def test_utf8_text_with_a_few_bad_bytes_gets_the_fix_that_drops_them(tmp_path, damage):
    """A UTF-8 file cut inside a character (or with one stray byte) was named Latin-1: converted so, every accented
    letter it holds doubled into two (é became Ã©)."""
    path = tmp_path / "notes.txt"
    good = "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u2014 na\u00efve\n"
    path.write_bytes(good.encode("utf-8") + damage)
    command = _fix_command(path)
    assert command[:6] == ["iconv", "-c", "-f", "utf-8", "-t", "utf-8"]
    assert path.read_bytes().decode("utf-8", errors="ignore").startswith(good)


def _embed_file(bundle_dir, text_file):
    from click.testing import CliRunner

    from edgesdk.cli import main

    return CliRunner().invoke(main, ["embed", str(bundle_dir), "-f", str(text_file)])


def test_embed_names_a_file_it_cannot_look_up_instead_of_a_traceback(tmp_path):
    """pathlib's exists() raises where stat fails for another reason than a missing file (a name longer than the
    file system allows here, EACCES on a folder for a user other than root): embed -f ended in a traceback."""
    text_file = tmp_path / ("n" * 300 + ".txt")
    result = _embed_file(tmp_path, text_file)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert f"--file {text_file} cannot be read (File name too long)" in result.stderr
    assert "fix: pass a readable text file" in result.stderr


def test_embed_still_names_a_directory_and_a_missing_file(tmp_path):
    folder = _embed_file(tmp_path, tmp_path)
    assert folder.exit_code == 2
    assert "is not a file (it is a directory)" in folder.stderr
    missing = _embed_file(tmp_path, tmp_path / "gone.txt")
    assert missing.exit_code == 2
    assert "is not a file (nothing exists at that path)" in missing.stderr


def test_env_names_a_second_onnxruntime_distribution_installed_beside_the_first(tmp_path, monkeypatch):
    """onnxruntime and onnxruntime-gpu install the same 'onnxruntime' package, and the one installed last decides
    what runs (only the CPU provider, microsoft/onnxruntime#6183): edgesdk env showed the first one's version
    alone, hiding the clash a bug report is about. The clash is a key of its own (--json keeps each package's value a
    version), and a row under packages in the printed report."""
    import json
    from importlib import metadata

    from click.testing import CliRunner

    from edgesdk.cli import main
    from edgesdk.envinfo import NOT_INSTALLED, collect_env, format_env, package_version

    if package_version("onnxruntime-gpu") != NOT_INSTALLED:
        pytest.skip("a real onnxruntime-gpu distribution is installed")
    info = tmp_path / "onnxruntime_gpu-1.19.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.19.2\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    cpu = metadata.version("onnxruntime")
    env = collect_env(tmp_path)
    assert env["packages"]["onnxruntime"] == cpu
    [conflict] = env["package_conflicts"]
    assert conflict.startswith(f"onnxruntime {cpu} and onnxruntime-gpu 1.19.2 are installed together")
    assert "pip uninstall" in conflict
    printed = " ".join(format_env(env).split())
    assert f"conflict : onnxruntime {cpu} and onnxruntime-gpu 1.19.2 are installed together" in printed
    shown = json.loads(CliRunner().invoke(main, ["env", "--json"]).output)
    assert shown["packages"]["onnxruntime"] == cpu
    assert shown["package_conflicts"] == [conflict]


def test_env_shows_a_lone_onnxruntime_as_before():
    from importlib import metadata

    from edgesdk.envinfo import NOT_INSTALLED, collect_env, package_version

    if package_version("onnxruntime-gpu") != NOT_INSTALLED:
        pytest.skip("a real onnxruntime-gpu distribution is installed")
    env = collect_env()
    assert env["packages"]["onnxruntime"] == metadata.version("onnxruntime")
    assert env["package_conflicts"] == []


def test_embed_names_the_line_of_a_file_whose_escapes_give_bytes_that_are_not_utf8(tmp_path):
    """With -e (on by default) a --file line holding '\\xe9' gives a byte that is not UTF-8: the refusal quoted the
    whole file (every line of a long document on the terminal) and named neither the line nor --no-escape."""
    text_file = tmp_path / "notes.txt"
    lines = [f"line {number} of a long document" for number in range(1, 51)] + ['printf "\\xe9" writes one byte']
    text_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _embed_file(tmp_path, text_file)
    assert result.exit_code == 2, result.output
    message = " ".join(result.stderr.split())
    assert "line 51 ('printf" in message  # process_escapes's per-line refusal
    assert "'--file' / '-f'" in message
    assert "--no-escape" in message
    assert "line 1 of a long document" not in message
