"""``edgesdk serve`` stops on SIGTERM, SIGHUP and Ctrl-C through its serving loop, not from inside the signal
handler: a handler that raised at whatever line the main thread was on could land inside ``threading``'s locking
(while the loop started a connection's thread), where the exit became ``RuntimeError: release unlocked lock``,
which socketserver logged and swallowed, and the server ran on after its stop."""

from __future__ import annotations

import signal
import socket
import threading
import time
import urllib.request

import pytest

from edgesdk.cli import main

pytest.importorskip("torch")


def _serve_and_signal(bundle, signum: int) -> dict:
    """``edgesdk serve BUNDLE`` run in this (the main) thread; another thread, once it answers /health, calls the
    handler the process has for ``signum`` there, as a signal arriving while that thread ran would. What the
    handler call raised (if anything) and how the command ended."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seen: dict = {}

    def signal_when_up():
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    seen["health"] = response.status
                break
            except OSError:
                time.sleep(0.1)
        handler = signal.getsignal(signum)
        try:
            handler(signum, None)
            seen["handler"] = "returned"
        except BaseException as exc:  # noqa: BLE001 (what the old handler raised, where it was called)
            seen["handler"] = repr(exc)
            signal.raise_signal(signal.SIGINT)  # the old handler stopped nothing in this thread: stop the test's server

    before = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may start the run with SIGINT ignored,
    for stop in (signal.SIGTERM, signal.SIGHUP):  # and SIGHUP (nohup): the serve command leaves an ignored one be
        signal.signal(stop, signal.SIG_DFL)
    thread = threading.Thread(target=signal_when_up, daemon=True)
    thread.start()
    try:
        main(["serve", str(bundle), "--port", str(port), "--threads", "1", "--quiet"], standalone_mode=False)
        seen["ended"] = "returned"
    except SystemExit as exc:
        seen["ended"] = f"exit {exc.code}"
    finally:
        thread.join(60)
        after = {stop: signal.getsignal(stop) for stop in before}
        for stop, handler in before.items():
            signal.signal(stop, handler)
    seen["handlers_after"] = after
    return seen


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_is_noted_by_the_handler_and_ends_the_server_through_its_loop(tiny_bundle, signum):
    seen = _serve_and_signal(tiny_bundle.path, signum)
    assert seen["health"] == 200
    assert seen["handler"] == "returned"  # the old handler raised SystemExit where it was called
    assert seen["ended"] == f"exit {128 + signum}"


def test_ctrl_c_is_noted_and_ends_the_server_as_stopped(tiny_bundle, capsys):
    seen = _serve_and_signal(tiny_bundle.path, signal.SIGINT)
    assert seen["handler"] == "returned"  # the old handler raised KeyboardInterrupt where it was called
    assert seen["ended"] == "returned"
    assert "edgesdk serve: stopped" in capsys.readouterr().err
    # once serving ended the handlers the loop used are gone: Ctrl-C during the answers' end stops at once
    assert seen["handlers_after"][signal.SIGINT] is signal.default_int_handler
