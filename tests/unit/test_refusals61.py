"""Refusals a user-journey review found wrong or unhelpful: llama.cpp's sampler options (--mirostat, --dry-*, --xtc-*,
--typical, --top-nsigma, --dynatemp-*) and -v / --verbose were click's "No such option ... Did you mean '--stats'?";
-hf's fix named 'edgesdk build --model ORG/NAME', which the build refuses for a Hub id not downloaded; -c past the
bundle's context suggested a --max-context the model's max_position_embeddings caps; pack refused a .zip saying the
boards' standard library has no zip."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli import main

# (option, a value that turns its llama.cpp sampler on, the value that leaves it off, the sampler as refused)
SWITCHES = [("--mirostat", "2", "0", "mirostat"), ("--typical", "0.9", "1", "locally typical"),
            ("--typical-p", "0.5", "1", "locally typical"), ("--dry-multiplier", "0.8", "0", "DRY"),
            ("--xtc-probability", "0.5", "0", "XTC"), ("--top-nsigma", "1.5", "-1", "top-n-sigma"),
            ("--top-n-sigma", "2", "-1", "top-n-sigma"), ("--dynatemp-range", "0.5", "0", "dynamic temperature"),
            ("--adaptive-target", "0.3", "-1", "adaptive-p")]
# other values that leave a sampler off, as src/llama-sampling.cpp reads them (SillyTavern sends top_n_sigma 0)
OTHER_OFF = [("--typical-p", "1.0"), ("--typical", "1.5"), ("--top-n-sigma", "0"), ("--xtc-probability", "-0.1"),
             ("--dynatemp-range", "-1"), ("--adaptive-target", "-0.5"), ("--dry-multiplier", "0.0")]
# options that only tune one of those samplers, each with a value llama.cpp takes
TUNING = [("--mirostat-lr", "0.2"), ("--mirostat-ent", "3"), ("--dry-base", "1.75"), ("--dry-allowed-length", "2"),
          ("--dry-penalty-last-n", "-1"), ("--dry-sequence-breaker", "\\n"), ("--xtc-threshold", "0.1"),
          ("--dynatemp-exp", "1.5"), ("--adaptive-decay", "0.9")]


def _invoke(tmp_path, *args: str, command: str = "run"):
    """``command`` on a bundle that does not exist: parsing the options comes first, the missing bundle after."""
    extra = ("-p", "hi") if command == "run" else ()
    result = CliRunner().invoke(main, [command, str(tmp_path / "no-bundle"), *args, *extra])
    return result, " ".join(result.output.split())


def _kept(command_name: str, args: list[str], capsys) -> tuple[list[str], str]:
    """What LlamaCommand leaves of ``args`` for click to parse, and the notes it wrote on stderr."""
    command = main.commands[command_name]
    with click.Context(command, info_name=command_name, **main.context_settings) as ctx:  # -h kept for --help tests
        kept = command._llama_args(ctx, list(args))
    return kept, capsys.readouterr().err


@pytest.mark.parametrize(("flag", "on", "off", "sampler"), SWITCHES)
def test_a_sampler_edgesdk_lacks_is_refused_by_its_own_name(tmp_path, flag, on, off, sampler):
    """--mirostat 2 was "No such option '--mirostat'. Did you mean '--stats'?"."""
    result, said = _invoke(tmp_path, flag, on)
    assert result.exit_code == 2, said
    assert "No such option" not in said, said
    assert f"'{flag}' (llama.cpp's" in said, said
    assert f"is {on}, and edgesdk has no {sampler} sampler: pass {flag} {off} (off) or leave it out" in said, said
    assert "is the nearest here" in said or "--repeat-penalty" in said, said


@pytest.mark.parametrize(("flag", "off"), [(flag, off) for flag, _, off, _ in SWITCHES] + OTHER_OFF)
@pytest.mark.parametrize("command", ["run", "serve", "embed", "eval", "bench"])
def test_a_sampler_left_off_is_taken_with_a_note(capsys, command, flag, off):
    """At a value that leaves it off llama.cpp samples without it, as edgesdk does: taken, and said."""
    kept, notes = _kept(command, [flag, off], capsys)
    assert kept == []
    assert f"edgesdk: {flag} is accepted for llama.cpp's scripts and changes nothing here" in notes


@pytest.mark.parametrize("command", ["embed", "eval", "bench"])
def test_a_sampler_turned_on_where_nothing_is_sampled_says_so(tmp_path, command):
    result, said = _invoke(tmp_path, "--dry-multiplier", "0.8", command=command)
    assert result.exit_code == 2, said
    assert f"is 0.8, and edgesdk {command} samples no tokens: pass --dry-multiplier 0 (off)" in said, said


def test_serve_names_its_own_nearest_options(tmp_path):
    """serve has no --frequency-penalty: its fix names --repeat-penalty and a request's fields."""
    result, said = _invoke(tmp_path, "--dry-multiplier", "0.8", command="serve")
    assert result.exit_code == 2, said
    assert "--repeat-penalty with --repeat-last-n (and a request's frequency_penalty or presence_penalty)" in said
    assert "--frequency-penalty" not in said, said


@pytest.mark.parametrize(("flag", "value"), TUNING)
def test_a_sampler_s_tuning_is_taken_with_its_value(capsys, flag, value):
    """Its value is the option's, never read as the prompt or as another option; it changes nothing while its
    sampler is off, as in llama.cpp."""
    kept, notes = _kept("run", [flag, value, "-p", "hi"], capsys)
    assert kept == ["-p", "hi"]
    assert f"edgesdk: {flag} is accepted for llama.cpp's scripts and changes nothing here: it tunes llama.cpp's" in notes


@pytest.mark.parametrize(("args", "said"), [
    (["--mirostat", "x"], "'x' is not a whole number, which llama.cpp's --mirostat takes"),
    (["--mirostat-lr", "fast"], "'fast' is not a number, which llama.cpp's --mirostat-lr takes"),
    (["--dry-penalty-last-n", "-2"], "'-2' is not a count of tokens llama.cpp's --dry-penalty-last-n takes"),
    (["--dry-allowed-length", "two"], "'two' is not a whole number, which llama.cpp's --dry-allowed-length takes"),
])
def test_a_value_llama_cpp_refuses_is_refused(tmp_path, args, said):
    result, output = _invoke(tmp_path, *args)
    assert result.exit_code == 2, output
    assert said in output, output


@pytest.mark.parametrize("flag", ["-v", "--verbose", "--log-verbose"])
@pytest.mark.parametrize("command", ["run", "serve", "embed", "eval"])
def test_verbose_is_taken_with_a_note(capsys, command, flag):
    """llama.cpp's -v logs everything; edgesdk writes no llama.cpp log. It was "No such option '-v'"."""
    kept, notes = _kept(command, [flag], capsys)
    assert kept == []
    assert f"edgesdk: {flag} is accepted for llama.cpp's scripts and changes nothing here: edgesdk writes no " \
           "llama.cpp log" in notes


@pytest.mark.parametrize("flag", ["-hf", "--hf-repo", "-hff"])
def test_hf_names_the_download_before_the_build(tmp_path, flag):
    """The fix was 'edgesdk build --model ORG/NAME', which the build refuses for a Hub id not downloaded."""
    result, said = _invoke(tmp_path, flag, "org/name")
    assert result.exit_code == 2, said
    assert "edgesdk downloads nothing from the Hub: download" in said, said
    assert ("'hf download org/name" if flag != "-hff" else "'hf download ORG/NAME") in said, said
    assert "--local-dir DIR'" in said, said
    assert "'edgesdk build --model DIR" in said, said
    assert "--model ORG/NAME" not in said, said


def test_the_build_s_context_numbers_are_the_build_s():
    """cli_llama keeps them without importing the export (it imports click alone)."""
    from edgesdk.cli_build import build
    from edgesdk.cli_llama import BUILD_MAX_CONTEXT
    from edgesdk.export.onnx_export import ExportConfig

    default = next(param.default for param in build.params if param.name == "max_context")
    assert BUILD_MAX_CONTEXT == default == ExportConfig().max_context


def _ctx_refusal(given: tuple[str, int], max_context: int) -> str:
    from edgesdk.cli_llama import checked_ctx_size

    with click.Context(main.commands["run"], **main.context_settings) as ctx:
        ctx.meta["edgesdk.llama.ctx_size"] = given
        with pytest.raises(click.BadParameter) as caught:
            checked_ctx_size(max_context, "B")
    return caught.value.message


def test_c_past_a_bundle_under_the_build_s_default_names_the_model_s_cap():
    """-c 4096 on a 512-token bundle suggested 'edgesdk build --max-context 4096' alone, which builds 512 again where
    the model allows 512 positions."""
    said = _ctx_refusal(("-c", 4096), 512)
    assert "'edgesdk build --max-context 4096', which the model's max_position_embeddings caps" in said, said
    assert "built without --max-context (4096 by default), 512 is that cap, and no build of the model goes past it" \
        in said, said


def test_c_under_the_bundle_s_context_is_the_context_that_runs():
    """-c below the bundle's context is taken as the run's context, as llama.cpp takes it (no rebuild hint)."""
    from edgesdk.cli_llama import checked_ctx_size

    with click.Context(main.commands["run"], **main.context_settings) as ctx:
        ctx.meta["edgesdk.llama.ctx_size"] = ("-c", 256)
        assert checked_ctx_size(512, "B") == 256


def test_c_past_a_bundle_at_the_build_s_default_says_the_build_names_the_cap():
    said = _ctx_refusal(("-c", 8192), 4096)
    assert said.endswith("'edgesdk build --max-context 8192', which the model's max_position_embeddings caps (the "
                         "build says where it does)"), said


def test_the_context_variable_gets_the_same_hint(monkeypatch):
    from edgesdk.cli_llama import ctx_size_env_note

    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "4096")
    note = ctx_size_env_note(512, "B")
    assert "'edgesdk build --max-context 4096', which the model's max_position_embeddings caps" in note, note


def test_run_s_c_past_the_tiny_bundle_names_the_cap(tiny_bundle):
    """The tiny bundle is built at 256 tokens from a model of 512 positions, which its manifest records: the end-to-end
    refusal names the largest --max-context the model allows."""
    result = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "-p", "hi", "-n", "1", "-t", "1", "-c", "4096"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "is 256 tokens, fixed when it was built" in said, said
    assert "rebuild the bundle with 'edgesdk build --max-context 512', the most the model's max_position_embeddings " \
           "(512) allows" in said, said


@pytest.mark.parametrize("name", ["b.zip", "b.7z"])
def test_pack_refuses_an_archive_format_for_what_it_is(tiny_bundle, tmp_path, name):
    """A zip was refused as "the boards' Python 3.10 / 3.11 standard library has no zip" (zipfile is there), with a fix
    about a .tar compressed by another tool."""
    from edgesdk.bundle import pack_bundle
    from edgesdk.errors import BundleError

    with pytest.raises(BundleError) as caught:
        pack_bundle(tiny_bundle.path, tmp_path / name)
    error = caught.value
    assert "an archive format of its own, which edgesdk does not write: a bundle travels as a tar archive" in str(error)
    assert "standard library has no" not in str(error)
    assert error.fix.startswith("name the archive b.tar.xz or b.tar.gz ('edgesdk unpack' and 'edgesdk deploy' read")
    assert "compressed by another tool" not in error.fix
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize(("name", "kind"), [("b.tar.zst", "zstd"), ("b.tlz", "lzma"), ("b.tar.lz4", "lz4")])
def test_pack_refuses_a_compressor_tarfile_does_not_write(tiny_bundle, tmp_path, name, kind):
    """lzma was said to be missing from the standard library, which has it; what lacks it is tarfile's modes."""
    from edgesdk.bundle import pack_bundle
    from edgesdk.errors import BundleError

    with pytest.raises(BundleError) as caught:
        pack_bundle(tiny_bundle.path, tmp_path / name)
    assert (f"asks for {kind}, which edgesdk does not write (the tarfile module of the boards' Python 3.10 / 3.11 "
            "compresses with gzip, bzip2 and xz alone)") in str(caught.value)
    assert "decompressed before 'edgesdk unpack'" in caught.value.fix
