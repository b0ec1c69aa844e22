"""load()'s settings that change nothing on the bundle or beside the other settings say so in Model.notes, as
``edgesdk serve`` says so of its options (``--lookup is not used``, ``--cache-ram is not used``) and as load's
``draft`` notes a backend that cannot check drafts; the answers are those of a Model without them."""

from __future__ import annotations

import edgesdk
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture)

CHAT = [{"role": "user", "content": "The quick brown fox"}]


def _choices(model: edgesdk.Model) -> list:
    return model.create_chat_completion(CHAT, max_tokens=6, ignore_eos=True)["choices"]


def test_lookup_on_a_backend_that_cannot_check_drafts_says_so_as_draft_does(power_bundle):  # noqa: F811
    with edgesdk.load(power_bundle.path, threads=1) as plain:
        expected = _choices(plain)
    with edgesdk.load(power_bundle.path, threads=1, lookup=3) as model:
        name = model.runtime.backend.name
        assert f"lookup: not used: the {name} backend cannot check drafts; it decodes token by token" in model.notes
        assert _choices(model) == expected
    with edgesdk.load(power_bundle.path, threads=1, draft=power_bundle.path) as drafted:
        assert f"draft: not used: the {name} backend cannot check drafts; it decodes token by token" in drafted.notes


def test_cache_ram_without_a_prompt_cache_says_so(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, prompt_cache=False, cache_ram_mib=64) as model:
        assert "cache_ram_mib: not used: prompt_cache=False keeps no KV cache between answers" in model.notes
    for settings in ({"cache_ram_mib": 64}, {"prompt_cache": False}, {"lookup": 3}):
        with edgesdk.load(tiny_bundle.path, threads=1, **settings) as model:
            assert not [note for note in model.notes if "not used" in note], (settings, model.notes)
