"""The interactive input of ``edgesdk run``, as llama-cli reads it: a prompt per line (a trailing backslash going on
over the next, a trailing '/' ending it without a line break; with --multiline-input each line going on and a
trailing backslash ending it), escapes in --in-prefix / --in-suffix / --reverse-prompt, reverse prompts that hand
control back, ``/read FILE``, a Ctrl-C that lands between two writes of the answer rather than inside one, and the loop
(:class:`Chat`) that reads the lines, acts on the commands (/clear, /regen, /read, /exit) and has the others
answered.

Typed text is taken as written: a \\n typed in a prompt stays a backslash and an 'n', as llama-cli's tools/cli/cli.cpp
(the chat this one follows: /regen, /read, /clear) passes its input on; -e/--escape is for the text on the command
line. (The older tools/main/main.cpp, now llama-completion, also runs ``string_process_escapes`` on each typed line
when -e is on, so that a Windows path or pasted code with \\t or \\n in it changes.) Where no chat template formats
the line (--raw, or a bundle without one) the typed text is plain text, a special token's text in it read as text,
as llama-completion reads it; --in-prefix and --in-suffix keep their special tokens (:func:`typed_prompt_ids`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import click

from edgesdk.errors import EdgeSDKError, disk_full, read_utf8
from edgesdk.runtime.conversation import fit_to_context


def read_utf8_as_is(path: Path, what: str) -> str:
    """The UTF-8 text of ``path`` with its line ends as they are, as llama.cpp reads a file it is given: llama-cli's
    ``-f`` / ``-sysf`` (common/arg.cpp ``read_file``: an ifstream, no newline translation on Linux) and its ``/read``
    (tools/cli/cli.cpp ``load_input_file``: ``std::ios::binary``), so a CRLF file keeps its CR and a lone CR is no
    line end (:func:`~edgesdk.errors.read_utf8` with ``newlines=False``; by default it turns both into newlines, as
    Python's text mode does). The file or pipe (``-f <(cmd)``, /dev/stdin) is read once, and refused as read_utf8
    refuses any text input: a file that cannot be read (or looked up), is not UTF-8, or is UTF-16 without its mark."""
    return read_utf8(path, what, newlines=False)


def _expand_home(name: str) -> Path:
    """``name`` with a leading ``~`` or ``~user`` expanded; one that names no home (no such user, no HOME) kept as
    typed, as the shell keeps ``~nobody-here/notes.txt`` (``Path.expanduser`` raises RuntimeError there)."""
    try:
        return Path(name).expanduser()
    except RuntimeError:
        return Path(name)


def _typed_path(name: str) -> tuple[str, Path]:
    """The file ``/read NAME`` names, as (its name, its path): NAME as typed where something has that name, else the
    one path NAME quotes or escapes as a shell does, where that exists. A file dragged onto a terminal is typed so
    (GNOME Terminal: ``'/home/me/my notes.txt' ``; macOS Terminal: ``/Users/me/my\\ notes.txt``), as Ollama's chat
    reads a dropped file's path; taken as typed, it was refused as missing, naming a path that exists. A name with
    quotes or backslashes of its own is looked up as typed first."""
    path = _expand_home(name)
    if os.path.lexists(path):
        return name, path
    try:
        words = shlex.split(name)
    except ValueError:  # an unbalanced quote: the name as typed
        return name, path
    if len(words) != 1 or words[0] == name or not os.path.exists(unquoted := _expand_home(words[0])):
        return name, path
    return words[0], unquoted


def read_for_prompt(name: str, file_separator: str | None = None) -> str:
    """``/read FILE``: the file's text (its bytes as they are, :func:`read_utf8_as_is`) as it goes before the next
    prompt, under a ``--- File: FILE ---`` line as
    llama-cli's tools/cli adds it (and ended with a line break, so the prompt starts on a line of its own). A model
    with a file-separator token (``file_separator``: its text, ``<|file_sep|>`` in Qwen2.5-Coder's vocabulary) gets
    the file as it was trained on files, ``<|file_sep|>FILE`` and a line break before the text, as llama-cli's
    tools/cli writes it where the vocabulary has FIM_SEP."""
    if not name:
        raise EdgeSDKError("/read names no file", "type /read FILE: the text of FILE goes before your next prompt")
    if "\x00" in name:  # no path holds one: open() raises ValueError, which ended the session with a traceback
        raise EdgeSDKError(f"/read {name!r} names no file a path can name: it holds a NUL character (Ctrl-@ or "
                           "Ctrl-Space at a terminal types one)", "type /read FILE with the file's path alone")
    name, path = _typed_path(name)
    content = read_utf8_as_is(path, "the /read file")  # a CRLF file keeps its CR, as llama-cli's
    click.echo(f"edgesdk: read {name} ({len(content):,} characters); it goes before your next prompt", err=True)
    header = f"--- File: {name} ---\n" if file_separator is None else f"{file_separator}{name}\n"
    return header + content + ("" if content.endswith("\n") else "\n")


class TypedPrompt(str):
    """A prompt read from stdin (:class:`Chat`): its text is the whole prompt, --in-prefix + the /read files + the
    typed line + --in-suffix, and its parts are kept apart for :func:`typed_prompt_ids`."""

    prefix: str
    files: tuple[str, ...]
    typed: str
    suffix: str

    def __new__(cls, prefix: str, files: tuple[str, ...], typed: str, suffix: str) -> TypedPrompt:
        self = super().__new__(cls, prefix + "".join(files) + typed + suffix)
        self.prefix, self.files, self.typed, self.suffix = prefix, files, typed, suffix
        return self


def typed_prompt_ids(tokenizer, prompt: TypedPrompt, bos: int | None = None, alone: bool = True) -> list[int]:
    """The token ids of a prompt read from stdin and answered as it is (--raw, or a bundle without a chat
    template), as llama.cpp's llama-completion tokenizes an interactive line (tools/completion/completion.cpp,
    tools/main/main.cpp before): ``common_tokenize(ctx, input_prefix, false, true)``, ``common_tokenize(ctx,
    user_inp, false, format_chat)`` and ``common_tokenize(ctx, input_suffix, false, true)``, with ``format_chat``
    false where no chat template formats the line. So the special tokens' text in --in-prefix / --in-suffix
    (``<|im_start|>``) is the tokens, while the same text typed, or in a /read file, is plain text
    (:meth:`ChatTokenizer.encode_plain`): typing ``<|im_start|>`` does not start a turn. The /read files'
    separator token (``<|file_sep|>``, :func:`file_separator`) is the token. A line answered on its own
    (``alone``) gets the BOS in front where the tokenizer adds one, as llama-completion's first prompt, tokenized
    with ``add_special``; a line that goes on a transcript (``alone`` False, :class:`Transcript`) gets none, as
    llama-completion tokenizes each interactive line with ``add_special`` false. ``bos`` (--in-prefix-bos: the
    vocabulary's BOS, ``llama_vocab_bos``) goes in front instead, also where the tokenizer adds none, as
    llama-completion pushes it before the prefix's tokens (one BOS, not two, where the tokenizer adds the same).
    The plain text between two special tokens is tokenized as one text (llama-completion
    tokenizes prefix, line and suffix apart; where no special token stands between them, this gives the ids the
    whole prompt's text has, as ``-p`` gives them).

    With a chat template the line is the user's content, rendered into the template and the rendering read with
    its special tokens, as llama-completion's conversation mode (``format_chat`` true) and llama-cli's chat
    (common_chat templates) tokenize it: there typed special-token text is the special tokens, and so it is in
    ``edgesdk run`` without --raw (:meth:`ChatTokenizer.prompt_ids`, runtime/conversation.py)."""
    from edgesdk.runtime.text import check_utf8

    check_utf8(prompt, "the prompt")
    pieces: list[str | int] = [*_special_pieces(tokenizer, prompt.prefix)]
    separator = file_separator(tokenizer)
    for text in prompt.files:
        if separator is not None and text.startswith(separator):
            pieces += [tokenizer.token_id(separator), text[len(separator):]]
        else:
            pieces.append(text)
    pieces += [prompt.typed, *_special_pieces(tokenizer, prompt.suffix)]
    if bos is None and alone:
        bos = tokenizer.added_bos()
    ids, plain = ([] if bos is None else [bos]), ""
    for piece in [*pieces, None]:
        if isinstance(piece, str):
            plain += piece
            continue
        if plain:
            ids += tokenizer.encode_plain(plain)
            plain = ""
        if piece is not None:
            ids.append(piece)
    return ids


def _special_pieces(tokenizer, text: str) -> list[str | int]:
    """``text`` (--in-prefix, --in-suffix) as the plain text and the special tokens' ids in it, in order, the
    special tokens found where the tokenizer finds them reading ``text`` with its special tokens. The tokens
    llama.cpp makes control tokens whatever the model marks them (:meth:`ChatTokenizer.control_ids`: Phi-3's
    ``<|end|>``, Qwen2.5-Coder's FIM tokens) are special tokens here too, as ``common_tokenize`` with
    ``parse_special`` reads them; :meth:`ChatTokenizer.encode_plain` would read their text as characters."""
    if not text:
        return []
    special = {int(token) for token, added in tokenizer.tokenizer.get_added_tokens_decoder().items() if added.special}
    special |= tokenizer.control_ids()
    encoding = tokenizer.tokenizer.encode(text, add_special_tokens=False)
    pieces: list[str | int] = []
    end = 0
    for token, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True):
        if token in special:
            pieces += [text[end:start], token]
            end = stop
    pieces.append(text[end:])
    return pieces


def file_separator(tokenizer) -> str | None:
    """The text of the model's FIM_SEP token (llama.cpp's, found by its text: :mod:`edgesdk.runtime.fim`), None
    where its vocabulary has none or ``tokenizer`` is no ChatTokenizer."""
    fim_tokens = getattr(tokenizer, "fim_tokens", None)
    separator = fim_tokens().sep if fim_tokens is not None else None
    return None if separator is None else tokenizer.tokenizer.id_to_token(separator)


# llama.cpp's escapes of one character after the backslash (common.cpp string_process_escapes)
SIMPLE_ESCAPES = {"n": b"\n", "r": b"\r", "t": b"\t", "'": b"'", '"': b'"', "\\": b"\\"}
CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: a terminal acts on them


def process_escapes(text: str, hint: str) -> str:
    """``text`` with llama.cpp's escape sequences processed, as llama-cli does to its prompt, --in-prefix, --in-suffix and
    --reverse-prompt (common.cpp ``string_process_escapes``, on by default with -e): \\n, \\r, \\t, \\', \\",
    \\\\ and \\xHH (a byte); any other backslash, and one at the end, stays as it is. A text that was not UTF-8
    to begin with (bytes Python holds as lone surrogates) comes back as it is, for the caller's own check to name.
    Escapes that give bytes that are not UTF-8 are refused naming the line of ``text`` that has them (an escape
    never spans a line break) cut to 80 characters, and --no-escape: quoting the whole text dumped a -f file."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text
    try:
        return _unescaped(text).decode("utf-8")
    except UnicodeDecodeError as exc:
        lines, number, line, error = text.split("\n"), 1, text, exc
        for index, piece in enumerate(lines, 1):  # a line alone fails where the whole text does: its bytes do
            try:
                _unescaped(piece).decode("utf-8")
            except UnicodeDecodeError as piece_error:
                number, line, error = index, piece, piece_error
                break
        # a CRLF file's '\r' (and any control character) shown escaped: written raw, the terminal went back over it
        line = CONTROL_CHARACTER.sub(lambda char: repr(char[0])[1:-1], line.removesuffix("\r"))
        shown = f"'{line}'" if len(line) <= 80 else f"'{line[:77]}...'"
        subject = shown if len(lines) == 1 else f"line {number} ({shown})"
        raise click.BadParameter(f"{subject} gives bytes that are not UTF-8 once its escapes are processed "
                                 f"({error.reason} at byte {error.start}); "
                                 "pass --no-escape to take its backslashes as written, or write a character as "
                                 "itself, or all its bytes as \\xHH escapes (\\xc3\\xa9 for é)",
                                 param_hint=hint) from exc


def _unescaped(text: str) -> bytearray:
    """The bytes of ``text`` with llama.cpp's escapes processed (:func:`process_escapes`)."""
    out, index = bytearray(), 0
    while index < len(text):
        char = text[index]
        following = text[index + 1] if index + 1 < len(text) else ""
        if char == "\\" and following in SIMPLE_ESCAPES:
            out += SIMPLE_ESCAPES[following]
            index += 2
        elif char == "\\" and following == "x" and re.fullmatch("[0-9a-fA-F]{2}", text[index + 2:index + 4]):
            out.append(int(text[index + 2:index + 4], 16))
            index += 4
        else:
            out += char.encode("utf-8", "surrogateescape")
            index += 1
    return out


class ReversePrompts:
    """``-r/--reverse-prompt``, llama-cli's reverse prompts, as a token constraint: it allows what the constraint
    it wraps allows (every token, without one) and is complete once the answer's text shown so far holds one of
    the texts, or its last token is one a text is tokenized to alone; generate then stops right after that
    token, the reverse prompt shown, as llama-cli hands control back once its output holds a reverse prompt.

    The text searched has the special tokens' text in it (``special_texts``: id -> text, e.g. ``<|im_start|>``),
    which the answer shown leaves out: llama-cli searches ``common_sampler_prev_str``, whose pieces are
    ``common_token_to_piece(ctx, id)`` with ``special = true``, so ``-r '<|im_start|>user'`` stops a raw answer where
    the model starts the next user turn."""

    def __init__(self, texts: tuple[str, ...], single_tokens: dict[int, str], inner,
                 special_texts: dict[int, str] | None = None):
        self.texts, self.single_tokens, self.inner = texts, single_tokens, inner  # single_tokens: id -> its text
        self.special_texts = special_texts or {}  # special tokens' ids -> their text, left out of the answer shown
        self.tail_length = max(map(len, texts)) - 1  # the shown text's end a reverse prompt can begin in
        self.tail = ""
        self.found: str | None = None

    def allows(self, token_id: int) -> bool:
        return self.inner is None or self.inner.allows(token_id)

    def advance(self, token_id: int) -> None:
        if self.inner is not None:
            self.inner.advance(token_id)

    @property
    def complete(self) -> bool:
        return self.found is not None or (self.inner is not None and self.inner.complete)

    def shown(self, token: int, piece: str) -> None:
        # The text before the tail held no reverse prompt, or the answer would have stopped there.
        window = self.tail + piece + self.special_texts.get(token, "")
        self.found = self.single_tokens.get(token) or next((text for text in self.texts if text in window), None)
        self.tail = window[-self.tail_length:] if self.tail_length else ""


def stdin_keeps_bytes_not_utf8() -> None:
    """Bytes on stdin that are not UTF-8 reach the prompt check as lone surrogates, which it refuses by name,
    instead of failing in the read: under a UTF-8 locale other than C.UTF-8 (en_GB.UTF-8 on Raspberry Pi OS)
    Python decodes stdin strictly."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdin, "errors", None) == "strict":
        reconfigure(errors="surrogateescape")


# The most bytes of a line a Linux terminal holds in canonical mode, the mode a shell leaves it in (the kernel's
# N_TTY_BUF_SIZE, 4096, less one for the line break): what is typed or pasted past them is dropped, silently, by the
# terminal itself, mid-character too.
TERMINAL_LINE_BYTES = 4095


def cut_by_the_terminal(line: str) -> bool:
    """Whether ``line`` (as ``sys.stdin.readline`` gave it) came from a Linux terminal in canonical mode and filled
    its line (:data:`TERMINAL_LINE_BYTES`), so that the terminal dropped what was typed or pasted after it.
    llama-cli's console reads a terminal in non-canonical mode (common/console.cpp ``init`` clears ICANON and ECHO
    and reads character by character), so a long line pasted there arrives whole; here it would arrive cut short.
    Piped input, and a terminal in non-canonical mode (``stty -icanon``), have no such limit."""
    try:
        size = len(line.rstrip("\r\n").encode(sys.stdin.encoding or "utf-8", "surrogateescape"))
    except (UnicodeEncodeError, LookupError):
        size = len(line.rstrip("\r\n").encode("utf-8", "surrogateescape"))
    if size < TERMINAL_LINE_BYTES or not sys.platform.startswith("linux"):
        return False
    try:
        import termios
    except ImportError:
        return False
    try:
        return sys.stdin.isatty() and bool(termios.tcgetattr(sys.stdin.fileno())[3] & termios.ICANON)
    except (OSError, ValueError, AttributeError, termios.error):  # no file descriptor (a StringIO), or no terminal
        return False


def read_prompt(multiline: bool = False) -> str | None:
    """The next prompt on stdin, None at its end, read as llama.cpp's console reads one (common/console.cpp
    ``readline``, line by line as its simple I/O does; tools/cli/cli.cpp and tools/main/main.cpp alike): a line
    that ends in '\\' goes on with the next one, the backslash left out and the line break kept; a line that ends
    in '/' ends the prompt there, the '/' left out ("return control without starting a new line"). With
    ``multiline`` (``--multiline-input``) a line goes on with the next one by itself, and ending it in '\\' ends
    the prompt instead. The end of input ends the prompt with the lines read so far. The prompt's last line break
    is left out, as both tools pop it.

    A line the terminal cut short (:func:`cut_by_the_terminal`: more than 4095 bytes typed or pasted at a Linux
    terminal) is refused, its prompt unanswered, rather than answered without its end."""
    buffer, more = "", True
    while more:
        line = sys.stdin.readline()
        if not line:
            if not buffer:
                return None
            break
        if cut_by_the_terminal(line):
            raise EdgeSDKError(f"the line typed at the terminal filled the terminal's line ({TERMINAL_LINE_BYTES:,} "
                               "bytes), and the terminal dropped what came after them: the prompt is not answered",
                               "put long text in a file and type /read FILE before your question, or pipe it in "
                               "(edgesdk run BUNDLE < FILE); a prompt can also go on over lines that end in '\\'")
        line, more = line.rstrip("\r\n"), multiline
        if line.endswith("/"):  # always ends the prompt, without a line break
            buffer += line[:-1]
            break
        if line.endswith("\\"):  # turns the line's own action around
            line, more = line[:-1], not multiline
        buffer += line + "\n"
    return buffer[:-1] if buffer.endswith("\n") else buffer


class DeferredInterrupt:
    """Within the block a SIGINT takes effect (KeyboardInterrupt) when the block ends rather than inside it; a
    second one raises it at once, so a write to a stalled terminal can still be stopped. Outside the main
    thread, where no handler can be set, the block runs as it is."""

    def __enter__(self):
        import signal
        import threading

        self.interrupted, self.previous = False, None
        # only over Python's own handler: a SIGINT the process was started ignoring stays ignored
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True

    def __exit__(self, *exc) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        if self.interrupted and exc[0] is None:
            raise KeyboardInterrupt


def answer_ended(thermal) -> None:
    """An answer that ended early (Ctrl-C, or an error the session goes on after): the idle board gets its clock
    back and the status line shows the prompt, as after an answer that ends normally."""
    if thermal is not None:
        thermal.hook.end(None)
        if thermal.hook.status is not None:
            thermal.hook.status.between_answers()


class Transcript:
    """The history of a plain-text interactive session (--raw, -no-cnv or a bundle without a chat template, with
    --history: -i, -if or a terminal), as llama-completion keeps it (tools/main/main.cpp, now
    tools/completion/completion.cpp): one token sequence, ``embd_inp``, that each prompt's tokens and each answer's
    tokens go on, so that a typed line continues the text before it (the classic ``-no-cnv -i -p TRANSCRIPT -r
    'User:'`` chat) rather than being answered on its own. The answer's tokens are kept as they were generated, not
    re-tokenized from its text, so the next prompt begins with exactly the tokens the KV cache holds and only its
    new tokens are prefilled. An answer that ended at an end-of-generation token keeps that token, and with -r the
    first reverse prompt's tokens after it, as llama-completion feeds both before the next line.

    It answers to what :class:`Chat` and the run's Answerer ask of a chat's
    :class:`~edgesdk.runtime.conversation.Conversation`: ``prompt_ids``, ``answered``, ``take_last`` (/regen),
    ``clear`` (/clear), ``exchanges`` and ``dropped``. As there, where the transcript and room for the answer
    outgrow the context, its oldest exchanges are left out, the ``start`` (the BOS the tokenizer puts in front)
    staying as the system message stays, and with it the first ``keep`` tokens of the first prompt where that was
    --prompt / --file (-1: all of them), as llama-completion's context shift keeps ``n_keep`` tokens of its initial
    prompt (``params.n_keep += add_bos``; the whole prompt where it is -1 or more than the prompt has)."""

    def __init__(self, turn_ids, start: list[int], max_context: int, answer_room: int,
                 after_end: list[int] | None = None, keep: int = 0):
        self.turn_ids = turn_ids  # a prompt's own tokens, without the BOS that ``start`` holds
        self.start = list(start)
        self.keep = keep  # --keep: the first prompt's tokens that stay when its exchange is left out (-1: all)
        self.first: tuple[str, list[int], list[int]] | None = None  # the --prompt / --file exchange, where any
        # Room kept for the answer: at most half the context, as the Conversation keeps it
        self.max_context, self.answer_room = max_context, min(answer_room, max_context // 2)
        self.after_end = list(after_end or [])  # -r's first reverse prompt's tokens, fed after an end token
        self.exchanges: list[tuple[str, list[int], list[int]]] = []  # (prompt, its tokens, the answer's tokens)
        self.dropped = 0  # exchanges left out so far to fit the context

    def _ids(self, exchanges: list[tuple[str, list[int], list[int]]], text: str, turn: list[int]) -> list[int]:
        ids = list(self.start)
        if self._first_left_out(exchanges, text):
            ids += self._kept_of_first()
        for _, prompt, answer in exchanges:
            ids += prompt + answer
        return ids + turn

    def prompt_ids(self, text: str) -> list[int]:
        """The transcript's tokens with ``text``'s after them. The oldest exchanges are dropped (for good) while
        they and ``answer_room`` tokens do not fit the context; a prompt too long on its own is left to
        generation, which refuses it by name, and then drops nothing."""
        turn = self.turn_ids(text)
        return fit_to_context(self, lambda kept: self._ids(kept, text, turn))

    def answered(self, text: str, answer_ids: list[int], end_token: int | None = None) -> None:
        """Record an exchange: ``text`` and the tokens generated for it (an answer cut short keeps those it had),
        then the end-of-generation token it stopped at, if any, and the reverse prompt's tokens after that."""
        ending = [] if end_token is None else [int(end_token), *self.after_end]
        exchange = (text, self.turn_ids(text), [*map(int, answer_ids), *ending])
        if not isinstance(text, TypedPrompt):  # --prompt / --file (or its /regen): llama-completion's initial prompt
            self.first = exchange
        self.exchanges.append(exchange)

    def _first_left_out(self, kept: list[tuple[str, list[int], list[int]]], text: str) -> bool:
        """Whether the --prompt / --file exchange is left out of the prompt to ``text`` (a line read from stdin;
        --prompt / --file itself, answered again by /regen, is its own first prompt)."""
        return self.first is not None and isinstance(text, TypedPrompt) and \
            not any(exchange is self.first for exchange in kept)

    def _kept_of_first(self) -> list[int]:
        """The first ``keep`` tokens of the --prompt / --file prompt (all of them where ``keep`` is -1)."""
        prompt = self.first[1]
        return list(prompt if self.keep < 0 else prompt[:self.keep])

    def take_last(self) -> str | None:
        """Drop the last exchange and return its prompt, to be answered again (/regen); None when there is none."""
        return self.exchanges.pop()[0] if self.exchanges else None

    def clear(self) -> None:
        """/clear: the exchanges go; the start and the first prompt's --keep tokens stay, as the system message."""
        self.exchanges = []


class AnswerNotWritten(EdgeSDKError):
    """stdout refused the answer's text (a full disk under ``> answer.txt``, /dev/full, a terminal that hung up:
    EIO): the session ends there, at a terminal too, as no later answer can be shown (:func:`write_answer`)."""


def write_answer(text: str) -> None:
    """``text`` of an answer written to stdout and flushed. A reader that went away (BrokenPipeError) is left to the
    command line's quiet exit 141, as SIGPIPE ends llama-cli; any other failed write ended the run in an OSError
    traceback: told as :class:`AnswerNotWritten`, naming stdout and why."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        full = disk_full(exc)
        raise AnswerNotWritten(f"cannot write the answer to stdout: {exc.strerror or exc}",
                               "free space on the disk that holds the file stdout is redirected to, or redirect it "
                               "to a file on another disk" if full else "redirect stdout to a file (> answer.txt), "
                               "or run it at a terminal that is still open") from exc


class _SessionEnds(Exception):
    """/exit, or the end of stdin (Ctrl-D at a terminal)."""


class Chat:
    """``edgesdk run`` without --prompt or --file: each line on stdin a prompt (:func:`read_prompt`), answered by
    ``answerer`` (cli_run.Answerer), until /exit or the end of input. At a terminal (``interactive``) a '> '
    prompt is shown, an error ends the line rather than the session, and Ctrl-C stops the answer being written;
    at the prompt it ends the session: a chat as llama-cli's tools/cli/cli.cpp ends it (its loop breaks, exit 0),
    a plain-text session (the prompt is its text, ``show_affixes``: --raw, -no-cnv or a bundle without a chat
    template) as llama-completion ends it (``sigint_handler`` outside an answer: ``_exit(130)``), the
    KeyboardInterrupt left to the command line, which exits 130. Piped input ends at the first error or Ctrl-C, as
    a script expects."""

    def __init__(self, answerer, thermal, *, interactive: bool, in_prefix: str, in_suffix: str, show_affixes: bool,
                 multiline: bool = False, single_turn: bool = False):
        self.answerer, self.thermal, self.interactive = answerer, thermal, interactive
        self.single_turn = single_turn  # -st (llama-cli's --single-turn): the session ends after one answer
        self.multiline = multiline  # --multiline-input (llama-cli's -mli): a prompt ends at a line ending in '\\'
        self.in_prefix, self.in_suffix = in_prefix, in_suffix  # --in-prefix / --in-suffix, escapes processed
        self.show_affixes = show_affixes  # printed around the input (the prompt is its text: --raw, no template)
        self.read_files: list[str] = []  # /read FILE: text that goes before the next prompt
        self.regenerated = 0  # /regen in a row: the answer's draw (a --seed moves on by as many)
        # /regen's conversation as it was before its last exchange was taken back, to give back where the new
        # answer fails before it shows anything: (exchanges, dropped, regenerated), or None
        self.taken_back: tuple[list, int, int] | None = None

    def run(self) -> None:
        stdin_keeps_bytes_not_utf8()
        while True:
            try:  # a Ctrl-C while reading ends the session, one in the answer stops that answer
                turn = self._next_turn()
            except _SessionEnds:
                return
            except EdgeSDKError as exc:
                if not self.interactive:
                    raise
                self._tell_error(exc)
                continue
            except KeyboardInterrupt:
                if not self.interactive or self.show_affixes:  # llama-completion's plain text: exit 130
                    raise
                click.echo("", err=True)  # Ctrl-C at the prompt ends the chat, as llama-cli's loop breaks
                return
            if turn is None:
                continue
            taken_back, self.taken_back = self.taken_back, None
            try:
                self.answerer.answer(*turn)
            except EdgeSDKError as exc:
                if taken_back is not None:
                    self._give_back(taken_back)
                if not self.interactive or isinstance(exc, AnswerNotWritten):
                    raise
                self._tell_error(exc)
            except KeyboardInterrupt:
                if not self.interactive:
                    raise
                self._answer_stopped()
            if self.single_turn:
                return

    def answer_first(self, prompt: str) -> None:
        """The answer to --prompt / --file where the chat goes on reading stdin after it (-i, -cnv): at a terminal
        a Ctrl-C stops that answer and the chat goes on, as llama-completion's ``sigint_handler`` hands control back
        to the user while ``params.interactive`` (it exits 130 only at the prompt); an error ends the session."""
        try:
            self.answerer.answer(prompt)
        except KeyboardInterrupt:
            if not self.interactive:
                raise
            self._answer_stopped()

    def _answer_stopped(self) -> None:
        """A Ctrl-C in an answer at a terminal: as in llama.cpp's interactive mode it stops the answer, not the
        session. --stats prints the stopped answer's figures (``stop: interrupted``) before the next prompt, as llama.cpp
        prints its timings where Ctrl-C stops it."""
        write_answer("\n")
        answer_ended(self.thermal)
        say_stats = getattr(self.answerer, "say_stopped_stats", None)  # cli_run.Answerer's
        if say_stats is not None:
            say_stats()
        if not self.single_turn:
            click.echo("edgesdk: answer stopped; Ctrl-C at the prompt or Ctrl-D ends the session", err=True)

    def _next_turn(self) -> tuple[str, int] | None:
        """Read a line and act on it: the prompt to answer and its /regen count, or None where the line was empty
        or a command that answers nothing. Raises _SessionEnds at /exit and at the end of input."""
        if self.interactive:
            click.echo("> " + (self.in_prefix if self.show_affixes else ""), nl=False, err=True)
        text = read_prompt(self.multiline)
        if text is None:
            if self.interactive:  # Ctrl-D at the prompt: the shell's prompt starts on a line of its own
                click.echo("", err=True)
            raise _SessionEnds
        if not text:  # an empty line: in a plain-text transcript the answer goes on, else nothing happens
            goes_on = self._goes_on()
            return None if goes_on is None else (goes_on, 0)
        command = text.strip()
        if not command:
            return None
        if command == "/exit":
            raise _SessionEnds
        if command == "/clear":
            self._clear()
            return None
        if command == "/regen":
            return self._regen()
        if command == "/read" or command.startswith("/read "):
            separator = file_separator(getattr(self.answerer, "tokenizer", None))
            self.read_files.append(read_for_prompt(command[len("/read"):].strip(), separator))
            return None
        return self._prompt(text), 0

    def _clear(self) -> None:
        conversation = self.answerer.conversation
        if conversation is None:
            click.echo("edgesdk: /clear does nothing: each line is answered on its own (there is no conversation "
                       "with --no-history, or for piped input without --history, -cnv or -i)", err=True)
            return
        conversation.clear()
        self.answerer.forget_fed()  # the next turn's --verbose-prompt counts it whole, as a first turn's
        click.echo("edgesdk: conversation cleared", err=True)

    def _regen(self) -> tuple[str, int] | None:
        """/regen: the last exchange taken back (llama-cli's tools/cli/cli.cpp erases the last message and
        generates it again), the conversation before it kept aside for :meth:`_give_back`."""
        conversation = self.answerer.conversation
        before = None if conversation is None else (list(conversation.exchanges), conversation.dropped,
                                                    self.regenerated)
        again = self.answerer.take_back_last()
        if again is None:
            click.echo("edgesdk: /regen does nothing: there is no answer yet to generate again", err=True)
            return None
        self.taken_back = before
        self.regenerated += 1
        return again, self.regenerated

    def _give_back(self, before: tuple[list, int, int]) -> None:
        """A /regen whose answer failed (an error) before it showed anything, so that the conversation recorded
        no exchange for it: the conversation is given back as it was before /regen, its last exchange and answer
        included, and the next /regen makes the draw this one would have. (Where the answer showed something the
        conversation keeps that, as after any answer an error cuts short. llama-cli's tools/cli/cli.cpp, which
        erases the last answer before it generates again, keeps the failed answer's text in its place, an empty
        answer where it showed nothing: the exchange the user asked to regenerate is lost.)"""
        conversation = self.answerer.conversation
        exchanges, dropped, regenerated = before
        # taken back: one exchange; left out to fit the context meanwhile: conversation.dropped - dropped
        recorded = len(conversation.exchanges) + conversation.dropped - dropped > len(exchanges) - 1
        if not recorded:
            conversation.exchanges, conversation.dropped, self.regenerated = exchanges, dropped, regenerated

    def _goes_on(self) -> TypedPrompt | None:
        """An empty line in a plain-text transcript (:class:`Transcript`) that holds an answer: the model goes on
        from where the text stands, nothing added but the /read files (and --in-prefix-bos's BOS; no --in-prefix or
        --in-suffix), as llama-completion's interactive mode passes control back to the model at an empty line.
        None elsewhere: an empty line answers nothing."""
        transcript = getattr(self.answerer, "conversation", None)
        if not isinstance(transcript, Transcript) or not transcript.exchanges:
            return None
        prompt = TypedPrompt("", tuple(self.read_files), "", "")
        self.read_files.clear()
        self.regenerated = 0
        return prompt

    def _prompt(self, text: str) -> TypedPrompt:
        """The line as it is answered: --in-prefix, the /read files, the line, --in-suffix (the suffix shown after
        the input where the prefix was shown before it, as llama-cli's tools/main/main.cpp prints them); its parts
        kept apart, for the typed text to be plain text where no chat template formats it
        (:func:`typed_prompt_ids`)."""
        if self.show_affixes and self.in_suffix:
            click.echo(self.in_suffix, nl=False, err=True)
        prompt = TypedPrompt(self.in_prefix, tuple(self.read_files), text, self.in_suffix)
        self.read_files.clear()
        self.regenerated = 0
        return prompt

    def _tell_error(self, exc: EdgeSDKError) -> None:
        """An error in an interactive session: one bad line does not end it."""
        answer_ended(self.thermal)
        click.echo(f"error: {exc}", err=True)
