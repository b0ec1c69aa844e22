"""The command line as a user meets it: refusals that come before the work they would waste."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests._utils.tiny import CORPUS


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk", **kwargs)


def test_last_word_on_a_text_without_paragraphs_is_refused_before_scoring(tiny_bundle, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS), encoding="utf-8")  # short lines: no 40-150-word paragraph ending in ' .'
    result = invoke("eval", tiny_bundle.path, "--text", text, "--context", "32", "--last-word")
    assert result.exit_code == 1, result.output
    assert f"--last-word: --text {text} has no paragraph to score" in result.stderr, result.stderr
    assert "drop --last-word" in result.stderr.split("fix:", 1)[1]
    assert "perplexity" not in result.stderr  # refused before the bundle was scored
    assert result.stdout == ""


def test_last_word_paragraphs_past_max_chars_name_max_chars(tiny_bundle, tmp_path):
    paragraph = " ".join(["word"] * 50) + " ending ."
    text = tmp_path / "text.txt"
    text.write_text("short line\n" * 20 + paragraph + "\n", encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--text", text, "--context", "32", "--last-word", "--max-chars", "100")
    assert result.exit_code == 1, result.output
    assert "in its first 100 characters (--max-chars)" in result.stderr, result.stderr
    assert "raise --max-chars" in result.stderr.split("fix:", 1)[1]
    # the whole file holds one: scored
    result = invoke("eval", tiny_bundle.path, "--text", text, "--context", "32", "--last-word", "--max-chars", "0",
                    "--json")
    assert result.exit_code == 0, result.output
    assert '"documents": 1' in result.stdout


@pytest.mark.parametrize(("args", "named"), [
    (["--remote-root", "releases"], "--remote-root"), (["-i", "key"], "-i"), (["-o", "Port=2222"], "--ssh-option"),
    (["--ssh-config", "config"], "--ssh-config"), (["--ssh-command", "ssh -v"], "--ssh-command"),
    (["--accept-new-host-key"], "--accept-new-host-key"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_deploy_to_a_directory_refuses_the_options_of_ssh(tmp_path, args, named):
    root = tmp_path / "root"
    result = invoke("deploy", "--status", "--to", root, *args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {named}: works only with --host: --to {root} deploys into that directory" \
           in result.stderr, result.stderr
    assert not root.exists()  # refused before the directory was probed


def test_deploy_to_a_directory_takes_edgesdk_ssh_from_the_environment(tmp_path):
    root = tmp_path / "root"
    result = invoke("deploy", "--status", "--to", root, env={"EDGESDK_SSH": "ssh -v"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"board      local directory {root.resolve()}")


def test_repeat_last_n_without_a_penalty_is_named_as_unused(tiny_bundle):
    plain = invoke("run", tiny_bundle.path, "-p", "hello", "-n", "3")
    result = invoke("run", tiny_bundle.path, "-p", "hello", "-n", "3", "--repeat-last-n", "128")
    assert result.exit_code == 0, result.output
    assert "--repeat-last-n is not used: it is the window of the penalties, and none is on" in result.stderr
    assert result.stdout == plain.stdout  # the answer is the same: nothing looked back over the 128 tokens
    penalized = invoke("run", tiny_bundle.path, "-p", "hello", "-n", "3", "--repeat-last-n", "128",
                       "--repeat-penalty", "1.1")
    assert penalized.exit_code == 0, penalized.output
    assert "--repeat-last-n" not in penalized.stderr
