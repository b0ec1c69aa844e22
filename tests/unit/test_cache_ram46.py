"""``--cache-ram -1`` / ``cache_ram_mib=-1``: no limit on the host-memory store of other conversations' KV caches,
as llama-server reads ``--cache-ram -1`` ("-1 - no limit, 0 - disable"); it was refused as below 0."""

from __future__ import annotations

import sys

import pytest

from edgesdk.serve.completion import Completer, ServeDefaults


def test_minus_one_is_a_store_without_limit_and_below_it_is_refused(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    unlimited = Completer(runtime, ServeDefaults(cache_ram_mib=-1))
    assert unlimited.prompt_cache.store.budget_bytes == sys.maxsize
    assert Completer(runtime, ServeDefaults(cache_ram_mib=0)).prompt_cache.store is None
    assert Completer(runtime, ServeDefaults(cache_ram_mib=3)).prompt_cache.store.budget_bytes == 3 * 2**20
    with pytest.raises(ValueError, match=r"cache_ram_mib must be -1 \(no limit\), 0 .* got -2"):
        ServeDefaults(cache_ram_mib=-2)



def test_serve_takes_cache_ram_minus_one_and_refuses_below(tiny_bundle):
    """The port is taken, so a serve that got past its options stops right after, at the bind."""
    import socket

    from tests.unit.test_cli import invoke

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        unlimited = invoke("serve", tiny_bundle.path, "--port", port, "--cache-ram", -1, "--threads", 1)
        below = invoke("serve", tiny_bundle.path, "--port", port, "--cache-ram", -2, "--threads", 1)
    assert unlimited.exit_code not in (0, 2)
    assert "--cache-ram" not in unlimited.stderr
    assert below.exit_code == 2
    assert "--cache-ram" in below.stderr
