"""The test sshd picks another port when the one it was given is taken before sshd binds it: under
``pytest -n 2`` another worker's client connection can take a port between ``free_port`` and sshd's bind."""

from __future__ import annotations

import socket

from tests._utils import sshd


def test_a_port_taken_after_it_was_picked_is_replaced(tmp_path):
    sshd._require_openssh()
    # A client connection's local port, as a connection made by another worker takes it (no listener there, so
    # nothing answers on it: the start must see sshd's bind fail, not a connection).
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket() as client:
        client.bind(("127.0.0.1", 0))
        client.connect(listener.getsockname())
        busy = client.getsockname()[1]
        server = sshd.start_server(tmp_path / "board", port=busy)
        try:
            assert server.port != busy
            assert "Address already in use" in server.log.read_text()  # the first start failed on the taken port
            assert f"[127.0.0.1]:{server.port} " in server.known_hosts.read_text()
        finally:
            server.stop()
