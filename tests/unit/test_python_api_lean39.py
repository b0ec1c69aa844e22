"""``edgesdk.api`` and its argument checks (``edgesdk.api_checks``) import nothing heavy: the runtime, the server
and numpy come in only when a bundle is loaded, so ``from edgesdk import RequestError`` costs nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import edgesdk
from edgesdk import api, api_checks

HEAVY = ("numpy", "onnxruntime", "pydantic", "torch", "transformers", "edgesdk.runtime", "edgesdk.serve")


def test_importing_the_python_api_pulls_in_no_runtime_or_server():
    code = ("import json, sys; import edgesdk; edgesdk.RequestError; edgesdk.load; "
            "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(proc.stdout)
    assert "edgesdk.api_checks" in loaded
    heavy = [name for name in loaded if name.startswith(HEAVY)]
    assert heavy == [], f"import edgesdk.api pulled in {heavy}"


def test_the_public_names_live_in_edgesdk_api():
    """The checks raise the RequestError users catch from edgesdk and edgesdk.api, and it is named there."""
    assert edgesdk.RequestError is api.RequestError
    assert api.RequestError.__module__ == "edgesdk.api"
    assert set(api_checks.MODEL_SETTINGS) == set(api_checks.SETTING_KINDS)
    assert api.__all__ == ["LoadedPromptCache", "Model", "RequestError", "build_bundle", "load"]
