"""Fixtures the serve tests share: the tiny bundle's runtime (one per test module) and a real server over it.

A test module that needs other settings defines its own ``runtime`` or ``served``, which take precedence."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()
