"""A wheel build of the checkout that runs past its time is a DeployError naming it, not subprocess's TimeoutExpired
ending the deploy (or each board of a fleet) in a traceback."""

from __future__ import annotations

import pytest

from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import tiny_checkout


def test_a_wheel_build_past_its_time_is_a_deploy_error_naming_it(tmp_path, monkeypatch):
    from edgesdk.deploy import install

    root = tiny_checkout(tmp_path / "checkout")
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(install, "WHEEL_BUILD_TIMEOUT_S", 0.01)  # a real pip wheel run, which takes longer
    with pytest.raises(DeployError, match=r"building the edgesdk wheel from .* took more than 0.01 s") as caught:
        install.build_wheel(root, install.source_digest(root))
    assert "--no-install" in caught.value.fix
    assert not list((tmp_path / "cache").rglob("*.whl"))
