"""``edgesdk serve --reasoning-budget``: llama-server's option reaches the server. 0 renders the chat template with
enable_thinking false; -1 (the default) leaves the template's own default; other budgets are refused by name."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests._utils.serve_command import serve_command
from tests.unit.test_cli import invoke
from tests.unit.test_serve_reasoning import ASK, THINKING_TEMPLATE


@pytest.fixture(scope="module")
def thinking_bundle(tiny_bundle, tmp_path_factory) -> Path:
    """The tiny bundle with a Qwen3-like template (its block closed empty under enable_thinking false), sealed."""
    from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter

    writer = BundleWriter(tmp_path_factory.mktemp("thinking") / "bundle")
    for path in sorted(tiny_bundle.path.rglob("*")):
        name = path.relative_to(tiny_bundle.path).as_posix()
        if path.is_file() and name not in (MANIFEST, MANIFEST_DIGEST, "chat_template.jinja"):
            writer.add_file(path, name)
    writer.write_text("chat_template.jinja", THINKING_TEMPLATE)
    manifest = {key: value for key, value in tiny_bundle.manifest.items()
                if key not in ("files", "bundle_id", "created", "schema_version", "edgesdk_version")}
    return writer.commit(manifest).path


def _served_prompt(bundle: Path, cwd: Path, *options: str) -> str:
    with serve_command(bundle, cwd, *options) as url:
        request = urllib.request.Request(url + "/apply-template", json.dumps({"messages": ASK}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["prompt"]


def test_reasoning_budget_0_serves_thinking_off_and_the_default_leaves_it_on(thinking_bundle, tmp_path):
    assert _served_prompt(thinking_bundle, tmp_path).endswith("<|im_start|>assistant\n<think>\n")
    assert _served_prompt(thinking_bundle, tmp_path, "--reasoning-budget", "0").endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    kept = _served_prompt(thinking_bundle, tmp_path, "--reasoning-budget", "0",
                          "--chat-template-kwargs", '{"enable_thinking": true}')
    assert kept.endswith("<|im_start|>assistant\n<think>\n")


def test_a_token_budget_is_refused_by_name(tiny_bundle):
    result = invoke("serve", tiny_bundle.path, "--reasoning-budget", "256", "--port", 0)
    assert result.exit_code == 2
    assert "'--reasoning-budget'" in result.output
    assert "'-1', '0'" in result.output
