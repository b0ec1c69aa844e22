"""One bundle served: a request's model name is matched as Ollama matches it (server/routes.go getExistingName:
parts compared with EqualFold, ``name`` read as ``name:latest``)."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import _model_name


@pytest.mark.parametrize("asked", ["tiny", "TINY", "Tiny:latest", "tiny:LATEST"])
def test_a_name_in_another_case_or_with_the_default_tag_is_the_served_model(asked):
    assert _model_name({"model": asked}, "tiny") == asked


@pytest.mark.parametrize("asked", ["tiny:q4", "tin", "other"])
def test_another_name_or_tag_is_still_not_found(asked):
    with pytest.raises(ApiError) as info:
        _model_name({"model": asked}, "tiny")
    assert info.value.status == 404
