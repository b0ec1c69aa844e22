"""The ``edgesdk`` command line, in-process through click's CliRunner, on real bundles.

click >= 8.2 keeps stderr apart: ``result.stdout`` and ``result.stderr`` are separate, and
``result.output`` is both interleaved as a terminal would show them.
"""

from __future__ import annotations

import inspect as pyinspect
import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from edgesdk.bundle import read_manifest, verify_bundle
from edgesdk.cli import main
from edgesdk.profile import shipped_profiles
from tests._utils.tiny import CORPUS

TARGETS_DIR = Path(__file__).resolve().parents[2] / "targets"

COMMANDS = [
    (),
    ("env",),
    ("targets",),
    ("targets", "list"),
    ("targets", "show"),
    ("models",),
    ("models", "list"),
    ("models", "fetch"),
    ("build",),
    ("inspect",),
    ("verify",),
    ("run",),
    ("eval",),
    ("pack",),
    ("unpack",),
    ("engine",),
    ("engine", "build"),
]


def invoke(*args, **kwargs):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk", **kwargs)


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"


def assert_error(result, *fragments):
    """A deliberate error: non-zero exit, no traceback, the problem named, and a fix."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # not a crash
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in:\n{result.stderr}"
    assert "fix:" in result.stderr, result.stderr


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def bundle(tiny_bundle, tmp_path) -> Path:
    """A private copy of the session bundle (tests may corrupt it)."""
    return Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def api_generate(bundle: Path, prompt: str, n: int, raw: bool) -> str:
    """What the Python API generates greedily for ``prompt``: the CLI must stream exactly this."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle)
    ids = runtime.tokenizer.prompt_ids(prompt, raw=raw)
    tokens, _ = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=n), runtime.tokenizer.eos_token_ids)
    return runtime.tokenizer.decode(tokens)


# --- help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "main")
def test_help_of_every_command(path):
    command = main
    for name in path:
        command = command.commands[name]
    result = invoke(*path, "--help")
    assert_ok(result)
    assert result.stdout.startswith(f"Usage: edgesdk {' '.join(path)}".rstrip())
    description = pyinspect.cleandoc(command.help).split("\n\n")[0].replace("\b", "")
    assert description.strip()
    assert flat(description) in flat(result.stdout)
    assert "-h, --help" in result.stdout


def test_short_help_flag_and_version():
    assert_ok(invoke("-h"))
    result = invoke("--version")
    assert_ok(result)
    assert "edgesdk" in result.stdout
    assert "0." in result.stdout


def test_unknown_command_is_a_usage_error():
    result = invoke("nonsense")
    assert result.exit_code == 2
    assert "No such command" in result.stderr


# --- targets, env, models -------------------------------------------------------------------------


def test_targets_list_shows_every_profile():
    result = invoke("targets", "list")
    assert_ok(result)
    lines = result.stdout.strip().splitlines()
    names = sorted(p.stem for p in TARGETS_DIR.glob("*.yaml"))
    assert len(names) == 10
    assert len(lines) == 10
    assert sorted(line.split()[0] for line in lines) == names == sorted(shipped_profiles())
    assert "(alias orin-nx)" in result.stdout
    assert "cpu only" in result.stdout
    assert "sm_87" in result.stdout


def test_targets_show_alias_prints_yaml():
    result = invoke("targets", "show", "orin-nx")
    assert_ok(result)
    assert "name: orin-nx-16gb" in result.stdout
    data = yaml.safe_load(result.stdout)
    assert data["name"] == "orin-nx-16gb"
    assert data["gpu"]["sm"] == 87
    assert data == shipped_profiles()["orin-nx-16gb"].summary()


def test_targets_show_unknown_lists_known_targets():
    result = invoke("targets", "show", "nope")
    assert_error(result, "unknown target 'nope'", "known targets:", "rpi5", "orin-nx-16gb", "host")
    assert result.stdout == ""


def test_env_text():
    result = invoke("env")
    assert_ok(result)
    for heading in ("edgesdk:", "packages:", "onnxruntime providers:", "gpu:", "board:"):
        assert heading in result.stdout
    assert "CPUExecutionProvider" in result.stdout


def test_env_json():
    result = invoke("env", "--json")
    assert_ok(result)
    info = json.loads(result.stdout)
    from edgesdk import __version__

    assert info["edgesdk"] == __version__
    assert "CPUExecutionProvider" in info["onnxruntime_providers"]
    assert {"numpy", "onnxruntime", "torch", "transformers"} <= set(info["packages"])
    assert "family" in info["board"]


def test_models_list_mentions_default_alias():
    result = invoke("models", "list")
    assert_ok(result)
    assert "smollm2-135m" in result.stdout
    assert "[default]" in result.stdout


# --- verify and inspect ---------------------------------------------------------------------------


def test_verify_good_bundle(bundle):
    result = invoke("verify", bundle)
    assert_ok(result)
    manifest = read_manifest(bundle)
    assert result.stdout.startswith("ok:")
    assert manifest["bundle_id"] in result.stdout
    assert f"{len(manifest['files'])} files verified" in result.stdout


def test_verify_good_bundle_with_matching_target_alias(bundle):
    assert_ok(invoke("verify", bundle, "--target", "host"))


def test_verify_corrupt_byte_names_the_file(bundle):
    flip_byte(bundle / "model.onnx.data")
    result = invoke("verify", bundle)
    assert_error(result, "failed verification", "model.onnx.data", "sha256")
    assert "ok:" not in result.stdout


def test_verify_wrong_target_names_both(bundle):
    result = invoke("verify", bundle, "--target", "rpi5")
    assert_error(result, "'host'", "'rpi5'", "--target rpi5")


def test_verify_missing_file_in_bundle(bundle):
    (bundle / "tokenizer.json").unlink()
    result = invoke("verify", bundle)
    assert_error(result, "tokenizer.json: missing")


def test_verify_missing_bundle(tmp_path):
    result = invoke("verify", tmp_path / "no-such-bundle")
    assert_error(result, "no-such-bundle", "does not exist")


def test_verify_unlisted_file(bundle):
    (bundle / "extra.bin").write_bytes(b"x")
    assert_error(invoke("verify", bundle), "extra.bin: not listed in the manifest")


def test_inspect_shows_target_and_files(bundle):
    result = invoke("inspect", bundle)
    assert_ok(result)
    manifest = read_manifest(bundle)
    assert "target     host" in result.stdout
    assert manifest["bundle_id"] in result.stdout
    for name in manifest["files"]:
        assert name in result.stdout
    assert "model.onnx.data" in result.stdout
    assert "tokenizer.json" in result.stdout
    assert f"kv heads {manifest['graph']['kv_heads'][0]}," in result.stdout  # the tiny model: 2 in every layer
    assert f"runtime    {manifest['runtime']['backend']}," in result.stdout  # no fallbacks: no dangling arrow


def test_inspect_a_manifest_without_fallbacks(bundle):
    """'runtime.fallbacks' may be left out (verify and run read it as none); inspect raised KeyError."""
    import hashlib

    manifest = read_manifest(bundle)
    del manifest["runtime"]["fallbacks"]
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (bundle / "manifest.json").write_text(text, encoding="utf-8")
    (bundle / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    assert_ok(invoke("verify", bundle))
    result = invoke("inspect", bundle)
    assert_ok(result)
    assert f"runtime    {manifest['runtime']['backend']}, {manifest['runtime']['threads']} threads" in result.stdout


def test_inspect_json_is_the_manifest(bundle):
    result = invoke("inspect", bundle, "--json")
    assert_ok(result)
    assert json.loads(result.stdout) == read_manifest(bundle)


def test_inspect_json_is_strict_json_where_a_stage_diverged(bundle, tmp_path):
    """A diverged stage's perplexity is inf in the manifest; inspect --json printed the bare word Infinity, which
    jq and other strict JSON readers refuse. It is null, as in eval's and bench's JSON."""
    import hashlib

    copy = tmp_path / "diverged"
    shutil.copytree(bundle, copy)
    manifest = read_manifest(copy)
    manifest["baseline"] = {"heldout_perplexity": float("inf")}
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"  # as the bundle writer writes it: Infinity
    (copy / "manifest.json").write_text(text, encoding="utf-8")
    (copy / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    result = invoke("inspect", copy, "--json")
    assert_ok(result)
    assert json.loads(result.stdout, parse_constant=lambda word: pytest.fail(f"{word} is not JSON"))["baseline"] \
        == {"heldout_perplexity": None}


# --- run ------------------------------------------------------------------------------------------


def test_run_prompt_with_stats(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 5, "--stats")
    assert_ok(result)
    expected = api_generate(bundle, "hi", 5, raw=False)
    assert expected  # five tokens of text
    assert result.stdout == expected + "\n"
    stats = [line for line in result.stderr.splitlines() if "tok/s" in line]
    assert len(stats) == 1
    assert "decode" in stats[0]
    assert "prefill" in stats[0]
    assert "stop: max_new_tokens" in stats[0]
    assert "tok/s" not in result.stdout
    assert "decode" not in result.stdout
    assert "edgesdk: ort-cpu: used" in result.stderr


def test_stats_of_a_one_token_answer_show_a_dash_for_the_decode_rate(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 1, "--stats")
    assert_ok(result)
    stats = next(line for line in result.stderr.splitlines() if "tok/s" in line)
    assert "decode - tok/s" in stats
    assert "p95 - ms" in stats
    assert "None" not in stats


def test_run_without_stats_is_quiet_on_stderr(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3)
    assert_ok(result)
    assert result.stderr == ""


def test_run_raw(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 5, "--raw")
    assert_ok(result)
    expected = api_generate(bundle, "hi", 5, raw=True)
    assert expected.strip()  # visible text
    assert result.stdout == expected + "\n"
    assert expected != api_generate(bundle, "hi", 5, raw=False)  # the chat template was skipped


@pytest.mark.parametrize("temperature", ["0.7", "50"])
def test_run_sampling_is_reproducible_with_a_seed(bundle, temperature):
    args = ("run", bundle, "--prompt", "hi", "-n", 8, "--raw", "--temperature", temperature)
    first, second = invoke(*args, "--seed", 3), invoke(*args, "--seed", 3)
    assert_ok(first)
    assert_ok(second)
    assert first.stdout == second.stdout
    assert first.stdout.strip()
    if temperature == "50":  # near-uniform sampling: another seed gives other tokens
        other = invoke(*args, "--seed", 4)
        assert_ok(other)
        assert other.stdout != first.stdout


@pytest.mark.parametrize(("option", "value"), [("--temperature", "nan"), ("--top-p", "1.5"), ("-n", "x")])
def test_run_bad_sampling_option_is_a_usage_error(bundle, option, value):
    result = invoke("run", bundle, "--prompt", "hi", option, value)
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_run_interactive_reads_prompts_from_stdin(bundle):
    result = invoke("run", bundle, "-n", 4, "--raw", input="hello\nworld\n")
    assert_ok(result)
    hello, world = api_generate(bundle, "hello", 4, raw=True), api_generate(bundle, "world", 4, raw=True)
    assert hello != world
    assert result.stdout == f"{hello}\n{world}\n"
    assert "> " not in result.stderr  # no prompt marker when stdin is not a terminal


def test_run_takes_windows_line_endings_on_stdin(bundle):
    unix, windows = invoke("run", bundle, "-n", 4, "--raw", input="hello\nworld\n"), \
        invoke("run", bundle, "-n", 4, "--raw", input="hello\r\nworld\r\n")
    assert_ok(windows)
    assert windows.stdout == unix.stdout


@pytest.mark.parametrize("system", ["be brief", ""])
def test_run_says_when_system_is_not_used(bundle, system):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--raw", "--system", system)
    assert_ok(result)
    assert "--system is not used: --raw feeds the prompt as it is" in result.stderr
    assert result.stdout == invoke("run", bundle, "--prompt", "hi", "-n", 3, "--raw").stdout


def test_run_interactive_skips_blank_lines(bundle):
    result = invoke("run", bundle, "-n", 4, "--raw", input="hello\n\n   \nworld\n")
    assert_ok(result)
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.parametrize(("damage", "name"), [("flip", "model.onnx.data"), ("truncate", "model.onnx")])
def test_run_corrupt_bundle_fails_verification_before_loading(bundle, damage, name):
    path = bundle / name
    if damage == "flip":
        flip_byte(path)
    else:  # a truncated graph would also make ONNX Runtime fail, with another message
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--stats")
    assert_error(result, "failed verification", name)
    assert "no backend" not in result.stderr
    assert "edgesdk: " not in result.stderr  # no session notes: nothing was loaded
    assert "tok/s" not in result.stderr
    assert result.stdout == ""


def test_run_wrong_target(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--target", "rpi5")
    assert_error(result, "'host'", "'rpi5'", "--ignore-target")
    assert result.stdout == ""


def test_run_wrong_target_ignored(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--target", "rpi5", "--ignore-target", "--stats")
    assert_ok(result)
    assert result.stdout == api_generate(bundle, "hi", 3, raw=False) + "\n"
    assert "target check skipped" in result.stderr


def test_run_unknown_backend(bundle):
    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--backend", "warp-drive")
    assert_error(result, "--backend 'warp-drive' is not a backend", "pick one of ort-cpu")


# --- build ----------------------------------------------------------------------------------------


def test_build_prints_bundle_path(tiny_model_dir, tmp_path):
    out = tmp_path / "built"
    result = invoke("build", "--target", "host", "--model", tiny_model_dir, "--out", out, "--max-context", 64,
                    "--no-progress")
    assert_ok(result)
    assert result.stdout.strip() == str(out)
    assert "edgesdk build:" in result.stderr
    assert "edgesdk build:" not in result.stdout
    built = verify_bundle(out, "host")
    assert built.manifest["graph"]["max_context"] == 64
    assert not out.with_name(out.name + ".build").exists()  # work directory removed after success
    assert_ok(invoke("run", out, "--prompt", "hi", "-n", 2))


def _host_profile_text() -> str:
    return (TARGETS_DIR / "host.yaml").read_text(encoding="utf-8")


def test_build_bad_profile_unknown_key(tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(_host_profile_text() + "\nturbo_mode: true\n", encoding="utf-8")
    result = invoke("build", "--target", bad, "--model", tiny_model_dir, "--out", tmp_path / "out",
                    "--no-progress")
    assert_error(result, str(bad), "unknown key 'turbo_mode'", "allowed keys here:", "memory_budget_mb",
                 "thermal_model")
    assert not (tmp_path / "out").exists()


def test_build_bad_profile_nested_unknown_key(tiny_model_dir, tmp_path):
    text = _host_profile_text()
    data = yaml.safe_load(text)
    data["cpu"]["hyperthreads"] = 2
    bad = tmp_path / "bad-nested.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = invoke("build", "--target", bad, "--model", tiny_model_dir, "--out", tmp_path / "out")
    assert_error(result, "unknown key 'cpu.hyperthreads'", "allowed keys here:", "cores", "isa_features")


def test_build_bad_profile_yaml_syntax(tiny_model_dir, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: [unclosed\nfamily: host\n", encoding="utf-8")
    result = invoke("build", "--target", bad, "--model", tiny_model_dir, "--out", tmp_path / "out")
    assert_error(result, str(bad), "not valid YAML")


def test_build_missing_profile_file(tiny_model_dir, tmp_path):
    result = invoke("build", "--target", tmp_path / "absent.yaml", "--model", tiny_model_dir,
                    "--out", tmp_path / "out")
    assert_error(result, "absent.yaml", "does not exist")


def test_build_unknown_model_lists_aliases(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # 'does-not-exist' is looked up relative to the working directory
    result = invoke("build", "--target", "host", "--model", "does-not-exist", "--out", tmp_path / "out",
                    "--no-progress")
    assert_error(result, "unknown model 'does-not-exist'", "smollm2-135m")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("option", "value", "stage", "recipe"), [
    ("--ffn-ratio", "0.4", "prune", "int4-prune"),
    ("--prune-layers", "2", "prune", "int4-prune"),
    ("--distill-steps", "10", "distill", "int4-prune"),
    ("--density", "0.5", "sparsify", "jetson-sparse"),
])
def test_a_shortcut_for_a_stage_the_recipe_lacks_names_the_option_and_recipes_that_have_it(tmp_path, option, value,
                                                                                           stage, recipe):
    """It named the override 'prune.ffn_ratio=0.4' the user never wrote, and the fix named no recipe."""
    result = invoke("build", "--target", "host", "--model", tmp_path / "no-model", "--out", tmp_path / "out",
                    option, value)
    assert_error(result, f"{option} {value}: recipe 'fp32-fused' has no {stage} stage (stages: none)",
                 f"drop {option}, or pick a recipe with a {stage} stage", f"--recipe {recipe}")
    assert "override" not in result.stderr
    assert not (tmp_path / "out.build").exists()


def test_build_requires_target():
    result = invoke("build")
    assert result.exit_code == 2
    assert "--target" in result.stderr


# --- eval -----------------------------------------------------------------------------------------


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n".join(CORPUS), encoding="utf-8")
    return path


EVAL_ARGS = ("--max-chars", 2000, "--context", 32, "--stride", 32, "--json")


def test_eval_json(bundle, text_file):
    result = invoke("eval", bundle, "--text", text_file, *EVAL_ARGS)
    assert_ok(result)
    data = json.loads(result.stdout)  # progress goes to stderr, so stdout is pure JSON
    assert data["bundle"]["perplexity"] > 1
    assert data["bundle"]["tokens_scored"] > 32
    assert data["bundle"]["windows"] > 1
    assert "reference" not in data


def test_eval_text_output(bundle, text_file):
    result = invoke("eval", bundle, "--text", text_file, "--max-chars", 500, "--context", 32, "--stride", 16)
    assert_ok(result)
    assert result.stdout.startswith("bundle perplexity")
    assert "windows" in result.stdout


def test_eval_reference_matches_bundle(bundle, text_file):
    result = invoke("eval", bundle, "--text", text_file, *EVAL_ARGS, "--reference")
    assert_ok(result)
    data = json.loads(result.stdout)
    assert data["reference"]["tokens_scored"] == data["bundle"]["tokens_scored"]
    assert data["reference"]["perplexity"] > 1
    assert abs(data["relative_difference"]) < 1e-4
    assert abs(data["bundle"]["perplexity"] / data["reference"]["perplexity"] - 1) < 1e-4


def test_eval_json_is_strict_when_a_perplexity_overflows():
    from edgesdk.cli import _finite_or_null

    result = {"bundle": {"perplexity": float("inf"), "tokens_scored": 5}, "curve": [{"perplexity": float("nan")}]}
    text = json.dumps(_finite_or_null(result), allow_nan=False)  # Infinity / NaN are not JSON
    assert json.loads(text) == {"bundle": {"perplexity": None, "tokens_scored": 5}, "curve": [{"perplexity": None}]}


def test_eval_missing_text_file(bundle, tmp_path):
    result = invoke("eval", bundle, "--text", tmp_path / "absent.txt")
    assert result.exit_code == 2
    assert "absent.txt" in result.stderr


@pytest.mark.parametrize(("content", "fragments"), [
    (b"", ("has nothing to score: its 0 characters are empty or whitespace", "text.txt", "plain-text file")),
    (b" \n" * 3000, ("its first 2,000 characters (--max-chars) are empty", "raise --max-chars")),
    ("caf\u00e9 na\u00efve\n".encode("latin-1") * 20, ("is not UTF-8 text", "iconv")),
], ids=["empty", "blank-head", "latin-1"])
def test_eval_refuses_unusable_text(bundle, tmp_path, content, fragments):
    path = tmp_path / "text.txt"
    path.write_bytes(content)
    assert_error(invoke("eval", bundle, "--text", path, *EVAL_ARGS), *fragments)


@pytest.mark.parametrize(("args", "fragment"), [
    (("--context", 32, "--stride", 0), "--stride"),
    (("--context", 32, "--stride", 64), "--context/--stride"),
    (("--context", 100_000), "max_context"),
    (("--max-chars", -5), "--max-chars"),
], ids=["stride-0", "stride-over-context", "context-too-long", "negative-max-chars"])
def test_eval_refuses_bad_windows_naming_the_option(bundle, text_file, args, fragment):
    result = invoke("eval", bundle, "--text", text_file, "--max-chars", 500, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert "Traceback" not in result.output


def test_eval_context_alone_sets_the_stride(bundle, text_file):
    """--stride follows --context unless given: --context 32 alone used to fail on the stride of 512."""
    result = invoke("eval", bundle, "--text", text_file, "--max-chars", 500, "--context", 32, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bundle"]["windows"] > 1


@pytest.mark.parametrize(("args", "fragment"), [
    (("--seed", -(2**64)), "--seed"),  # past what llama-cli reads as an unsigned 64-bit number
    (("--temperature", "nan"), "temperature must be a finite number"),
    (("--top-p", "nan"), "top_p must be in [0, 1]"),
], ids=["negative-seed", "nan-temperature", "nan-top-p"])
def test_run_refuses_sampling_options_it_cannot_use(bundle, args, fragment):
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "fragment"), [
    (("--ambient", "nan"), "expected an ambient temperature in °C"),
    (("--ambient", -500), "expected an ambient temperature in °C"),
    (("--sim-speed", "nan"), "how many times slower the simulated board is"),
], ids=["ambient-nan", "ambient-below-physical", "sim-speed-nan"])
def test_run_refuses_simulated_board_settings_that_are_not_physical(bundle, args, fragment):
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, "--simulate-thermal", *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr


def test_top_p_without_a_temperature_is_named_as_unused(bundle):
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, "--top-p", 0.5)
    assert result.exit_code == 0, result.output
    assert "--top-p is not used: --temperature 0 decodes greedily" in result.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (("--seed", 5), "--seed is not used: --temperature 0 decodes greedily"),
    (("--clock-cap",), "--clock-cap is not used: it works with --watch-thermal or --simulate-thermal"),
    (("--no-guard",), "--no-guard is not used: it works with --watch-thermal or --simulate-thermal"),
    (("--thermal-target", "orin-nx"), "--thermal-target is not used"),
    (("--ambient", 30), "--ambient is not used: it works with --simulate-thermal"),
    (("--watch-thermal", "--sim-speed", 2), "--sim-speed is not used: it works with --simulate-thermal"),
], ids=["seed-greedy", "clock-cap", "no-guard", "thermal-target", "ambient", "sim-speed-on-a-board"])
def test_options_that_do_nothing_here_are_named_as_unused(bundle, args, fragment, tmp_path):
    env = {"EDGESDK_THERMAL_ROOT": str(tmp_path / "no-thermal"), "EDGESDK_CACHE": str(tmp_path / "cache")}
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, *args, env=env)
    assert result.exit_code == 0, result.output
    assert fragment in result.stderr
    assert result.stdout == invoke("run", bundle, "--prompt", "hello", "-n", 3).stdout


def test_no_gating_on_a_bundle_without_gates_is_what_it_does_anyway(bundle):
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, "--no-gating")
    assert result.exit_code == 0, result.output
    assert "power gates" not in result.stderr
    refused = invoke("run", bundle, "--prompt", "hello", "-n", 3, "--gating")
    assert refused.exit_code != 0
    assert "--gating: needs a bundle with power gates" in refused.stderr


@pytest.mark.parametrize("command", ["run", "eval"])
@pytest.mark.parametrize("threads", ["0", "-1", "-2"])
def test_threads_of_0_or_below_are_the_default_as_llama_cpp_reads_them(bundle, command, threads, tmp_path):
    """llama.cpp's -t takes 0 or below as "every hardware thread" (-1 is its default, which scripts pass); here
    the default, the profile's count at most the usable cores, as if -t were not given."""
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20)
    args = ("--prompt", "hi", "-n", 3) if command == "run" else ("--text", text, "--context", 16)
    result = invoke(command, bundle, *args, "--threads", threads)
    assert result.exit_code == 0, result.output
    assert "oversubscribes" not in result.stderr


def test_more_threads_than_cores_is_a_warning(bundle):
    import os

    result = invoke("run", bundle, "--prompt", "hi", "-n", 3, "--threads", len(os.sched_getaffinity(0)) + 1)
    assert result.exit_code == 0, result.output
    assert "oversubscribes them" in result.stderr


def test_a_prompt_that_is_not_utf8_is_refused_by_name(bundle):
    """Bytes that are not UTF-8 reach Python as lone surrogates; the tokenizer raised a TypeError."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "edgesdk", "run", str(bundle), "--raw", "-n", "3", "--prompt",
                           b"caf\xe9"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 1, proc.stderr
    assert "the prompt is not valid UTF-8 (byte 0xe9 at character 3)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_corrupt_bundle(bundle, text_file):
    flip_byte(bundle / "model.onnx.data")
    assert_error(invoke("eval", bundle, "--text", text_file, *EVAL_ARGS), "failed verification", "model.onnx.data")


# --- pack and unpack ------------------------------------------------------------------------------


def test_pack_unpack_round_trip(bundle, tmp_path):
    archive = tmp_path / "bundle.tar"
    packed = invoke("pack", bundle, archive)
    assert_ok(packed)
    assert packed.stdout.strip() == str(archive)
    assert archive.is_file()

    dest = tmp_path / "unpacked"
    unpacked = invoke("unpack", archive, dest)
    assert_ok(unpacked)
    path = Path(unpacked.stdout.strip())
    assert path == dest / bundle.name
    assert verify_bundle(path).bundle_id == read_manifest(bundle)["bundle_id"]
    assert_ok(invoke("verify", path))


def test_pack_refuses_corrupt_bundle(bundle, tmp_path):
    flip_byte(bundle / "tokenizer.json")
    archive = tmp_path / "bundle.tar"
    assert_error(invoke("pack", bundle, archive), "failed verification", "tokenizer.json")
    assert not archive.exists()


def test_unpack_refuses_non_archive(tmp_path):
    fake = tmp_path / "fake.tar"
    fake.write_bytes(b"not a tar archive at all")
    assert_error(invoke("unpack", fake, tmp_path / "dest"), "fake.tar", "not a readable tar archive")


def test_click_version_separates_stderr():
    """These tests read result.stderr apart from result.stdout, which needs click >= 8.2."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("click").split(".")[:2])
    assert (major, minor) >= (8, 2)


def test_clock_cap_beside_telemetry_alone_is_named_once(bundle, tmp_path):
    env = {"EDGESDK_THERMAL_ROOT": str(tmp_path / "no-thermal"), "EDGESDK_CACHE": str(tmp_path / "cache")}
    result = invoke("run", bundle, "--prompt", "hello", "-n", 3, "--telemetry", tmp_path / "t.jsonl", "--clock-cap",
                    env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("--clock-cap") == 1, result.stderr
