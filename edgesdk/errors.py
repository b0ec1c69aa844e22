"""Typed errors. Every user-facing error names the thing, the value, what was expected and the fix.

The CLI prints ``str(error)`` and exits non-zero; nothing in the package uses ``assert`` to check
user input.
"""

from __future__ import annotations

import difflib
import errno
import re
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


def closest(word: str, known: list[str] | tuple[str, ...]) -> str | None:
    """The known name closest to a mistyped ``word`` by difflib's ratio (cutoff 0.6), None where none is close."""
    close = difflib.get_close_matches(word, known, n=1)
    return close[0] if close else None


def did_you_mean(word: str, known: list[str] | tuple[str, ...]) -> str:
    """'; did you mean 'x'?' naming the known name closest to a mistyped ``word`` (:func:`closest`; as
    :mod:`edgesdk.models.sources` suggests a model alias), else ''."""
    match = closest(word, known)
    return f"; did you mean '{match}'?" if match else ""


# The errors of a write that found no room: a full disk, a user's quota, a file size limit (ulimit -f).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(exc: BaseException) -> bool:
    """``exc`` is a write that found no room (:data:`DISK_FULL`), an OSError or safetensors' ``(os error N)``."""
    if isinstance(exc, OSError):
        return exc.errno in DISK_FULL
    return any(f"(os error {code})" in str(exc) for code in DISK_FULL)


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
    padding = head.find(b"\x00" * 8)
    if padding >= 0:
        # A run of 8 NULs is in no wide text (UTF-32's longest is 4, U+0000 aside): the zero-filled tail a crash or a
        # preallocation leaves, or a binary block. Only what precedes it tells the encoding: counted with it, UTF-8 or
        # Latin-1 text so padded was named UTF-32 or UTF-16, whose iconv turns it into garbage.
        head = head[:padding]
    if head.count(0) < 2:
        return "latin1"
    if head.count(0) * 4 < len(head):
        # Fewer NULs than a mostly-Latin text in a wide encoding has: UTF-16 of another script (CJK), whose NULs
        # are mostly those of its ASCII characters (spaces, digits, line breaks: after the character little-endian,
        # before it big-endian) and a few of its own (U+4E00 and every U+xx00 have a NUL low byte). Latin-1 text
        # has none; named Latin-1, iconv turned such a file into UTF-8 full of NULs. The side with more NULs gives
        # the byte order, where the text decodes in it (no lone surrogate).
        odd = head[1::2].count(0)
        for order in ("utf-16le", "utf-16be") if odd * 2 >= head.count(0) else ("utf-16be", "utf-16le"):
            if _decodes(head, order) and _line_breaks_fit(head, order):
                return order
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


def _line_breaks_fit(head: bytes, order: str) -> bool:
    """Whether the line feeds of ``head`` are UTF-16's in byte order ``order``: most 0x0A bytes a 2-byte unit
    ``0A 00`` (little-endian) or ``00 0A`` (big-endian). Almost any bytes decode as UTF-16 (Latin text reads as CJK),
    so a Latin-1 file with a few stray NULs decoded too; its line feeds are single bytes beside no NUL. A head
    without a line feed says nothing against it."""
    feeds = head.count(b"\n")
    if not feeds:
        return True
    unit = b"\n\x00" if order == "utf-16le" else b"\x00\n"
    paired = sum(1 for start in range(0, len(head) - 1, 2) if head[start:start + 2] == unit)
    return paired * 2 >= feeds


def _decodes(head: bytes, encoding: str) -> bool:
    """Whether ``head`` (the start of a file, maybe cut inside a character) decodes as ``encoding``."""
    try:
        head[:len(head) // 2 * 2].decode(encoding)
    except UnicodeDecodeError as exc:
        return exc.end >= len(head) // 2 * 2  # only the last unit fails: a surrogate pair cut by the 4096 bytes
    return True


# The bytes 0x80-0x9F that Windows-1252 gives a character (curly quotes, dashes, the euro sign, the ellipsis) and
# Latin-1 a C1 control code, which no text holds; it leaves 0x81, 0x8D, 0x8F, 0x90 and 0x9D undefined.
CP1252_PRINTABLE_C1 = re.compile(rb"[\x80\x82-\x8c\x8e\x91-\x9c\x9e\x9f]")
UTF8_SAMPLE = 1 << 20  # the bytes around a file's first bad byte read to tell damaged UTF-8 from 8-bit text


def eight_bit_encoding(data: bytes) -> str:
    """The 8-bit encoding of text that is neither UTF-8 nor wide: Windows-1252 where it holds a byte 0x80-0x9F that
    only Windows-1252 makes a character (Windows' "ANSI" text, whose curly quotes and dashes ``iconv -f latin1``
    turned into invisible C1 control codes without an error), else Latin-1 (the two agree on every other byte)."""
    return "cp1252" if CP1252_PRINTABLE_C1.search(data) else "latin1"


def damaged_utf8(data: bytes) -> bool:
    """Whether ``data`` (bytes that do not decode as UTF-8) is UTF-8 text with a few bad bytes, a file cut inside a
    character or with one byte of another encoding pasted in: more of its non-ASCII characters decode than fail.
    Latin-1 text has almost no valid UTF-8 sequence (a letter such as é is one byte, beside ASCII); converted from
    Latin-1, damaged UTF-8 text had every one of its accented letters doubled into two (é became Ã©).

    Judged on the :data:`UTF8_SAMPLE` bytes around the first bad one: those of the file's head alone held none where
    a large UTF-8 file was cut inside its last character, and it was named 8-bit text."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        first = exc.start
    else:
        return False
    start = max(first - UTF8_SAMPLE // 2, 0)
    while start < first and data[start] & 0xC0 == 0x80:  # a continuation byte: start at its character's end
        start += 1
    text = data[start:start + UTF8_SAMPLE].decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    decoded = sum(1 for char in text if char > "\x7f") - bad
    return 0 < bad < decoded


DROP_BAD_UTF8 = "iconv -c -f utf-8 -t utf-8"  # the iconv that drops the bad bytes of UTF-8 text with a few


def iconv_to_utf8(data: bytes) -> str:
    """The iconv command that makes ``data``, bytes that are not UTF-8, UTF-8 text: :data:`DROP_BAD_UTF8` for UTF-8
    text with a few bad bytes (:func:`damaged_utf8`), else one that converts from Windows-1252, Latin-1
    (:func:`eight_bit_encoding`) or the wide encoding its NULs show (:func:`likely_encoding`). ``iconv -f latin1``
    garbled the first two: é doubled into Ã©, curly quotes turned into invisible C1 control codes."""
    encoding = likely_encoding(data)
    if encoding == "latin1" and damaged_utf8(data):
        return DROP_BAD_UTF8
    return f"iconv -f {eight_bit_encoding(data) if encoding == 'latin1' else encoding} -t utf-8"


def utf8_fix(data: bytes, path: Path | str) -> str:
    """The fix for a file of ``data`` that is not UTF-8: the iconv command that converts it, or that drops its bad
    bytes where it is UTF-8 with a few (:func:`iconv_to_utf8`)."""
    quoted = shlex.quote(str(path))  # the fix is a command to paste: a path with a space stays one word
    output = shlex.quote(f"{path}.utf8")
    command = iconv_to_utf8(data)
    if command == DROP_BAD_UTF8:
        return (f"it is UTF-8 text but for a few bytes (cut inside a character, or from another encoding): drop them, "
                f"e.g. {command} {quoted} > {output}")
    return f"convert it first, e.g. {command} {quoted} > {output}"


def read_utf8(path: Path, what: str, error: type[EdgeSDKError] = EdgeSDKError, newlines: bool = True) -> str:
    """Read ``path`` as UTF-8 text, or raise ``error`` naming ``what``, the bad byte (or why the file
    cannot be read) and the fix. ``newlines``: its line breaks as ``read_text`` gives them (\\r\\n and \\r read
    as \\n); False keeps them as the bytes have them, as llama.cpp's tools read a file.

    Every text input (training data, recipes, target profiles, evaluation text) goes through here,
    so a Latin-1 file is refused with the same message everywhere instead of read as U+FFFD.

    UTF-16 (or UTF-32) text without a byte-order mark is refused as well, named with its iconv fix as marked text
    is: each of its ASCII characters (every space, digit and line break) has a NUL byte beside it, all on one side
    of the 2-byte units, where UTF-8 and Latin-1 text have none (Python's ``json.detect_encoding`` tells a
    BOM-less UTF-16 or UTF-32 text by the same NULs). Such a file may even decode as
    UTF-8 (UTF-16 ASCII or Cyrillic text has every byte below 0x80) and was read as text with a NUL after each
    character. :func:`likely_encoding` names the width and byte order, for text of any script."""

    try:
        data = path.read_bytes()  # once: a pipe (-f /dev/stdin, <(zcat ...)) is empty on a second read
        text = data.decode("utf-8")
        if newlines:  # read_text's universal newlines
            text = text.replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                    utf8_fix(exc.object, path)) from exc
    except OSError as exc:  # unreadable (permissions), a directory, gone since it was checked
        raise error(f"{what} {path} cannot be read ({exc.strerror or exc})",
                    f"pass a readable text file (check that {path} exists and that this user may read it)") from exc
    if text.count("\x00") >= 2:  # valid UTF-8 with NULs: mark-less UTF-16 / UTF-32 whose bytes all decode
        head = data[:4096]  # as stored, line breaks untranslated
        wide = likely_encoding(head) if head.count(0) * 32 >= len(head) else "latin1"
        if wide != "latin1":  # at least 1/32 of the bytes NUL: a stray NUL in UTF-8 text still reads
            raise error(f"{what} {path} is not UTF-8 text: {head.count(0)} of its first {len(head)} bytes are NUL, "
                        f"where {wide} text without a byte-order mark has them",
                        utf8_fix(head, path))
    return text


def overflow_headline(tokens: int, limit: int, what: str) -> str:
    """The first words of a refusal of ``tokens`` tokens past the model's context of ``limit``, OpenAI's own ("This
    model's maximum context length is 4096 tokens. However, your messages resulted in 5000 tokens"), ``what`` the
    route's field (messages, prompt, input). Apps written for OpenAI's API test ``"maximum context length" in
    str(error)`` to trim a conversation and try again (the openai client's str() of an error is its message alone);
    worded otherwise, they showed the error and stopped. Here, where the runtime (an embedding's input) words it
    too without importing the server."""
    return f"This model's maximum context length is {limit} tokens. However, your {what} resulted in {tokens} tokens"
