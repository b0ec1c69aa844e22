"""A model's own sampling settings (generation_config.json, a GGUF file's general.sampling keys), end to end: read at
build time into the manifest's ``generation`` section, shown by inspect and report.md, taken by run, serve and load()
for every option not given, listed by /props and Ollama's /api/show, and written back as general.sampling keys by
export, where llama.cpp reads them."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

from tests._utils.builds import build_tiny_bundle  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir  # noqa: E402
from tests.unit.test_cli import assert_ok, invoke  # noqa: E402

FUSED_FP32 = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
# Qwen3's published settings with Qwen2.5's repetition_penalty, and two transformers settings edgesdk does not have
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
                     "top_k": 20, "repetition_penalty": 1.05, "typical_p": 0.9, "no_repeat_ngram_size": 3,
                     "transformers_version": "4.51.0"}
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repeat_penalty": 1.05}


def _build(root: Path, generation_config: dict | None) -> tuple[object, str]:
    """A tiny model directory with ``generation_config`` (None: as transformers saved it) built into a bundle:
    (bundle, the build's log)."""
    model_dir = save_tiny_model_dir(root / "model", hidden=32, heads=2, kv_heads=1, layers=1)
    if generation_config is not None:
        (model_dir / "generation_config.json").write_text(json.dumps(generation_config))
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        bundle = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=model_dir, generated_sequences=0)
    return bundle, log.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("gendefaults"), GENERATION_CONFIG)


@pytest.fixture(scope="module")
def bundle(built):
    return built[0]


# ------------------------------------------------------------------------------------------------------ build


def test_the_build_records_the_models_sampling_settings_and_names_those_it_leaves_out(built):
    bundle, log = built
    assert bundle.manifest["generation"] == {"sampling": SAMPLING, "source": "generation_config.json"}
    assert "sampling defaults from the model's generation_config.json: temperature 0.6, top_p 0.95, top_k 20, " \
           "repeat_penalty 1.05" in log
    assert "not applied (edgesdk has no such sampler): typical_p 0.9, no_repeat_ngram_size 3" in log
    report = (bundle.path / "report.md").read_text()
    assert "- sampling defaults: temperature 0.6, top_p 0.95, top_k 20, repeat_penalty 1.05 (from the model's " \
           "generation_config.json" in report


def test_inspect_shows_the_sampling_defaults(bundle):
    result = invoke("inspect", bundle.path)
    assert_ok(result)
    assert "sampling   temperature 0.6, top_p 0.95, top_k 20, repeat_penalty 1.05 (from the model's " \
           "generation_config.json; used where a run or request sets none)" in result.stdout


def test_a_model_directory_without_sampling_settings_records_no_section(tiny_bundle):
    """transformers' save_pretrained writes a generation_config.json of token ids only: nothing to record, and
    GenerationConfig's class defaults (top_k 50) are not read."""
    assert "generation" not in tiny_bundle.manifest


def test_do_sample_false_keeps_the_bundle_greedy():
    from edgesdk.models.generation_defaults import from_generation_config

    read = from_generation_config({"do_sample": False, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                   "repetition_penalty": 1.1})
    assert read.values == {"repeat_penalty": 1.1}  # transformers applies the penalty in greedy search too
    assert any("do_sample false" in warning and "temperature 0.6" in warning for warning in read.warnings)
    # without do_sample, or with it true, the settings are taken, as llama.cpp's converter takes them
    assert from_generation_config({"temperature": 0.6}).values == {"temperature": 0.6}


def test_values_out_of_range_are_warnings_and_left_out():
    from edgesdk.models.generation_defaults import from_generation_config, from_gguf_fields

    read = from_generation_config({"temperature": -1, "top_p": 1.5, "top_k": 20.0, "min_p": 2, "sequence": "top_k;bogus",
                                   "penalty_repeat": 1.2, "repetition_penalty": 1.05})
    # penalty_repeat first, as gguf-py's Metadata.load; the unknown sampler name skipped, as llama.cpp skips it
    assert read.values == {"top_k": 20, "repeat_penalty": 1.2, "samplers": ["top_k"]}
    shown = "\n".join(read.warnings)
    for fragment in ("temperature -1 is not used: temperature must be a finite number >= 0",
                     "top_p 1.5 is not used: top_p must be in [0, 1]", "min_p 2 is not used",
                     "sequence 'top_k;bogus' names 'bogus', no sampler llama.cpp knows"):
        assert fragment in shown
    # a top_k below 0 is llama.cpp's top-k sampler off (src/llama-sampling.cpp: k <= 0), read as top_k 0
    read = from_gguf_fields({"top_k": -5, "temp": float("nan"), "sequence": "top_k;temperature", "mirostat": 2})
    assert read.values == {"top_k": 0, "samplers": ["top_k", "temperature"]}
    assert read.not_applied == {"general.sampling.mirostat": 2}
    assert "general.sampling.temp nan is not used" in "\n".join(read.warnings)
    assert "top_k" not in "\n".join(read.warnings)



def test_do_sample_true_without_a_temperature_samples_at_transformers_1():
    """Gemma 3's generation_config.json: do_sample true, top_k 64, top_p 0.95 and no temperature, which
    transformers' generate() samples at temperature 1; left at edgesdk's greedy 0, top_k and top_p would change
    nothing while the run said they applied."""
    from edgesdk.models.generation_defaults import from_generation_config

    read = from_generation_config({"do_sample": True, "top_k": 64, "top_p": 0.95, "cache_implementation": "hybrid"})
    assert read.values == {"temperature": 1.0, "top_p": 0.95, "top_k": 64}
    # without do_sample the file's own keys only, as llama.cpp's converter copies them
    assert from_generation_config({"top_k": 64, "top_p": 0.95}).values == {"top_p": 0.95, "top_k": 64}


def test_the_line_says_when_the_draws_settings_wait_for_a_temperature():
    from edgesdk.models.generation_defaults import applied_line

    assert applied_line({"top_k": 64}, "generation_config.json", 0.0) == (
        "sampling: top_k 64 from the model's generation_config.json; greedy at temperature 0, so top_k applies only "
        "with a temperature above 0")
    assert applied_line({"top_k": 64}, "generation_config.json", 0.7, "temperature=0").endswith(
        "; temperature=0 for greedy")
    assert applied_line({"repeat_penalty": 1.1}, "generation_config.json", 0.0) == (
        "sampling: repeat_penalty 1.1 from the model's generation_config.json")


def test_values_a_gguf_file_cannot_hold_are_left_out():
    """general.sampling.* are FLOAT32 and INT32 keys: a value past those bounds is a build warning, not an
    OverflowError when the bundle is exported."""
    from edgesdk.models.generation_defaults import from_generation_config, sampling_value_problem

    read = from_generation_config({"temperature": 1e39, "top_k": 3_000_000_000, "top_p": 0.9})
    assert read.values == {"top_p": 0.9}
    shown = "\n".join(read.warnings)
    assert "temperature must be at most 3.40282e+38 (a float32, as a GGUF file holds it), got 1e+39" in shown
    assert "top_k must be at most 2147483647 (an int32, as a GGUF file holds it), got 3000000000" in shown
    assert sampling_value_problem("mirostat", 2) == (
        "is not a sampling setting edgesdk carries (temperature, top_p, top_k, min_p, repeat_penalty, "
        "repeat_last_n, samplers), got 2")

def test_an_unreadable_generation_config_is_a_warning(tmp_path):
    from edgesdk.models.generation_defaults import read_model_sampling

    (tmp_path / "generation_config.json").write_text("{not json")
    read = read_model_sampling("hf-dir", tmp_path)
    assert read.record() is None
    assert "cannot be read as JSON" in read.warnings[0]


# ------------------------------------------------------------------------------------------------ verification


def _edited_copy(bundle, root: Path, generation) -> Path:
    """The bundle copied with its manifest's ``generation`` section replaced (and the digest written to match), as a
    hand edit would leave it."""
    copy = root / "edited"
    shutil.copytree(bundle.path, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["generation"] = generation
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (copy / "manifest.json").write_text(text)
    (copy / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    return copy


@pytest.mark.parametrize(("generation", "named"), [
    ({"sampling": {"top_p": 1.5}, "source": "generation_config.json"}, "'generation.sampling.top_p': top_p must be in"),
    ({"sampling": {"temperature": "hot"}, "source": "x"}, "'generation.sampling.temperature': temperature must be a"),
    ({"sampling": {"top_k": 2.5}, "source": "x"}, "'generation.sampling.top_k': top_k must be a whole number"),
    ({"sampling": {"mirostat": 2}, "source": "x"}, "'generation.sampling.mirostat' is not a sampling setting"),
    ({"sampling": {"samplers": "kt"}, "source": "x"}, "'generation.sampling.samplers' must be a list of sampler"),
    ({"sampling": {"samplers": ["top_k", "nope"]}, "source": "x"}, "holds 'nope', which is no sampler"),
    (["temperature", 0.6], "'generation' must be a mapping with a 'sampling' mapping"),
    ({"sampling": {"temperature": 0.6}}, "'generation' must be a mapping with a 'sampling' mapping"),
])
def test_a_hand_edited_generation_section_is_refused_by_verify(bundle, tmp_path, generation, named):
    from edgesdk.bundle import verify_bundle
    from edgesdk.errors import BundleError

    with pytest.raises(BundleError) as refused:
        verify_bundle(_edited_copy(bundle, tmp_path, generation))
    assert named in refused.value.problem
    result = invoke("verify", tmp_path / "edited")
    assert result.exit_code != 0
    assert named in result.stderr


def test_a_bundle_without_the_section_still_verifies(tiny_bundle):
    from edgesdk.bundle import verify_bundle

    verify_bundle(tiny_bundle.path)


# ------------------------------------------------------------------------------------------------------ run


def _stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("edgesdk: ")]


def test_run_takes_the_models_settings_for_the_options_not_given(bundle):
    result = invoke("run", bundle.path, "-p", "hello", "-n", "3", "--seed", "3", "--threads", "1")
    assert_ok(result)
    assert "edgesdk: sampling: temperature 0.6, top_p 0.95, top_k 20, repeat_penalty 1.05 from the model's " \
           "generation_config.json; --temperature 0 for greedy" in _stderr_lines(result)
    assert "--seed is not used" not in result.stderr  # the model's temperature samples
    # a --top-p given is used: the model's temperature is above 0
    result = invoke("run", bundle.path, "-p", "hello", "-n", "2", "--top-p", "0.5", "--threads", "1")
    assert_ok(result)
    assert "--top-p is not used" not in result.stderr
    assert "edgesdk: sampling: temperature 0.6, top_k 20, repeat_penalty 1.05 from the model's " \
           "generation_config.json; --temperature 0 for greedy" in _stderr_lines(result)


def test_run_with_temperature_0_decodes_greedily(bundle):
    result = invoke("run", bundle.path, "-p", "hello", "-n", "3", "--temperature", "0", "--seed", "3",
                    "--threads", "1")
    assert_ok(result)
    assert "edgesdk: sampling: top_p 0.95, top_k 20, repeat_penalty 1.05 from the model's generation_config.json; " \
        "greedy at temperature 0, so top_p, top_k apply only with a temperature above 0" in _stderr_lines(result)
    assert "--seed is not used: --temperature 0 decodes greedily" in result.stderr
    given = invoke("run", bundle.path, "-p", "hello", "-n", "3", "--temperature", "0", "--top-p", "1",
                   "--top-k", "0", "--repeat-penalty", "1", "--threads", "1")
    assert_ok(given)
    assert not any(line.startswith("edgesdk: sampling:") for line in _stderr_lines(given))


def test_run_sampling_is_the_models_settings(bundle):
    """The text ``run`` prints with the model's settings and a seed is generate()'s with those settings."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    result = invoke("run", bundle.path, "-p", "hello", "-n", "6", "--seed", "7", "--raw", "--threads", "1")
    assert_ok(result)
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.prompt_ids("hello", raw=True, system=None)
    expected = {}
    for name, sampling in (("model", SamplingConfig(max_new_tokens=6, seed=7, **SAMPLING)),
                           ("greedy", SamplingConfig(max_new_tokens=6, seed=7))):
        tokens, _ = generate(runtime.backend, ids, sampling, runtime.tokenizer.eos_token_ids)
        runtime.backend.reset()
        expected[name] = runtime.tokenizer.decode(tokens)
    assert result.stdout == expected["model"] + "\n"
    assert expected["model"] != expected["greedy"]  # the settings change this answer: the comparison says something


# ------------------------------------------------------------------------------------------------------ serve


@contextlib.contextmanager
def _serving(bundle: Path, cwd: Path, *options: str):
    """``edgesdk serve`` in a child process: (base URL, the stderr lines before it listened)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", str(bundle), "--port", "0", "--threads", "1", "--quiet",
         *options], stderr=subprocess.PIPE, text=True, cwd=cwd, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    try:
        lines, url = [], None
        for line in process.stderr:
            lines.append(line.rstrip("\n"))
            if " on http://" in line:
                url = line.split(" on ", 1)[1].split()[0].rstrip("/").removesuffix("/v1")
                break
        assert url, "\n".join(lines)
        yield url, lines
    finally:
        process.terminate()
        process.communicate(timeout=60)


def _call(url: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def test_serve_makes_them_the_defaults_a_request_goes_over(bundle, tmp_path):
    with _serving(bundle.path, tmp_path) as (url, lines):
        assert "edgesdk serve: sampling: temperature 0.6, top_p 0.95, top_k 20, repeat_penalty 1.05 from the " \
               "model's generation_config.json; --temperature 0 for greedy" in lines
        params = _call(url, "/props")["default_generation_settings"]["params"]
        assert (params["temperature"], params["top_p"], params["top_k"], params["min_p"]) == (0.6, 0.95, 20, 0.0)
        assert (params["repeat_penalty"], params["repeat_last_n"]) == (1.05, 64)
        settings = _call(url, "/completion", {"prompt": "hello", "n_predict": 2})["generation_settings"]
        assert (settings["temperature"], settings["top_p"], settings["top_k"]) == (0.6, 0.95, 20)
        assert (settings["repeat_penalty"], settings["repeat_last_n"]) == (1.05, 64)
        settings = _call(url, "/completion", {"prompt": "hello", "n_predict": 2, "temperature": 0, "top_k": 5,
                                              "repeat_penalty": 1.0, "repeat_last_n": 8})["generation_settings"]
        assert (settings["temperature"], settings["top_p"], settings["top_k"]) == (0.0, 0.95, 5)
        assert (settings["repeat_penalty"], settings["repeat_last_n"]) == (1.0, 8)
        shown = _call(url, "/api/show", {"model": _call(url, "/api/tags")["models"][0]["name"]})
        parameters = dict(line.split(None, 1) for line in shown["parameters"].splitlines())
        assert (parameters["temperature"], parameters["top_p"], parameters["top_k"]) == ("0.6", "0.95", "20")
        assert (parameters["repeat_penalty"], parameters["repeat_last_n"]) == ("1.05", "64")
        assert "PARAMETER temperature 0.6\n" in shown["modelfile"]


def test_serve_options_go_over_the_models_settings(bundle, tmp_path):
    with _serving(bundle.path, tmp_path, "--temperature", "0.2", "--samplers", "top_k;temperature",
                  "--repeat-penalty", "1.3") as (url, lines):
        assert "edgesdk serve: sampling: top_p 0.95, top_k 20 from the model's generation_config.json; " \
               "--temperature 0 for greedy" in lines
        params = _call(url, "/props")["default_generation_settings"]["params"]
        assert (params["temperature"], params["top_p"], params["top_k"]) == (0.2, 0.95, 20)
        assert params["repeat_penalty"] == 1.3
        assert params["samplers"] == ["top_k", "temperature"]


def test_load_takes_them_unless_a_setting_is_given(bundle):
    import edgesdk

    with edgesdk.load(bundle.path, threads=1) as model:
        assert (model._completer.defaults.temperature, model._completer.defaults.top_k) == (0.6, 20)
        assert "sampling: temperature 0.6, top_p 0.95, top_k 20, repeat_penalty 1.05 from the model's " \
               "generation_config.json; temperature=0 for greedy" in model.notes
        assert model._completer.defaults.repeat_penalty == 1.05
    with edgesdk.load(bundle.path, threads=1, temperature=0.0, repeat_penalty=1.0) as model:
        defaults = model._completer.defaults
        assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.repeat_penalty) == (0.0, 0.95, 20, 1.0)


# ------------------------------------------------------------------------------------------------------ export


def test_export_writes_general_sampling_keys_a_gguf_build_reads_back(bundle, tmp_path):
    """export -> general.sampling.* of gguf-py's types; that file, its keys rewritten, built again: the bundle records
    the GGUF's settings, names the one edgesdk lacks and leaves out the one out of range."""
    from gguf import GGUFReader, GGUFValueType

    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.generation_defaults import read_gguf_sampling
    from tests._utils.gguf_files import rewrite_gguf

    exported = export_gguf(bundle.path, tmp_path / "model.gguf").path
    fields = GGUFReader(str(exported)).fields
    types = {key.removeprefix("general.sampling."): field.types[0] for key, field in fields.items()
             if key.startswith("general.sampling.")}
    assert types == {"temp": GGUFValueType.FLOAT32, "top_p": GGUFValueType.FLOAT32, "top_k": GGUFValueType.INT32,
                     "penalty_repeat": GGUFValueType.FLOAT32}
    assert read_gguf_sampling(exported) == {"temp": 0.6, "top_p": 0.95, "top_k": 20, "penalty_repeat": 1.05}

    source = rewrite_gguf(exported, tmp_path / "source.gguf", fields={
        "general.sampling.temp": (0.7, GGUFValueType.FLOAT32), "general.sampling.top_p": (1.5, GGUFValueType.FLOAT32),
        "general.sampling.sequence": ("top_k;temperature", GGUFValueType.STRING),
        "general.sampling.mirostat": (2, GGUFValueType.INT32)})
    root = tmp_path / "from-gguf"
    root.mkdir()
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        rebuilt = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=source, generated_sequences=0)
    assert rebuilt.manifest["generation"] == {
        "sampling": {"temperature": 0.7, "top_k": 20, "repeat_penalty": 1.05, "samplers": ["top_k", "temperature"]},
        "source": "GGUF general.sampling"}
    text = log.getvalue()
    assert "warning: GGUF key general.sampling.top_p 1.5 is not used: top_p must be in [0, 1]" in text
    assert "not applied (edgesdk has no such sampler): general.sampling.mirostat 2" in text
    again = export_gguf(rebuilt.path, tmp_path / "again.gguf").path
    assert read_gguf_sampling(again)["sequence"] == "top_k;temperature"


_LLAMA_META = """
import json, sys
import llama_cpp
from llama_cpp import llama_cpp as api

model = llama_cpp.Llama(sys.argv[1], n_ctx=32, n_threads=1, verbose=False, vocab_only=True)
out = {}
for key in ("general.sampling.temp", "general.sampling.top_p", "general.sampling.top_k",
            "general.sampling.penalty_repeat"):
    buffer = api.ctypes.create_string_buffer(128)
    size = api.llama_model_meta_val_str(model._model.model, key.encode(), buffer, 128)
    out[key] = buffer.value.decode() if size > 0 else None
json.dump(out, sys.stdout)
"""


def test_llama_cpp_reads_the_exported_keys(bundle, tmp_path):
    pytest.importorskip("llama_cpp")
    from edgesdk.export.gguf_export import export_gguf

    exported = export_gguf(bundle.path, tmp_path / "model.gguf").path
    child = subprocess.run([sys.executable, "-c", _LLAMA_META, str(exported)], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout)
    # llama_model_meta_val_str prints a FLOAT32 with %f, as common_init_sampler_from_model then reads it with strtof
    assert {key: float(value) for key, value in seen.items()} == pytest.approx(
        {"general.sampling.temp": 0.6, "general.sampling.top_p": 0.95, "general.sampling.top_k": 20,
         "general.sampling.penalty_repeat": 1.05}, rel=1e-6)
