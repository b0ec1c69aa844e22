"""Fixtures the serve and speculative-decoding tests share: the tiny bundle's runtime (one per test module), a
real server over it (and one whose chat template thinks, `terse`), and the bundle opened twice as a target and a draft
model of the same weights.

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


@pytest.fixture(scope="module")
def target(tiny_bundle):
    """The tiny bundle as the model a draft model drafts for."""
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture(scope="module")
def same_model(tiny_bundle):
    """The tiny bundle opened a second time, as a draft model with the target's own weights."""
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def terse(tiny_bundle):
    """A server whose template opens the block without a newline after <think>: the tiny model then thinks in
    characters that are not whitespace (after a newline it writes only newlines, which stripping empties), and the
    Messages API has no logit_bias to ban them."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served
    from tests.unit.test_serve_reasoning import THINKING_TEMPLATE

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source = THINKING_TEMPLATE.replace("{% else %}<think>\n", "{% else %}<think>")
    runtime.tokenizer._template = None
    server = Served(runtime, ServeDefaults(max_tokens=10))
    yield server
    server.close()


@pytest.fixture(scope="module", params=["byte-level", "gemma", "llama2"])
def kind_tokenizer(request, tmp_path_factory):
    """A ChatTokenizer of each kind the bundles carry: byte-level BPE (SmolLM2's), Gemma's SentencePiece-style BPE and
    Llama 2's SentencePiece, whose decoder strips the leading space of the text it decodes."""
    pytest.importorskip("transformers")
    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils import tiny

    make = {"byte-level": tiny.tiny_tokenizer, "gemma": tiny.tiny_gemma_tokenizer,
            "llama2": tiny.tiny_llama2_tokenizer}[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    make().save_pretrained(folder)
    return ChatTokenizer(folder / "tokenizer.json", {}, None)
