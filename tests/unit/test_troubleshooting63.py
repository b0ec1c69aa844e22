"""The README's Troubleshooting section, run: each entry's quoted message is what edgesdk prints for the command it
names, so the section cannot go stale silently. The quotes are parsed from README.md; ``…`` in a quote stands for a
name or number that varies, and the pieces between must appear in that order."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
ENTRY = re.compile(r"^- \*\*(?P<title>.+?)\*\* `(?P<quote>[^`]+)`", re.MULTILINE)


def section_entries() -> dict[str, str]:
    """{title: quoted message} of each entry of README.md's ``## Troubleshooting`` section."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## Troubleshooting\n")
    end = text.index("\n## ", start + 1)
    # a code span wrapped over two lines reads as one space, as Markdown renders it
    return {match["title"]: re.sub(r"\s+", " ", match["quote"]) for match in ENTRY.finditer(text[start:end])}


def edgesdk(*args: str, cwd: Path | None = None, prelude: str = "", empty: Path | None = None) -> str:
    """stdout and stderr of ``edgesdk ARGS`` run as a child process (``prelude``: Python run before the CLI), its
    thermal zones and cpufreq policies read under ``empty`` (an empty directory: a machine that has none) if given."""
    code = f"{prelude}\nimport sys\nsys.argv = ['edgesdk', *sys.argv[1:]]\nfrom edgesdk.cli import entry\nentry()"
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                            cwd=cwd, env=_env(empty), stdin=subprocess.DEVNULL)
    return result.stdout + result.stderr


def _env(empty: Path | None) -> dict[str, str]:
    import os

    env = {**os.environ, "EDGESDK_HUGE_PAGES": "0"}
    if empty is not None:
        env.update(EDGESDK_THERMAL_ROOT=str(empty), EDGESDK_CPUFREQ_ROOT=str(empty))
    return env


def fallback_bundle(source: Path, destination: Path) -> Path:
    """The tiny bundle's files under a manifest that asks for TensorRT first and falls back to the CPU, as a Jetson
    bundle's runtime chain does."""
    from edgesdk.bundle import BundleWriter, read_manifest
    from edgesdk.profile import get_profile

    manifest = read_manifest(source)
    writer = BundleWriter(destination)
    for name in manifest["files"]:
        writer.add_file(source / name, name)
    body = {key: value for key, value in manifest.items()
            if key not in ("schema_version", "edgesdk_version", "created", "bundle_id", "files")}
    body["target"] = get_profile("orin-nx").summary()
    body["runtime"] = {**manifest["runtime"], "backend": "tensorrt", "fallbacks": ["ort-trt", "ort-cuda", "ort-cpu"]}
    writer.commit(body)
    return destination


def changed_host_key(ssh_server, tmp_path: Path, bundle: Path) -> str:
    from tests._utils.sshd import keygen

    other = keygen(tmp_path / "other_host_key", "another-board")
    kind, key = other.with_name(other.name + ".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{ssh_server.port} {kind} {key}\n")
    args = [arg.replace(str(ssh_server.known_hosts), str(known)) for arg in ssh_server.client_args()]
    return edgesdk("deploy", str(bundle), "--host", ssh_server.destination, *args)


def serve_on_a_taken_port(bundle: Path) -> str:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        return edgesdk("serve", str(bundle), "--host", "127.0.0.1", "--port", str(taken.getsockname()[1]))


CPU_ONLY = ("Backend fallback.", "A backend asked for that is missing.")


def _has_cuda_provider() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def reproduce(title: str, bundle: Path, tmp_path: Path, request) -> str:
    """What edgesdk prints for the entry ``title``: the entry's command, or its smallest real reproduction."""
    b = str(bundle)
    if title in CPU_ONLY and _has_cuda_provider():
        pytest.skip("this onnxruntime has CUDAExecutionProvider: the entry is of a machine without it")
    if title == "Unknown model.":
        return edgesdk("build", "--target", "host", "--model", "no-such-model", cwd=tmp_path)
    if title == "A Hub id as the model.":
        return edgesdk("build", "--target", "host", "--model", "someorg/somemodel", cwd=tmp_path)
    if title == "Bundle for another board.":
        return edgesdk("run", b, "--target", "rpi5", "--prompt", "hi", "-n", "1")
    if title == "Damaged bundle.":
        damaged = shutil.copytree(bundle, tmp_path / "damaged")
        with open(damaged / "tokenizer.json", "ab") as file:
            file.write(b" ")
        return edgesdk("verify", str(damaged))
    if title == "Prompt longer than the context.":
        (tmp_path / "long.txt").write_text("word " * 2000)
        return edgesdk("run", b, "-f", str(tmp_path / "long.txt"), "-n", "1")
    if title == "Backend fallback.":
        return edgesdk("run", str(fallback_bundle(bundle, tmp_path / "jetson")), "--prompt", "hi", "-n", "1")
    if title == "A backend asked for that is missing.":
        return edgesdk("run", b, "--backend", "ort-cuda", "--prompt", "hi", "-n", "1")
    if title == "`--watch-thermal` without sensors.":
        return edgesdk("run", b, "--watch-thermal", "--prompt", "hi", "-n", "1", empty=_empty(tmp_path))
    if title == "`--clock-cap` without cpufreq.":
        return edgesdk("run", b, "--watch-thermal", "--clock-cap", "--prompt", "hi", "-n", "1",
                       empty=_empty(tmp_path))
    if title == "A llama.cpp option that changes nothing.":
        return edgesdk("run", b, "-ngl", "99", "--prompt", "hi", "-n", "1")
    if title == "A llama.cpp sampler edgesdk lacks.":
        return edgesdk("run", b, "--mirostat", "2", "--prompt", "hi", "-n", "1")
    if title == "Serve port in use.":
        return serve_on_a_taken_port(bundle)
    if title == "Deploy: nothing on the ssh port.":
        return edgesdk("deploy", b, "--host", "user@127.0.0.1:1", "--ssh-config", "/dev/null")
    if title == "Deploy: changed host key.":
        return changed_host_key(request.getfixturevalue("ssh_server"), tmp_path, bundle)
    if title == "Thermal report without matplotlib.":
        (tmp_path / "t.jsonl").write_text('{"t": 0}\n')
        return edgesdk("thermal", "report", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "t.png"),
                       prelude="import sys; sys.modules['matplotlib'] = None")
    if title == "Pack to zip.":
        return edgesdk("pack", b, str(tmp_path / "out.zip"))
    if title == "Unpack a zstd archive.":
        (tmp_path / "x.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(32))
        return edgesdk("unpack", str(tmp_path / "x.tar.zst"), str(tmp_path / "out"))
    raise AssertionError(f"README Troubleshooting entry {title!r} has no reproduction in this test: add one")


def _empty(tmp_path: Path) -> Path:
    empty = tmp_path / "empty-sysfs"
    empty.mkdir()
    return empty


def quoted_in(quote: str, output: str) -> bool:
    """Whether ``quote``'s pieces between ``…`` appear in ``output`` in order."""
    position = 0
    for piece in quote.split("…"):
        found = output.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def test_the_section_has_its_entries():
    entries = section_entries()
    assert 12 <= len(entries) <= 18, f"README Troubleshooting has {len(entries)} entries: {sorted(entries)}"


@pytest.mark.parametrize("title", sorted(section_entries()))
def test_the_readme_quote_is_what_edgesdk_prints(title, tiny_bundle, tmp_path, request):
    quote = section_entries()[title]
    output = reproduce(title, tiny_bundle.path, tmp_path, request)
    assert quoted_in(quote, output), f"README quotes {quote!r} for {title!r}; edgesdk printed:\n{output}"
