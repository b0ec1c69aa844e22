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

    UTF-16 (or UTF-32) text without a byte-order mark is refused as well, named with its iconv fix as marked text
    is: each of its ASCII characters (every space, digit and line break) has a NUL byte beside it, all on one side
    of the 2-byte units, where UTF-8 and Latin-1 text have none (Python's ``json.detect_encoding`` tells a
    BOM-less UTF-16 or UTF-32 text by the same NULs). Such a file may even decode as
    UTF-8 (UTF-16 ASCII or Cyrillic text has every byte below 0x80) and was read as text with a NUL after each
    character; and UTF-16 text of another script, whose NULs are fewer than the quarter
    :func:`likely_encoding` looks for, was named Latin-1, which iconv turns into UTF-8 full of NULs."""

    def markless_wide(data: bytes, share: int) -> str | None:
        """The encoding of ``data`` if its NULs (at least 1/``share`` of its first 4096 bytes) show UTF-16 or
        UTF-32 without a byte-order mark; else None."""
        head = data[:4096]
        nuls = head.count(0)
        if not nuls or nuls * share < len(head):
            return None
        named = likely_encoding(head)
        if named != "latin1":  # a quarter of the bytes NUL or more: the width and byte order by their places
            return named
        odd = head[1::2].count(0)  # UTF-16LE has an ASCII character's NUL after it, UTF-16BE before it
        even = nuls - odd
        if min(odd, even) * 16 > max(odd, even):  # NULs on both sides: not UTF-16 text
            return None
        return "utf-16le" if odd > even else "utf-16be"

    def wide_fix(encoding: str) -> str:  # utf8_fix's command, for the encoding found here
        return (f"convert it first, e.g. iconv -f {encoding} -t utf-8 {shlex.quote(str(path))} > "
                f"{shlex.quote(f'{path}.utf8')}")

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        wide = markless_wide(exc.object, len(exc.object) + 1) if likely_encoding(exc.object) == "latin1" else None
        raise error(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    wide_fix(wide) if wide else utf8_fix(exc.object, path)) from exc
    except OSError as exc:  # unreadable (permissions), a directory, gone since it was checked
        raise error(f"{what} {path} cannot be read ({exc.strerror or exc})",
                    f"pass a readable text file (check that {path} exists and that this user may read it)") from exc
    if text.count("\x00") >= 2:  # valid UTF-8 with NULs: mark-less UTF-16 / UTF-32 whose bytes all decode
        try:
            data = path.read_bytes()  # as stored: read_text turned line breaks into \n
        except OSError:
            data = text.encode("utf-8")
        wide = markless_wide(data, 32)
        if wide:
            head = data[:4096]
            raise error(f"{what} {path} is not UTF-8 text: {head.count(0)} of its first {len(head)} bytes are NUL, "
                        f"where {wide} text without a byte-order mark has them",
                        wide_fix(wide))
    return text
