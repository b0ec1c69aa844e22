"""Typed errors. Every user-facing error names the thing, the value, what was expected and the fix.

The CLI prints ``str(error)`` and exits non-zero; nothing in the package uses ``assert`` to check
user input.
"""

from __future__ import annotations

import shlex
from pathlib import Path


class EdgeSDKError(Exception):
    """Base class of every error edgesdk raises on purpose.

    Args:
        problem: what is wrong, naming the thing and the value received.
        fix: what the user can do about it.
    """

    exit_code = 1

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


class ProfileError(EdgeSDKError):
    """A target profile is unknown or its YAML does not match the schema."""

    exit_code = 2


class ModelSourceError(EdgeSDKError):
    """A model source (path, GGUF file, alias) cannot be resolved or loaded."""

    exit_code = 3


class ExportError(EdgeSDKError):
    """The ONNX export failed or does not match the PyTorch model."""

    exit_code = 4


class BundleError(EdgeSDKError):
    """A bundle is missing, corrupt, incomplete or built for another target."""

    exit_code = 5


class BuildError(EdgeSDKError):
    """The build pipeline was misconfigured (stage order, recipe) or a stage failed."""

    exit_code = 6


class RuntimeBackendError(EdgeSDKError):
    """No runtime backend could run the bundle on this machine."""

    exit_code = 7


def likely_encoding(data: bytes) -> str:
    """The encoding to name in ``iconv -f`` for bytes that are not UTF-8: UTF-16 or UTF-32 where a byte-order mark
    says so (Windows' "Unicode" text, PowerShell's ``>``), or where NUL bytes show a wide encoding without one;
    else Latin-1, the usual 8-bit text. Converted from Latin-1, a UTF-16 file would become UTF-8 full of NULs that
    reads without an error."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    head = data[:4096]
    if not head or head.count(0) * 4 < len(head):
        return "latin1"
    # No byte-order mark: the NULs' places tell the width and the byte order (text mostly below U+0100 has the
    # high bytes NUL). Named as "utf-16"/"utf-32", such a file is read in whatever order iconv assumes (glibc's
    # little-endian, libiconv's big-endian): UTF-32 read as UTF-16 gave UTF-8 full of NULs, big-endian UTF-16 read
    # as little-endian CJK text, both without an error.
    # UTF-32 keeps its top byte NUL (U+10FFFF at most), and the one below it for every character of the BMP (CJK and
    # Cyrillic too, whose UTF-32 read as UTF-16 gave each character a NUL after it): those two bytes of every 4 are
    # the last two (little-endian) or the first two (big-endian). UTF-16 has its NULs in every other byte instead.
    nuls = [head[offset::4].count(0) for offset in range(4)]
    quads = max(len(head) // 4, 1)
    if nuls[2] * 2 >= quads and nuls[3] * 2 >= quads:
        return "utf-32le"
    if nuls[0] * 2 >= quads and nuls[1] * 2 >= quads:
        return "utf-32be"
    return "utf-16le" if nuls[1] + nuls[3] >= nuls[0] + nuls[2] else "utf-16be"


def utf8_fix(data: bytes, path: Path | str) -> str:
    """The fix for a file of ``data`` that is not UTF-8: the iconv command that converts it."""
    quoted = shlex.quote(str(path))  # the fix is a command to paste: a path with a space stays one word
    return f"convert it first, e.g. iconv -f {likely_encoding(data)} -t utf-8 {quoted} > {shlex.quote(f'{path}.utf8')}"


def read_utf8(path: Path, what: str, error: type[EdgeSDKError] = EdgeSDKError) -> str:
    """Read ``path`` as UTF-8 text, or raise ``error`` naming ``what``, the bad byte (or why the file
    cannot be read) and the fix.

    Every text input (training data, recipes, target profiles, evaluation text) goes through here,
    so a Latin-1 file is refused with the same message everywhere instead of read as U+FFFD.
    """
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    utf8_fix(exc.object, path)) from exc
    except OSError as exc:  # unreadable (permissions), a directory, gone since it was checked
        raise error(f"{what} {path} cannot be read ({exc.strerror or exc})",
                    f"pass a readable text file (check that {path} exists and that this user may read it)") from exc
