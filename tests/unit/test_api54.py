"""Review of the Python API (54th stop):

- ``build_bundle``'s numbers and flags given as NumPy scalars (``max_context=np.int64(16)``, ``progress=np.True_``)
  are the int and bool they hold, as ``load()``'s arguments and the request fields read them; they were refused as
  "max_context=np.int64(16): expected a whole number" (a NumPy float is still refused);
- a draft bundle built for another board than ``load(target=...)`` is refused with a fix in Python's terms
  (``ignore_target=True``, ``edgesdk.build_bundle``); it named ``--ignore-target`` and ``edgesdk build --target``,
  the command line's options, which a Python caller has no way to pass.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

import edgesdk
from edgesdk.errors import BundleError, EdgeSDKError, ProfileError


@pytest.mark.parametrize("argument", [{"max_context": np.int64(16)}, {"weight_bits": np.int64(8)},
                                      {"generated_sequences": np.uint8(2)}, {"data_skip_chars": np.int32(0)},
                                      {"progress": np.False_}, {"keep_work": np.True_}])
def test_numpy_scalars_are_build_bundle_s_numbers_and_flags(argument):
    # taken as the values they hold: the build goes on to read the target, which is the one thing wrong here
    with pytest.raises(ProfileError) as caught:
        edgesdk.build_bundle("no-such-board", **argument)
    assert "no-such-board" in caught.value.problem


def test_a_numpy_float_is_still_refused_as_a_whole_number():
    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.build_bundle("no-such-board", max_context=np.float64(16.0))
    assert "max_context=" in caught.value.problem
    assert "expected a whole number" in caught.value.problem


def _retargeted(bundle_path, destination, target: str):
    """A copy of the bundle at ``bundle_path`` whose manifest says it was built for ``target`` (digest rewritten)."""
    shutil.copytree(bundle_path, destination)
    manifest = json.loads((destination / "manifest.json").read_text())
    manifest["target"]["name"] = target
    text = json.dumps(manifest, indent=2)
    (destination / "manifest.json").write_text(text)
    (destination / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    return destination


def test_a_draft_built_for_another_board_is_refused_in_python_terms(tiny_bundle, tmp_path):
    draft = _retargeted(tiny_bundle.path, tmp_path / "draft-rpi5", "rpi5")
    with pytest.raises(BundleError) as caught:
        edgesdk.load(tiny_bundle.path, threads=1, target="host", draft=draft)
    assert "built for target 'rpi5', not 'host'" in caught.value.problem
    assert "ignore_target=True" in caught.value.fix
    assert "edgesdk.build_bundle('host', ...)" in caught.value.fix
    assert "--" not in caught.value.fix
    assert "edgesdk build" not in caught.value.fix
