"""The pieces of edgesdk/cli_options.py that run and serve share: --lookup and --draft on a backend that cannot
check drafts say so the same way and decode token by token; a drafting backend gets its settings."""

from __future__ import annotations

import dataclasses

from edgesdk.cli_options import draft_model, lookup_config
from tests._utils.backends import NoRewind


def test_lookup_and_draft_name_a_backend_that_cannot_rewind(runtime, tiny_bundle, capsys):
    backend = NoRewind(runtime.backend)
    assert lookup_config(backend, 4) is None
    unrewindable = dataclasses.replace(runtime, backend=backend)  # the bundle's runtime on that backend
    assert draft_model(tiny_bundle.path, unrewindable, 2, 0, 0.0, 1, None, False, 0) is None
    said = capsys.readouterr().err.splitlines()
    name = runtime.backend.name
    assert said == [
        f"edgesdk: --lookup is not used: the {name} backend cannot rewind its KV cache; it decodes token by token",
        f"edgesdk: --draft is not used: the {name} backend cannot rewind its KV cache; it decodes token by token",
    ]


def test_lookup_on_a_drafting_backend_is_its_settings(runtime, capsys):
    assert lookup_config(runtime.backend, 0) is None
    assert lookup_config(runtime.backend, 5).max_draft == 5
    assert capsys.readouterr().err == ""
