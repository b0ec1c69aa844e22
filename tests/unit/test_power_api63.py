"""A power-gated model's compute budget from Python (``Model.set_compute_budget``) and its gate figures
(``Model.power_stats``, run's ``[power]`` line); ``serve``'s ``/health`` with the budget in force, which a request's
fields cannot change; and the refusal of gate options on a bundle without gates naming only the options given, the
bundle and both fixes. Real tiny bundles (one built with the power stage), a real server on a free port."""

from __future__ import annotations

import socket

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import EdgeSDKError
from tests.unit.test_cli import invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)

PROMPT = "Once upon a time there was a little"


def test_set_compute_budget_sets_the_users_budget_under_the_guards(power_bundle):  # noqa: F811
    """After load(compute_budget=0.5) the only route was the backend's thermal lever, a ceiling: 0.9 there left 0.5 in
    force. The model's own method sets the budget load() set; the guard's lower budget still holds."""
    with edgesdk.load(power_bundle.path, threads=1, compute_budget=0.5) as model:
        controller = model.runtime.backend.controller
        model.set_compute_budget(0.9)
        assert controller.budget == 0.9
        stats = model.power_stats()
        assert (stats["compute_budget"], stats["budget_set"], stats["thermal_limit"]) == (0.9, 0.9, 1.0)
        model.runtime.backend.set_compute_budget(0.3)  # what the thermal guard calls when the board warms
        assert model.power_stats()["compute_budget"] == 0.3
        assert model.power_stats()["budget_set"] == 0.9
        model.runtime.backend.set_compute_budget(1.0)  # cooled down: the user's budget again
        assert model.power_stats()["compute_budget"] == 0.9


def test_power_stats_are_the_last_answer_s_figures_of_run_s_power_line(power_bundle):  # noqa: F811
    with edgesdk.load(power_bundle.path, threads=1, gating=True) as model:
        answer = model.create_completion(PROMPT, max_tokens=24)
        stats = model.power_stats()
        layers = model.manifest["graph"]["num_layers"]
        assert stats == {**stats, **{key: value for key, value in model.runtime.backend.stats().items()
                                     if key in ("mean_entropy", "blocks_skipped", "blocks_total", "executed_fraction",
                                                "tau")}}
        # decode steps only, as run's [power] line counts them
        assert stats["blocks_total"] == (answer["usage"]["completion_tokens"] - 1) * layers
        assert stats["mean_entropy"] is not None
        assert stats["entropy_target"] == model.manifest["graph"]["power"]["entropy_target"]
        assert stats["compute_budget"] == 1.0


@pytest.mark.parametrize("budget", [0, 1.5, float("nan"), "0.5", True, None])
def test_a_budget_outside_0_1_is_refused_naming_it(power_bundle, budget):  # noqa: F811
    with edgesdk.load(power_bundle.path, threads=1, compute_budget=0.5) as model:
        with pytest.raises(RequestError) as refused:
            model.set_compute_budget(budget)
        assert "set_compute_budget (budget)" in str(refused.value)
        assert "0 < B <= 1" in refused.value.fix
        assert model.power_stats()["compute_budget"] == 0.5  # left as it was


def test_a_numpy_budget_is_taken(power_bundle):  # noqa: F811
    np = pytest.importorskip("numpy")
    with edgesdk.load(power_bundle.path, threads=1, gating=True) as model:
        model.set_compute_budget(np.float32(0.5))
        assert model.power_stats()["compute_budget"] == 0.5


def test_gates_off_and_a_bundle_without_gates_are_refused_with_the_fix(power_bundle, tiny_bundle):  # noqa: F811
    with edgesdk.load(power_bundle.path, threads=1) as model:  # gates off unless asked for
        for call in (lambda: model.set_compute_budget(0.5), model.power_stats):
            with pytest.raises(EdgeSDKError, match="power gates are off") as refused:
                call()
            assert "gating=True" in refused.value.fix
    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        for call in (lambda: model.set_compute_budget(0.5), model.power_stats):
            with pytest.raises(EdgeSDKError, match=f"the bundle {tiny_bundle.path} has no power gates") as refused:
                call()
            assert "edgesdk build --target T --recipe power" in refused.value.fix


def test_health_shows_the_budget_in_force_which_a_request_cannot_change(power_bundle, tiny_bundle):  # noqa: F811
    import json

    from edgesdk.cli_options import configure_gates
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    runtime = open_runtime(power_bundle.path, threads=1)
    configure_gates(runtime.backend, None, 0.6, None)  # serve --compute-budget 0.6
    server = Served(runtime)
    try:
        health = json.loads(server.request("GET", "/health")[2])
        assert health["power"] == {"gating": True, "compute_budget": 0.6,
                                   "entropy_target": power_bundle.manifest["graph"]["power"]["entropy_target"]}
        status, _ = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "compute_budget": 0.1,
                                                    "gating": False, "entropy_target": 0.5})
        assert status == 200  # unknown fields are ignored, as any other is
        assert json.loads(server.request("GET", "/health")[2])["power"] == health["power"]
        runtime.backend.set_compute_budget(0.4)  # the thermal guard's lever
        assert json.loads(server.request("GET", "/health")[2])["power"]["compute_budget"] == 0.4
        runtime.backend.gating = False
        assert json.loads(server.request("GET", "/health")[2])["power"] == {
            "gating": False, "compute_budget": None, "entropy_target": None}
    finally:
        server.close()
    plain = Served(open_runtime(tiny_bundle.path, threads=1))
    try:
        assert "power" not in json.loads(plain.request("GET", "/health")[2])
    finally:
        plain.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(("options", "named", "dropped"), [
    (("--compute-budget", 0.5), "--compute-budget 0.5: needs", "drop --compute-budget"),
    (("--gating",), "--gating: needs", "drop --gating"),
    (("--entropy-target", 1.2, "--gating"), "--entropy-target 1.2, --gating: need", "drop --entropy-target and --gating"),
    (("--no-gating", "--compute-budget", 0.5), "--compute-budget 0.5: needs", "drop --compute-budget"),
], ids=["budget", "gating", "target-and-gating", "budget-beside-no-gating"])
def test_run_refuses_gate_options_on_a_plain_bundle_naming_those_given(tiny_bundle, options, named, dropped):
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, "--threads", 1, *options)
    assert result.exit_code == 1, result.output
    error = " ".join(result.stderr.split())
    assert f"error: {named} a bundle with power gates, and {tiny_bundle.path} has none" in error
    assert f"fix: build the bundle with the power stage (edgesdk build --target T --recipe power), or {dropped}" \
        in error
    for other in {"--entropy-target", "--compute-budget", "--gating"} - {str(o) for o in options}:
        assert other not in error


def test_serve_refuses_gating_on_a_plain_bundle_naming_it(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "--port", _free_port(), "--threads", 1, "--gating")
    assert result.exit_code == 1, result.output
    error = " ".join(result.stderr.split())
    assert f"error: --gating: needs a bundle with power gates, and {tiny_bundle.path} has none" in error
    assert "or drop --gating" in error
    assert "--compute-budget" not in error
    assert "--entropy-target" not in error


def test_serve_of_several_bundles_refuses_a_gate_option_naming_it_and_the_bundles(tiny_bundle, power_bundle):  # noqa: F811
    result = invoke("serve", tiny_bundle.path, power_bundle.path, "--port", _free_port(), "--compute-budget", 0.5)
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert "Invalid value for '--compute-budget': --compute-budget 0.5: steers the power gates of one bundle, and 2 " \
           f"are served ({tiny_bundle.path}, {power_bundle.path})" in error
    assert "alone with --compute-budget, or drop --compute-budget to serve several" in error
    assert "--gating" not in error
    assert "--entropy-target" not in error
