"""``edgesdk serve`` with several bundles (serve/model_pool.py), and GET /metrics (serve/metrics.py).

A request's model name is matched as Ollama matches it: Ollama parses a name into host, namespace, model and tag,
filling the parts left out with its defaults (types/model/name.go ``ParseName``: ``registry.ollama.ai``,
``library``, ``latest``), and compares the whole names case-folded (``Name.EqualFold``, server/routes.go
``getExistingName``): ``library/qwen`` is ``qwen``. A board watched with no thermal guard (``--no-guard``) reports
its temperature and no guard's level or pause."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.model_pool import ModelPool, ServedModel, described, ollama_key
from edgesdk.thermal.watch import open_session
from tests.unit.test_serve_metrics import ask, samples, start
from tests.unit.test_serve_models42 import build_named_lively

pytest.importorskip("torch")


@pytest.mark.parametrize("asked", ["qwen", "qwen:latest", "library/qwen", "library/qwen:latest",
                                   "registry.ollama.ai/library/qwen:latest", "Registry.Ollama.AI/Library/QWEN",
                                   "https://registry.ollama.ai/library/qwen"])
def test_ollama_s_default_host_namespace_and_tag_name_the_same_model(asked):
    assert ollama_key(asked) == ollama_key("qwen")


@pytest.mark.parametrize("asked", ["qwen:7b", "me/qwen", "other.host/library/qwen", "library/qwen2", "/qwen",
                                   "qwen:"])
def test_another_tag_namespace_or_host_names_another_model(asked):
    assert ollama_key(asked) != ollama_key("qwen")


def test_a_port_in_the_host_is_no_tag():
    assert ollama_key("localhost:5000/me/qwen") == ollama_key("localhost:5000/me/qwen:latest")
    assert ollama_key("localhost:5000/me/qwen") != ollama_key("me/qwen")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """A pool of one real tiny bundle, served as ``lively1-host``, described (nothing needs to run here)."""
    bundle = build_named_lively(tmp_path_factory.mktemp("pool55"), 1)
    model = ServedModel("lively1-host", bundle)
    return ModelPool([model], lambda served: described(served.bundle, ServeDefaults(), None),
                     described(bundle, ServeDefaults(), None), log=lambda line: None)


@pytest.mark.parametrize("asked", ["library/lively1-host", "registry.ollama.ai/library/Lively1-Host:latest"])
def test_a_fully_qualified_ollama_name_finds_the_served_model(pool, asked):
    def unknown(name: str) -> ApiError:
        return ApiError(404, f"model '{name}' not found")

    assert pool.resolve(asked, unknown) == "lively1-host"
    with pytest.raises(ApiError):
        pool.resolve("someone/lively1-host", unknown)


@pytest.mark.parametrize("guard", [False, True])
def test_a_board_watched_without_a_guard_reports_no_guard_level(tiny_bundle, guard):
    """--watch-thermal --no-guard: /health's level is "unguarded"; /metrics gave a level family with every level 0
    (none current, against its HELP) and a pause gauge for a guard that does not run."""
    thermal = open_session(get_profile("rpi5"), guard=guard, simulate=True, status=False)
    server = start(open_runtime(tiny_bundle.path, threads=1), metrics=True, hook=thermal.hook)
    try:
        ask(server, "POST", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 2})
        values = samples(ask(server, "GET", "/metrics")[2])
    finally:
        server.shutdown()
        server.server_close()
        thermal.close()
    assert 0 < values["edgesdk_thermal_temperature_celsius"] < 100
    levels = {name: value for name, value in values.items() if name.startswith("edgesdk_thermal_level")}
    if guard:
        assert sum(levels.values()) == 1
        assert "edgesdk_thermal_paused" in values
    else:
        assert levels == {}
        assert "edgesdk_thermal_paused" not in values
