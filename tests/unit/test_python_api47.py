"""edgesdk's Python API (edgesdk/api.py, edgesdk/api_checks.py): what a load() that fails halfway gives back, and
build_bundle's arguments as a Python user passes them (pathlib.Path for the model, target and recipe; bytes, bools
and numbers of the wrong kind refused by name before any work starts). Real tiny bundles and real builds."""

from __future__ import annotations

import shutil

import pytest

import edgesdk
from edgesdk.errors import EdgeSDKError


@pytest.fixture
def simulated_sessions(monkeypatch, tmp_path):
    """load(watch_thermal=True) gets the guard of a simulated board writing telemetry (edgesdk.thermal.simulator):
    the sessions opened are returned, to see whether each was closed (its telemetry file)."""
    from edgesdk.thermal import watch

    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    real, sessions = watch.open_session, []

    def open_simulated(profile, **options):
        session = real(profile, **options, simulate=True, ambient_c=25.0,
                       telemetry_path=str(tmp_path / f"thermal{len(sessions)}.jsonl"))
        sessions.append(session)
        return session

    monkeypatch.setattr(watch, "open_session", open_simulated)
    return sessions


def given_back(telemetry) -> bool:
    """Whether a thermal session's telemetry file was closed (ThermalSession.close closes it with the rest)."""
    return telemetry._file is None or telemetry._file.closed


def test_a_load_that_fails_after_the_guard_opened_gives_the_guard_back(tiny_bundle, tmp_path, simulated_sessions):
    """A draft bundle that cannot serve is found after the bundle and its thermal guard opened: the guard (its
    telemetry file, on a board its poller and clock cap) goes back at once, not when the traceback (which a REPL
    keeps in sys.last_traceback) lets the half-made model go."""
    missing = tmp_path / "no-such-draft"
    with pytest.raises(EdgeSDKError) as failed:
        edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True, draft=missing)
    assert str(missing) in str(failed.value)
    assert len(simulated_sessions) == 1
    assert given_back(simulated_sessions[0].hook.telemetry)  # while the traceback is still held
    del failed


def test_draft_arguments_are_refused_before_the_bundle_opens(tiny_bundle, simulated_sessions):
    """A draft_max out of range, or draft with lookup, is refused as load()'s other arguments are: before the bundle
    (and the thermal guard) open."""
    with pytest.raises(EdgeSDKError, match=r"load\(\): draft_max must be a whole number from 1 to 64, got 0"):
        edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True, draft=tiny_bundle.path, draft_max=0)
    with pytest.raises(EdgeSDKError, match="draft and lookup both draft tokens"):
        edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True, draft=tiny_bundle.path, lookup=2)
    assert simulated_sessions == []


def test_a_load_with_a_draft_still_works(tiny_bundle, simulated_sessions):
    with edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True, draft=tiny_bundle.path, draft_max=3,
                      max_tokens=4) as model:
        assert model.create_completion("Once upon")["usage"]["completion_tokens"] <= 4
    assert given_back(simulated_sessions[0].hook.telemetry)


def test_build_bundle_takes_paths_for_the_target_model_and_recipe(tiny_model_dir, tmp_path, monkeypatch):
    """A Python user passes pathlib.Path where a path is asked for, as transformers' from_pretrained takes it: the
    model's directory, a profile's YAML file as the target and a recipe's YAML file (AttributeError: 'PosixPath'
    object has no attribute 'lower' / 'endswith' before). Without out the bundle goes to bundles/<model>-<target>."""
    from importlib import resources

    import edgesdk.recipes

    profile = tmp_path / "my-host.yaml"
    profile.write_text((resources.files("edgesdk.targets") / "host.yaml").read_text(encoding="utf-8"),
                       encoding="utf-8")
    recipe = tmp_path / "my-recipe.yaml"
    shutil.copyfile(resources.files(edgesdk.recipes) / "fp32-fused.yaml", recipe)
    monkeypatch.chdir(tmp_path)
    path = edgesdk.build_bundle(profile, tiny_model_dir, recipe=recipe, max_context=32, progress=False)
    assert path.resolve() == (tmp_path / "bundles" / f"{tiny_model_dir.name}-host").resolve()
    with edgesdk.load(path, threads=1, max_tokens=2) as model:
        assert model.manifest["target"]["name"] == "host"
        assert model.create_completion("Once")["usage"]["completion_tokens"] <= 2


@pytest.mark.parametrize(("arguments", "refused"), [
    ({"data": b"train.txt"}, r"data=b'train.txt': expected a text file's path, or a list of them"),
    ({"data": ["train.txt", 5]}, r"data\[1\]=5: expected a text file's path"),
    ({"overrides": 42}, r"overrides is 42; expected a mapping"),
    ({"overrides": [("prune.ffn_ratio", 0.5)]}, r"overrides holds \('prune.ffn_ratio', 0.5\); expected a mapping"),
    ({"max_context": 64.0}, r"max_context=64.0: expected a whole number"),
    ({"data_skip_chars": True}, r"data_skip_chars=True: expected a whole number"),
    ({"generated_sequences": 1.5}, r"generated_sequences=1.5: expected a whole number"),
    ({"weight_bits": "4"}, r"weight_bits='4': expected a whole number or None"),
    ({"resume": "no"}, r"resume='no': expected True or False"),
    ({"keep_work": 1}, r"keep_work=1: expected True or False"),
    ({"progress": None}, r"progress=None: expected True or False"),
    ({"target": 5}, r"target=5: expected a board's name or a profile's YAML file"),
    ({"recipe": 3}, r"recipe=3: expected a shipped recipe's name or a recipe's YAML file"),
    ({"out": 7}, r"out=7: expected the bundle's directory"),
    ({"model": ""}, r"model='': expected an alias, a Hugging Face directory or a GGUF file"),
    ({"recipe": ""}, r"recipe='': expected a shipped recipe's name"),
    ({"data": ""}, r"data='': expected a text file's path"),
    ({"data": ("a.txt", "")}, r"data\[1\]='': expected a text file's path"),
])
def test_build_bundle_refuses_arguments_of_the_wrong_kind_by_name(tiny_model_dir, tmp_path, monkeypatch, arguments,
                                                                   refused):
    """Each is refused before any work, naming the argument and the value: before, resume='no' resumed, progress
    None hid the bars, a bool counted as a number, bytes were read as a list of ints, and the others failed deep in
    the build with a TypeError or AttributeError naming no argument."""
    monkeypatch.chdir(tmp_path)
    call = {"target": "host", "model": str(tiny_model_dir), "out": tmp_path / "bundle", "max_context": 32,
            "progress": False, **arguments}
    with pytest.raises(EdgeSDKError, match=r"build_bundle\(\): " + refused) as refusal:
        edgesdk.build_bundle(**call)
    assert refusal.value.fix
    assert not (tmp_path / "bundle").exists()
    assert not (tmp_path / "bundles").exists()


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=6, prompt_cache=False) as loaded:  # cached_tokens 0
        yield loaded


def answered(body: dict) -> dict:
    """An answer without its id and creation time."""
    return {key: value for key, value in body.items() if key not in ("id", "created", "timings")}


def test_tuples_in_a_request_are_the_arrays_json_carries(model):
    """A tuple anywhere in a request is read as the array the HTTP body's JSON carries for it (json.dumps writes a
    tuple as an array), as messages and token ids already were: before, stop=("e",) was refused ("'stop' must be a
    string or an array ..."), tools, content parts too, and a schema's enum ("must be a non-empty array, got
    ["x", "y"]")."""
    assert answered(model("Once upon", stop=("e", "a"))) == answered(model("Once upon", stop=["e", "a"]))
    parts = ({"type": "text", "text": "Say something."},)
    assert answered(model.create_chat_completion([{"role": "user", "content": parts}])) == \
        answered(model.create_chat_completion([{"role": "user", "content": list(parts)}]))
    schema = {"type": "object", "properties": {"c": {"enum": ("x", "y")}}, "required": ("c",)}
    listed = {"type": "object", "properties": {"c": {"enum": ["x", "y"]}}, "required": ["c"]}
    assert answered(model("Once", max_tokens=12, response_format={"type": "json_object", "schema": schema})) == \
        answered(model("Once", max_tokens=12, response_format={"type": "json_object", "schema": listed}))
    streamed = list(model("Once upon", stop=("e",), stream=True))
    assert "".join(chunk["choices"][0]["text"] for chunk in streamed) == model("Once upon", stop=["e"])[
        "choices"][0]["text"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    assert answered(model.create_chat_completion([{"role": "user", "content": "a"}], tools=(tool,),
                                                 tool_choice="none", max_tokens=2)) == \
        answered(model.create_chat_completion([{"role": "user", "content": "a"}], tools=[tool], tool_choice="none",
                                              max_tokens=2))


def test_a_tuple_of_prompts_is_still_refused_as_several_prompts(model):
    from edgesdk.api import RequestError

    with pytest.raises(RequestError, match="holds 2 prompts"):
        model(("a", "b"))
    assert answered(model(("Once",))) == answered(model("Once"))


def test_dir_of_the_package_names_its_lazy_api_without_importing_it():
    """dir(edgesdk), which a REPL's tab completion reads, offers load, Model ... before they are first used (they
    were missing: edgesdk.lo<Tab> offered nothing), and listing them imports nothing."""
    import subprocess
    import sys

    code = ("import sys, edgesdk; names = dir(edgesdk); "
            "print(all(name in names for name in edgesdk.__all__), 'edgesdk.api' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert shown == ["True", "False"]


def test_a_close_interrupted_while_it_waits_can_be_called_again(tiny_bundle, simulated_sessions):
    """close() waits for the work holding the model's turn (a perplexity measured to its end, an answer): a Ctrl-C
    there left the model marked closed with its thermal guard still held, and a second close() did nothing, so the
    guard (on a board its clock cap and poller) stayed until the model was collected."""
    import os
    import signal
    import threading

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        raise Interrupted

    model = edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True)
    completer = model._completer
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # work holding the model's turn, as a perplexity in another thread does
        with completer.exclusive(keep_cache=True):
            holding.set()
            release.wait()

    def ctrl_c_once_close_waits() -> None:
        while completer._turn.queued < 2:  # the holder, and close() waiting behind it
            release.wait(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        threading.Thread(target=ctrl_c_once_close_waits, daemon=True).start()
        with pytest.raises(Interrupted):
            model.close()
    finally:
        signal.signal(signal.SIGINT, previous)
        release.set()
        holder.join()
    telemetry = simulated_sessions[0].hook.telemetry
    assert not given_back(telemetry)  # the interrupted close gave nothing back while the work ran
    model.close()
    assert given_back(telemetry)
    with pytest.raises(edgesdk.RequestError, match="the model is closed"):
        model.tokenize("a")


@pytest.mark.parametrize(("setting", "named"), [
    ("thread", "thread: did you mean threads?"),
    ("n_threads", "n_threads: pass threads=N"),
    ("pooling_type", "pooling_type: pass pooling="),
    ("max_token", "max_token: did you mean max_tokens?"),
])
def test_a_keyword_load_does_not_take_is_named_with_what_to_pass(tmp_path, setting, named):
    """A misspelt argument of load()'s own (threads=) or llama-cpp-python's Llama(n_threads=, n_ctx= ...) was told
    to pass one of the settings, which leave out threads and the other arguments: it is named with what to pass,
    before any bundle is opened."""
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tmp_path / "no-bundle-needed", **{setting: 2})
    assert str(refused.value).startswith(f"load() got the setting(s) {setting!r}, which it does not take")
    assert named in refused.value.problem
    assert "threads" in refused.value.fix
