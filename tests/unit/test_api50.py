"""The Python API checked against llama.cpp / llama-cpp-python (review 50)."""

from __future__ import annotations

import re

import pytest

import edgesdk
from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS

CHAT = [{"role": "user", "content": "Tell me a story"}]


def test_load_takes_draft_min_as_run_and_serve_take_draft_min(tiny_bundle):
    """``edgesdk run/serve --draft-min`` (llama.cpp's ``--draft-min`` / ``--draft-n-min``) is load()'s ``draft_min``:
    it reaches the draft's configuration, the answer stays the bundle's, a value above ``draft_max`` is refused by
    name, and without a draft it is noted as unused. load() refused it as a setting it does not take."""
    with edgesdk.load(tiny_bundle.path, threads=1) as plain:
        expected = plain.create_chat_completion(CHAT, max_tokens=10, ignore_eos=True)
    with edgesdk.load(tiny_bundle.path, threads=1, draft=tiny_bundle.path, draft_max=3, draft_min=2) as drafted:
        assert drafted._completer.lookup.config.min_draft == 2
        answer = drafted.create_chat_completion(CHAT, max_tokens=10, ignore_eos=True)
    assert answer["choices"][0]["message"] == expected["choices"][0]["message"]
    assert answer["timings"]["draft_n"] > 0
    with pytest.raises(edgesdk.EdgeSDKError, match=r"draft_min must be a whole number from 0 to draft_max \(2\), "
                                                   r"got 3") as caught:
        edgesdk.load(tiny_bundle.path, threads=1, draft=tiny_bundle.path, draft_min=3)
    assert "draft_min (at most draft_max" in caught.value.fix
    with pytest.raises(edgesdk.EdgeSDKError, match=r"draft_min must be a whole number .* got 1\.5"):
        edgesdk.load(tiny_bundle.path, threads=1, draft=tiny_bundle.path, draft_min=1.5)
    with edgesdk.load(tiny_bundle.path, threads=1, draft_min=1) as loaded:
        assert "draft_min: not used: it works with draft=BUNDLE" in loaded.notes
    # llama.cpp's other names: the closest argument by spelling was another setting (draft_n -> "did you mean
    # draft_min?", draft_n_min -> "did you mean draft_p_min?")
    for name, hint in (("draft_n", "pass draft_max=N (llama.cpp's --draft-n is --draft-max)"),
                       ("draft_n_min", "pass draft_min=N (llama.cpp's --draft-n-min is --draft-min)")):
        with pytest.raises(edgesdk.EdgeSDKError, match=re.escape(f"{name}: {hint}")):
            edgesdk.load(tiny_bundle.path, threads=1, **{name: 2})


def test_load_takes_max_tokens_minus_one_as_serve_takes_n_minus_one(tiny_bundle):
    """``edgesdk serve -n -1`` (llama-server's "-1 = infinity") and a request's ``max_tokens=-1`` (llama-cpp-python's
    too) answer until the context is full; load(), whose settings are serve's options, refused ``max_tokens=-1``
    as "expected a whole number of at least 1"."""
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=-1) as unlimited:
        answer = unlimited("The sea", ignore_eos=True)
        # as a request's own max_tokens=-1 runs: to the full context
        assert answer["choices"] == unlimited("The sea", ignore_eos=True, max_tokens=-1)["choices"]
        assert answer["usage"]["completion_tokens"] > unlimited.max_context - 10
        assert unlimited._completer.defaults.max_tokens == UNTIL_THE_CONTEXT_FILLS  # not a count a longer bundle passes
    for value in (0,):
        with pytest.raises(edgesdk.EdgeSDKError, match=rf"max_tokens={value}: expected a whole number of at least 1, "
                                                       r"or -1 for no limit but the context"):
            edgesdk.load(tiny_bundle.path, threads=1, max_tokens=value)


@pytest.mark.parametrize("bits", [16, 2, 0])
def test_build_bundle_takes_the_weight_bits_edgesdk_build_takes(bits, tmp_path):
    """``edgesdk build --weight-bits`` takes 4 or 8; build_bundle(weight_bits=16) (fp16, as a user may read it) went
    on as ``--set qat.weight_bits=16 export.weights=int16`` and was refused in words the caller never wrote. It is
    refused naming the argument before anything runs (the target is one no board has: it is not reached)."""
    with pytest.raises(edgesdk.EdgeSDKError, match=rf"build_bundle\(\): weight_bits={bits}: expected 8 or 4") as caught:
        edgesdk.build_bundle("no-such-board", weight_bits=bits, out=tmp_path / "bundle", progress=False)
    assert "weight_bits=8" in caught.value.fix
    with pytest.raises(edgesdk.EdgeSDKError, match="no-such-board"):  # 4 and 8 pass on to the build
        edgesdk.build_bundle("no-such-board", weight_bits=4, out=tmp_path / "bundle", progress=False)


def test_numpy_scalars_in_request_fields_and_load_settings_are_the_numbers_they_hold(tiny_bundle):
    """A length or a count computed with NumPy is a NumPy scalar; llama-cpp-python's ``Llama`` takes them, and the
    HTTP body's JSON would carry the number. ``max_tokens=np.int64(3)`` was refused as "must be a whole number
    >= 0 ... got np.int64(3)", ``temperature=np.float32(0.5)`` as "must be a number", ``echo=np.True_`` as "must be
    true or false", and load(max_tokens=np.int64(...)) / threads=np.int64(1) likewise."""
    np = pytest.importorskip("numpy")

    with edgesdk.load(tiny_bundle.path, threads=np.int64(1), max_tokens=np.int64(5)) as model:
        assert model("The sea", ignore_eos=True)["usage"]["completion_tokens"] == 5
        expected = model("The sea", max_tokens=3, temperature=0.5, seed=4, top_k=3, logprobs=2, echo=True,
                         ignore_eos=True)
        given = model("The sea", max_tokens=np.int64(3), temperature=np.float32(0.5), seed=np.uint32(4),
                      top_k=np.int32(3), logprobs=np.int64(2), echo=np.True_, ignore_eos=True)
        assert given["choices"] == expected["choices"]
        chat = model.create_chat_completion(CHAT, max_tokens=np.int16(2), ignore_eos=True)
        assert chat["usage"]["completion_tokens"] == 2
        whole = model("The sea", max_tokens=3, ignore_eos=True)["choices"][0]["text"]
        streamed = model("The sea", max_tokens=3, stream=np.True_, ignore_eos=True)
        assert "".join(chunk["choices"][0]["text"] for chunk in streamed) == whole
        # a value out of range is still refused, naming the number it holds
        with pytest.raises(edgesdk.RequestError, match=r"max_tokens is -5; expected a whole number"):
            model("The sea", max_tokens=np.int64(-5))


def test_a_bundle_s_manifest_passed_for_the_bundle_is_told_to_pass_its_directory(tiny_bundle, tmp_path):
    """``edgesdk.load("bundle/manifest.json")`` was told to unpack it as an archive made by 'edgesdk pack'
    ("edgesdk unpack .../manifest.json DIR"), which fails; the fix is the directory holding it."""
    from edgesdk.bundle import verify_bundle

    for name in ("manifest.json", "manifest.sha256"):
        with pytest.raises(edgesdk.EdgeSDKError, match=f"is a file, not a bundle directory: the {name} of a bundle"
                           ) as caught:
            edgesdk.load(tiny_bundle.path / name, threads=1)
        assert caught.value.fix == f"pass the directory that holds it: {tiny_bundle.path}"
        assert "unpack" not in caught.value.fix
    outside = tmp_path / "report.md"
    outside.write_bytes((tiny_bundle.path / "report.md").read_bytes())
    with pytest.raises(edgesdk.EdgeSDKError, match="is a file, not a bundle directory") as caught:
        verify_bundle(outside)  # a file outside any bundle may be an archive, as before
    assert "edgesdk unpack" in caught.value.fix
