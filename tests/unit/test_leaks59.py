"""What a failed model load of ``edgesdk serve`` with several bundles gives back (edgesdk/cli_serve.py,
``_model_pool``), on real tiny bundles."""

from __future__ import annotations

import pytest

from edgesdk.serve.model_pool import ApiError

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def test_a_model_that_fails_after_its_runtime_opened_gives_the_session_back(tiny_bundle, tmp_path):
    """The second bundle's manifest names a pooling that is none (edited with its hashes): it verifies at the start,
    opens, and is refused when its completer is made. The runtime just opened was not closed, so its ONNX Runtime
    session (the model's weights, its threads) lived as long as the error's traceback, which the 500 keeps as its
    cause."""
    from edgesdk.cli_serve import _model_pool
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import Completer, ServeDefaults
    from tests.unit.test_backend_close53 import edited_copy, live_sessions

    bad = edited_copy(tiny_bundle.path, tmp_path / "bad-pooling",
                      lambda manifest: manifest["model"].setdefault("before", {}).update(pooling="bogus"))
    runtime = open_runtime(tiny_bundle.path, threads=1)
    completer = Completer(runtime, ServeDefaults())
    pool = _model_pool([("good", tiny_bundle.path), ("bad", bad)], runtime, completer, ServeDefaults(), None, None,
                       0, backend=None, threads=1, target=None, ignore_target=False)
    before = live_sessions()
    with pytest.raises(ApiError, match="'model.before.pooling' is 'bogus'") as caught:
        pool.acquire("bad")
    assert caught.value.__cause__.__traceback__ is not None  # the frames of the load are still alive
    assert live_sessions() - before == set()
    lease = pool.acquire("good")  # the pool goes on: the good model loads again and answers
    assert pool.completer.runtime.bundle.path == tiny_bundle.path
    pool.release(lease)
