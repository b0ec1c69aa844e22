"""llama.cpp's options that run and serve accept with a note, their values read as common/arg.cpp reads them: a
count (-b, -ub, -tb, ...) that is no whole number, and an on|off|auto word (-fa, --color, --log-colors, -fit) that
is none of llama.cpp's, refused by name rather than taken (with the token after the flag); ``-name=value`` read as
that llama.cpp option rather than as click's short options (``-ngl=99`` as ``-n gl=99``, ``-hf=...`` as -h)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def _invoke(tmp_path, *args: str, command: str = "run", env: dict | None = None):
    """``command`` on a bundle that does not exist: parsing the options comes first, the missing bundle after."""
    extra = ("-p", "hi") if command == "run" else ()
    result = CliRunner().invoke(main, [command, str(tmp_path / "no-bundle"), *args, *extra], env=env)
    return result, " ".join(result.output.split())


@pytest.mark.parametrize(("flag", "value"), [("-b", "abc"), ("--batch-size", "2k"), ("-ub", "1.5"),
                                             ("-tb", "all"), ("-mg", "gpu0"), ("-ncmoe", "x"), ("-fitc", "y")])
def test_a_count_that_is_no_whole_number_is_refused_naming_the_flag(tmp_path, flag, value):
    """llama.cpp reads these with std::stoi and stops at "error while handling argument"; they were taken silently."""
    result, said = _invoke(tmp_path, flag, value)
    assert result.exit_code == 2, said
    assert f"'{flag}'" in said, said
    assert f"{value!r} is not a whole number" in said, said


def test_a_count_flag_followed_by_an_option_does_not_swallow_it(tmp_path):
    """-b --temp 0.7 took '--temp' as -b's value, then blamed the stray '0.7' ("unexpected extra argument")."""
    result, said = _invoke(tmp_path, "-b", "--temp", "0.7")
    assert result.exit_code == 2, said
    assert "'-b'" in said, said
    assert "'--temp' is not a whole number" in said, said
    assert "extra argument" not in said, said


def test_a_server_count_is_checked_in_serve(tmp_path):
    result, said = _invoke(tmp_path, "--threads-http", "many", command="serve")
    assert result.exit_code == 2, said
    assert "'--threads-http'" in said, said
    assert "'many' is not a whole number" in said, said


def test_a_slot_similarity_that_is_no_number_is_refused(tmp_path):
    result, said = _invoke(tmp_path, "-sps", "high", command="serve")
    assert result.exit_code == 2, said
    assert "'-sps'" in said, said
    assert "'high' is not a number" in said, said


def test_a_batch_size_variable_that_is_no_number_is_refused_naming_it(tmp_path):
    result, said = _invoke(tmp_path, env={"LLAMA_ARG_BATCH": "abc"})
    assert result.exit_code == 2, said
    assert "LLAMA_ARG_BATCH='abc'" in said, said
    assert "is not a whole number" in said, said


@pytest.mark.parametrize("args", [("-b", "512"), ("-ub", "-1"), ("-tb", "4"), ("--flash-attn=auto",), ("-fa", "on"),
                                  ("-fa",), ("--color=off",), ("-fit", "off"), ("--log-colors", "on")])
def test_good_values_are_accepted_with_the_note(tmp_path, args):
    result, said = _invoke(tmp_path, *args)
    assert "changes nothing here" in said, said
    assert "does not exist" in said, said  # parsing went on to the bundle


@pytest.mark.parametrize(("arg", "flag"), [("--flash-attn=maybe", "--flash-attn"), ("--color=yes", "--color"),
                                           ("--log-colors=sometimes", "--log-colors")])
def test_an_unknown_on_off_auto_word_is_refused(tmp_path, arg, flag):
    """llama.cpp: "unknown value for --flash-attn: 'maybe'"; the word was accepted with the note."""
    result, said = _invoke(tmp_path, arg)
    assert result.exit_code == 2, said
    assert f"'{flag}'" in said, said
    assert "on, off or auto" in said, said


def test_fit_takes_on_or_off(tmp_path):
    result, said = _invoke(tmp_path, "-fit", "auto")
    assert result.exit_code == 2, said
    assert "'-fit'" in said, said
    assert "give on or off" in said, said


def test_log_colors_without_a_value_does_not_swallow_the_next_option(tmp_path):
    """Older llama.cpp made --log-colors a switch, as --color: '--log-colors -p hi' took '-p' as its value."""
    result, said = _invoke(tmp_path, "--log-colors")
    assert "--log-colors is accepted" in said, said
    assert "does not exist" in said, said
    assert "extra argument" not in said, said


def test_a_gpu_layers_value_after_an_equals_sign_is_read_as_ngl(tmp_path):
    """click read -ngl=99 as -n 'gl=99' and blamed --max-new-tokens."""
    result, said = _invoke(tmp_path, "-ngl=99")
    assert "-ngl is accepted" in said, said
    assert "max-new-tokens" not in said, said
    assert "does not exist" in said, said


def test_a_bad_gpu_layers_value_after_an_equals_sign_is_refused_as_ngl(tmp_path):
    result, said = _invoke(tmp_path, "-ngl=lots")
    assert result.exit_code == 2, said
    assert "'-ngl'" in said, said
    assert "'lots' is not a layer count" in said, said


def test_hf_repo_after_an_equals_sign_is_refused_not_helped(tmp_path):
    """click read -hf=ORG/NAME as -h: it printed the help and exited 0, as if the run had succeeded."""
    result, said = _invoke(tmp_path, "-hf=org/name")
    assert result.exit_code == 2, said
    assert "-hf is llama.cpp's --hf-repo" in said, said


def test_parallel_after_an_equals_sign_is_checked_in_serve(tmp_path):
    result, said = _invoke(tmp_path, "-np=4", command="serve")
    assert result.exit_code == 2, said
    assert "'-np'" in said, said
    assert "is 4" in said, said
    assert "max-new-tokens" not in said, said


def test_an_own_short_option_with_an_equals_sign_stays_the_commands(tmp_path):
    """-sys is run's own option: -sys=TEXT stays click's (its long-option form), not llama.cpp's table."""
    result, said = _invoke(tmp_path, "-sys=Be brief.")
    assert "does not exist" in said, said
