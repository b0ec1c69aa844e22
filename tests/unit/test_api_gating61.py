"""``edgesdk.load()``'s ``gating``, ``entropy_target`` and ``compute_budget``: a power-gated bundle's gates set as
``edgesdk run``'s ``--gating/--no-gating``, ``--entropy-target`` and ``--compute-budget`` set them (one shared rule,
:func:`edgesdk.api_checks.configure_gates`), before ``watch_thermal``'s guard opens, so the guard lowers the gate's
budget instead of pacing; the arguments that cannot apply refused naming them; the prompt cache of a model whose gates
are steered reuses nothing, in memory or in a file. load() had none of them: a gated bundle always ran its gates off.
Real tiny bundles (one power-gated), read through a temporary sysfs thermal zone."""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.guard import Level
from edgesdk.thermal.watch import GATES_OFF
from tests.unit.test_api_guard61 import board  # noqa: F401  (the fixture: a board with one thermal zone)
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)

PROMPT = "Once upon a time there was a little"


def _run_s_gates(bundle_path, entropy_target, compute_budget, gating):
    """The gating flag and controller settings ``edgesdk run`` gives the bundle's backend for these options."""
    from edgesdk.cli_options import configure_gates
    from edgesdk.runtime.backend import close_backend
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle_path, threads=1)
    try:
        configure_gates(runtime.backend, entropy_target, compute_budget, gating)
        return runtime.backend.gating, runtime.backend.controller.config
    finally:
        close_backend(runtime.backend)


@pytest.mark.parametrize(("arguments", "gating"), [
    ({}, False), ({"gating": True}, True), ({"gating": False}, False), ({"entropy_target": 1.2}, True),
    ({"compute_budget": 0.6}, True), ({"gating": True, "entropy_target": 1.8, "compute_budget": 0.5}, True),
], ids=["left-out", "gating", "no-gating", "entropy-target", "compute-budget", "all"])
def test_load_sets_the_gates_as_run_s_options_do(power_bundle, arguments, gating):  # noqa: F811
    """load() took none of them (refused as settings it does not take), so a gated bundle always ran its gates off.
    Each now sets the gates and the controller as run's option of that name does."""
    with edgesdk.load(power_bundle.path, threads=1, **arguments) as model:
        backend = model.runtime.backend
        expected = _run_s_gates(power_bundle.path, arguments.get("entropy_target"), arguments.get("compute_budget"),
                                arguments.get("gating"))
        assert (backend.gating, backend.controller.config) == expected
        assert backend.gating is gating
        if "entropy_target" in arguments:
            assert backend.controller.config.entropy_target == arguments["entropy_target"]
        if "compute_budget" in arguments:
            assert backend.controller.budget == arguments["compute_budget"]
        assert model.create_completion(PROMPT, max_tokens=12)["choices"][0]["text"]
        assert backend.stats()["gating"] is gating


def test_a_gate_of_numpy_s_kind_is_taken(power_bundle):  # noqa: F811
    """np.float64 and np.True_, as NumPy code passes them, are read as the Python numbers they hold."""
    np = pytest.importorskip("numpy")
    with edgesdk.load(power_bundle.path, threads=1, gating=np.True_, compute_budget=np.float64(0.5)) as model:
        assert model.runtime.backend.gating is True
        assert model.runtime.backend.controller.budget == 0.5


@pytest.mark.parametrize(("arguments", "problem", "fix"), [
    ({"gating": False, "compute_budget": 0.5},
     "load(): gating=False: entropy_target and compute_budget steer the gates, which gating=False turns off",
     "leave gating out"),
    ({"compute_budget": 2}, "load(): compute_budget=2: compute_budget must be in (0, 1], got 2.0", "0 < B <= 1"),
    ({"compute_budget": 0.0}, "load(): compute_budget=0.0: compute_budget must be in (0, 1]", "0 < B <= 1"),
    ({"entropy_target": 5}, "load(): entropy_target=5: entropy_target must lie in (0.366, 2.079) nats",
     "leave it out for the bundle's own target"),
    ({"entropy_target": float("nan")}, "load(): entropy_target=nan: entropy_target must lie in", "entropy_target=X"),
], ids=["budget-beside-no-gating", "budget-above-1", "budget-0", "target-above-ln-window", "target-nan"])
def test_a_gate_argument_that_cannot_apply_is_refused_naming_it(power_bundle, arguments, problem, fix):  # noqa: F811
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(power_bundle.path, threads=1, **arguments)
    assert refused.value.problem.startswith(problem)
    assert fix in refused.value.fix


@pytest.mark.parametrize(("arguments", "problem"), [
    ({"gating": "yes"}, "load(): gating='yes': expected True, False or None"),
    ({"gating": 1}, "load(): gating=1: expected True, False or None"),
    ({"entropy_target": "1.2"}, "load(): entropy_target='1.2': expected a number or None"),
    ({"compute_budget": True}, "load(): compute_budget=True: expected a number or None"),
], ids=["gating-str", "gating-int", "target-str", "budget-bool"])
def test_a_gate_argument_of_the_wrong_kind_is_refused_before_the_bundle_opens(tmp_path, arguments, problem):
    """Checked before anything opens, as load()'s other arguments are: a path with no bundle is not reached."""
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tmp_path / "no-bundle", **arguments)
    assert refused.value.problem == problem


@pytest.mark.parametrize(("arguments", "named"), [
    ({"entropy_target": 1.2}, "load(): entropy_target=1.2: needs a bundle with power gates"),
    ({"compute_budget": 0.5}, "load(): compute_budget=0.5: needs a bundle with power gates"),
    ({"gating": True}, "load(): gating=True: needs a bundle with power gates"),
    ({"gating": True, "compute_budget": 0.5}, "load(): compute_budget=0.5, gating=True: need a bundle with power gates"),
], ids=["target", "budget", "gating", "two"])
def test_a_gate_argument_on_a_bundle_without_gates_is_refused_naming_it(tiny_bundle, arguments, named):
    with pytest.raises(EdgeSDKError) as refused:
        edgesdk.load(tiny_bundle.path, threads=1, **arguments)
    assert refused.value.problem.startswith(named)
    assert "--recipe power" in refused.value.fix
    assert "recipe='power'" in refused.value.fix


def test_gating_off_on_a_bundle_without_gates_is_what_it_does_anyway(tiny_bundle):
    """As ``edgesdk run --no-gating`` on such a bundle."""
    with edgesdk.load(tiny_bundle.path, threads=1, gating=False) as model:
        assert model.create_completion(PROMPT, max_tokens=4)["choices"][0]["text"]


def test_load_s_guard_lowers_the_budget_of_gates_turned_on(power_bundle, board):  # noqa: F811
    """The gates are set before the guard opens, so the guard takes the gate, as ``run --gating --watch-thermal``'s
    does: hot, it lowers the gate's compute budget where it paced the board with every FFN block running."""
    board(75.0)  # hot on the rpi5 profile (71.5 °C), below critical (78 °C)
    with edgesdk.load(power_bundle.path, threads=1, watch_thermal=True, gating=True) as model:
        backend = model.runtime.backend
        guard = model._thermal.hook.guard
        assert guard.budget_target is backend
        assert not [note for note in model.notes if GATES_OFF in note]
        assert backend.controller.limit == 1.0
        model.create_completion(PROMPT, max_tokens=4)
        assert guard.level is Level.HOT
        assert backend.controller.limit == guard.config.hot_budget < 1.0
    with edgesdk.load(power_bundle.path, threads=1, watch_thermal=True, compute_budget=0.4) as model:
        guard = model._thermal.hook.guard
        assert guard.budget_target is model.runtime.backend
        model.create_completion(PROMPT, max_tokens=4)
        assert model.runtime.backend.controller.budget == 0.4  # the user's budget is lower than the guard's 0.5


def _answers(model, turns: int = 2) -> list[tuple[str, int]]:
    """A chat's answers, each turn going on the conversation before it, with the prompt tokens each reused."""
    chat, answers = [], []
    for turn in range(turns):
        chat.append({"role": "user", "content": f"Tell me a story, part {turn + 1}."})
        answer = model.create_chat_completion(chat, max_tokens=10)
        chat.append(answer["choices"][0]["message"])
        answers.append((answer["choices"][0]["message"]["content"],
                        answer["usage"]["prompt_tokens_details"]["cached_tokens"]))
    return answers


def test_a_steered_model_s_prompt_cache_answers_as_a_fresh_model(power_bundle):  # noqa: F811
    """The in-memory prompt cache of a model whose gates are steered reuses nothing (its controller would start
    over on the kept prefix and see only the rest), so each answer is the one a fresh model gives; with the gates
    off the conversation's prefix is reused."""
    with edgesdk.load(power_bundle.path, threads=1, gating=True) as model:
        answers = _answers(model)
        again = model.create_completion(PROMPT, max_tokens=12)["choices"][0]["text"]
        repeated = model.create_completion(PROMPT, max_tokens=12)
    assert [cached for _, cached in answers] == [0, 0]
    assert repeated["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert repeated["choices"][0]["text"] == again
    with edgesdk.load(power_bundle.path, threads=1, gating=True, prompt_cache=False) as fresh:
        assert _answers(fresh) == answers
        assert fresh.create_completion(PROMPT, max_tokens=12)["choices"][0]["text"] == again
    with edgesdk.load(power_bundle.path, threads=1) as off:
        assert _answers(off)[1][1] > 0


def test_a_steered_model_neither_reads_nor_writes_a_prompt_cache_file(power_bundle, tmp_path):  # noqa: F811
    """As ``edgesdk run --gating --prompt-cache FILE`` leaves FILE as it is: save_prompt_cache wrote a cache that no
    later process loads over the one a model with its gates off had left, and load_prompt_cache read one."""
    path = tmp_path / "prompt.cache"
    with edgesdk.load(power_bundle.path, threads=1) as off:
        off.create_completion(PROMPT, max_tokens=4)
        assert off.save_prompt_cache(path) > 0
    written = path.read_bytes()
    with edgesdk.load(power_bundle.path, threads=1, compute_budget=0.6) as steered:
        steered.create_completion(PROMPT, max_tokens=4)
        for method in (steered.save_prompt_cache, steered.load_prompt_cache):
            with pytest.raises(EdgeSDKError) as refused:
                method(path)
            assert refused.value.problem.startswith(f"{method.__name__}: this model steers its power gates")
            assert "without gating, entropy_target and compute_budget" in refused.value.fix
    assert path.read_bytes() == written
    with edgesdk.load(power_bundle.path, threads=1) as off_again:
        assert off_again.load_prompt_cache(path).tokens > 0
