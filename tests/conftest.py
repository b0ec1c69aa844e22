"""Shared fixtures: a tiny model directory and a bundle built from it (session-scoped, built once), a real sshd on
127.0.0.1 per test module, and a stand-in systemd."""

from __future__ import annotations

import pytest
from hypothesis import settings

# Every property test draws the same examples every run: a random draw of test_json_schema_fuzz37 held a CI worker
# for more than ten minutes (test_gbnf_review was derandomized for the same reason); the examples a test's own
# @settings does not name come from this profile.
settings.register_profile("edgesdk", derandomize=True)
settings.load_profile("edgesdk")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from tests._utils.tiny import save_tiny_model_dir

    return save_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_bundle(tiny_model_dir, tmp_path_factory):
    """A verified bundle for the host target, built through the real pipeline."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("bundles") / "tiny-host"
    return build(BuildConfig(target="host", model=str(tiny_model_dir), out=out,
                             export=ExportConfig(max_context=256), progress=False))


@pytest.fixture(scope="module")
def ssh_server(tmp_path_factory):
    """A real, unprivileged sshd on 127.0.0.1 for one test module's boards (``tests/_utils/sshd.py``); skips the
    module's tests that use it where OpenSSH is not installed."""
    from tests._utils.sshd import serve

    yield from serve(tmp_path_factory)


@pytest.fixture
def systemd(tmp_path):
    """(environment, state folder): tests/_utils/fake_systemd.py's systemctl first on PATH and the unit
    directory in tmp, for ``deploy --service``; the servers its units started are stopped after."""
    import os

    from tests._utils import fake_systemd

    state = tmp_path / "systemd-state"
    env = {**os.environ, **fake_systemd.install(tmp_path / "bin", state),
           "EDGESDK_UNIT_DIR": str(tmp_path / "units"), "EDGESDK_HUGE_PAGES": "0"}
    yield env, state
    fake_systemd.stop_all(state)
