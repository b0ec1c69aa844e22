"""Accuracy tasks scored as llama.cpp's ``llama-perplexity`` scores them: HellaSwag (``--hellaswag``), Winogrande
(``--winogrande``) and multiple choice (``--multiple-choice``: ARC, MMLU, TruthfulQA, HellaSwag in its binary
format), from the same task files, through the bundle's runtime or the PyTorch source model.

The rules follow ``hellaswag_score``, ``load_winogrande_from_csv``/``winogrande_score`` and
``multiple_choice_prepare_one_task``/``multiple_choice_score`` in tools/perplexity/perplexity.cpp:

- every text is tokenized whole, as ``common_tokenize(ctx, text, true)`` does, BOS in front where the tokenizer
  adds one, special tokens' text (``<|endoftext|>``) read as plain text (``parse_special`` false): HellaSwag
  ``context + " " + ending``, multiple choice ``question + " " + answer``, Winogrande the sentence with the
  blank ``_`` replaced by each choice;
- the common prefix is the run of leading tokens all of a task's sequences share; an ending's score is the mean
  log-probability of its tokens past that prefix (the first one predicted from the prefix's last token), the sum
  divided by their count: llama.cpp's ``acc_norm`` normalisation. Where one ending's tokens all lead the others'
  (the answers "1", "10" and "100" with a tokenizer that splits digits, as SmolLM2's), the prefix stops one
  token short of that ending's end, so that its last token is scored too, where llama.cpp's prefix runs to its
  end and llama.cpp reads the token past it, out of its vector's bounds; a task whose endings are all the same
  tokens is refused;
- Winogrande scores the words after the blank rather than the choice: when both sequences have more than 3 tokens
  past the common prefix (``k_min_trailing_ctx``), the tokens after ``first + choice`` (``n_base1``/``n_base2``),
  else those after the common prefix; either way the last token is left out where more than one would be
  scored. Each token is predicted from its own sequence's preceding tokens; llama.cpp's code marks with a FIXME
  that, when it scores from the common prefix, the second choice's first token is read from the wrong logits;
  that slip is not copied;
- the pick is the ending with the highest score, the first of equal ones (llama.cpp compares with ``>``); a
  HellaSwag or multiple-choice task is right when the gold ending (multiple choice: an ``mc1`` answer labelled 1)
  is picked, a Winogrande task when ``score_1 > score_2`` picks choice 1 and the answer is 1, or else the answer
  is 2; a task with a score of NaN (the model's logits NaN, as a float16 engine's overflow leaves them) is refused,
  naming it, where llama.cpp's ``>`` would pick its first ending (Winogrande: its second choice) whatever the model
  gave;
- task selection: HellaSwag scores ``min(count, tasks)`` tasks (``--hellaswag-tasks``, 400 by default) in
  llama.cpp's random order, drawn with ``std::mt19937 rng(1)`` and libstdc++'s
  ``std::uniform_int_distribution`` (Lemire's method; other C++ libraries draw other numbers), each drawn task
  removed from those left; Winogrande and multiple choice score every task in file order unless fewer are asked
  for, then ``count`` drawn as llama.cpp draws them (``int(scale * rng() * n)`` in float32 with
  ``scale = 2^-32``, swap-with-last removal);
- the figures: accuracy ``p`` over the tasks; HellaSwag prints it with the Wilson score 95 % interval, Winogrande
  and multiple choice with ``sqrt(p (1 - p) / (n - 1))``, multiple choice also the random-chance accuracy
  ``tasks / answers`` (llama.cpp prints Winogrande's final line only from 100 tasks on, multiple choice's always:
  its check for fewer than 100 drawn tasks compares the count with itself; here they are always given).

Each sequence is scored from an empty cache as its own window (llama.cpp packs a task's sequences into one batch
sharing the prefix's cache: the same logits). A task with a sequence longer than the scorer takes is refused,
naming it, before any scoring, and so, where a context is given as llama-perplexity's -c, is one whose sequences need
more tokens than it packed as llama.cpp packs them (the prefix they share once, ``required_tokens``), where llama.cpp
stops at it ("task %zu does not fit in the context window"); so is
a task with nothing to score (endings that are all the same tokens, a Winogrande choice with no token past the
common prefix), as llama.cpp's multiple_choice_score checks every task before it scores the first: a run over
thousands of tasks on a board is not lost at its last one.
"""

from __future__ import annotations

import math
import random
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesdk.errors import EdgeSDKError, utf8_fix
from edgesdk.runtime.logprobs import log_softmax

HELLASWAG, WINOGRANDE, MULTIPLE_CHOICE = "hellaswag", "winogrande", "multiple-choice"
TASK_KINDS = (HELLASWAG, WINOGRANDE, MULTIPLE_CHOICE)
HELLASWAG_DEFAULT_TASKS = 400  # common_params::hellaswag_tasks
HELLASWAG_ENDINGS = 4  # hellaswag_score: a task is its context, the gold ending's index and 4 endings
HELLASWAG_LINES = 2 + HELLASWAG_ENDINGS  # lines a task takes in hellaswag_val_full.txt
WINOGRANDE_MIN_TRAILING = 3  # k_min_trailing_ctx in winogrande_score
MULTIPLE_CHOICE_MAX_ANSWERS = 100  # multiple_choice_answers::deserialize
Z_95 = 1.95996398454  # hellaswag_score's za


@dataclass(frozen=True)
class ChoiceTask:
    """A context continued by one of several endings (HellaSwag, multiple choice)."""

    context: str
    endings: tuple[str, ...]
    labels: tuple[int, ...]  # 1 for an ending that counts as right (HellaSwag: the gold one)
    where: str  # the task's place in its file, for errors: "line 7", "task 3"


@dataclass(frozen=True)
class WinograndeTask:
    """A sentence split at its blank, the two choices that fill it and the right one (1 or 2)."""

    first: str
    second: str
    choices: tuple[str, str]
    answer: int
    where: str


@dataclass(frozen=True)
class AccuracyResult:
    """One accuracy task scored: the figures llama-perplexity prints, with the pick and scores of every task."""

    task: str  # HELLASWAG, WINOGRANDE or MULTIPLE_CHOICE
    tasks: int
    correct: int
    accuracy: float  # fraction of tasks right (llama.cpp prints it x 100)
    uncertainty: float | None  # sqrt(p (1 - p) / (n - 1)); None for one task
    interval: tuple[float, float]  # Wilson score 95 % interval of the accuracy (hellaswag_score's)
    random_chance: float  # accuracy of a uniform guess: tasks / endings offered
    picks: tuple[int, ...]  # the ending picked for each task, 0-based, in scored order
    scores: tuple[tuple[float, ...], ...]  # each ending's mean token log-probability, per task

    def to_json(self) -> dict:
        """The figures (not the picks and scores) as JSON, rounded to 6 decimals."""

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 6)

        return {"task": self.task, "tasks": self.tasks, "correct": self.correct, "accuracy": rounded(self.accuracy),
                "accuracy_uncertainty": rounded(self.uncertainty),
                "interval_95": [rounded(bound) for bound in self.interval],
                "random_chance": rounded(self.random_chance)}

    def summary(self) -> str:
        """The figure llama-perplexity prints at the end, in percent: HellaSwag's last ``acc_norm`` row with its
        95 % interval, Winogrande's and multiple choice's accuracy +/- its uncertainty (multiple choice with the
        random chance)."""
        count = f"{self.tasks} task{'s' if self.tasks != 1 else ''}"
        if self.task == HELLASWAG:
            low, high = self.interval
            return (f"acc_norm {100 * self.accuracy:.4f} % [{100 * low:.4f} %, {100 * high:.4f} %] "
                    f"({count}, 95 % interval)")
        spread = "" if self.uncertainty is None else f" ± {100 * self.uncertainty:.4f}"
        chance = f", random chance {100 * self.random_chance:.4f} %" if self.task == MULTIPLE_CHOICE else ""
        return f"{100 * self.accuracy:.4f}{spread} % ({count}{chance})"

    def llama_lines(self) -> list[str]:
        """The figure in llama-perplexity's own words and formats (tools/perplexity/perplexity.cpp), which scripts
        read from its output: HellaSwag's last task row (it prints no final line), "Final Winogrande score(N tasks):
        X +/- Y", multiple choice's "Final result: X +/- Y" and "Random chance: X +/- Y". Said whatever the task
        count: llama-perplexity leaves its final lines out below 100 tasks, and a script would then read nothing."""
        n, p = self.tasks, 100 * self.accuracy
        spread = "nan" if self.uncertainty is None else f"{100 * self.uncertainty:.4f}"
        if self.task == HELLASWAG:
            low, high = self.interval
            return [f"{n}\t{p:3.8f}%\t[{100 * low:3.4f}%, {100 * high:3.4f}%]"]
        if self.task == WINOGRANDE:
            return [f"Final Winogrande score({n} tasks): {p:.4f} +/- {spread}"]
        chance = self.random_chance
        chance_spread = "nan" if n < 2 else f"{100 * math.sqrt(chance * (1 - chance) / (n - 1)):.4f}"
        return [f"Final result: {p:.4f} +/- {spread}", f"Random chance: {100 * chance:.4f} +/- {chance_spread}"]


def agreement(a: AccuracyResult, b: AccuracyResult) -> float:
    """The fraction of tasks on which two runs over the same tasks (bundle and reference) pick the same ending."""
    if a.task != b.task or a.tasks != b.tasks:
        raise EdgeSDKError(f"cannot compare {a.task} over {a.tasks} tasks with {b.task} over {b.tasks}",
                           "score the same task file with the same task count for both")
    return sum(x == y for x, y in zip(a.picks, b.picks, strict=True)) / a.tasks


# ------------------------------------------------------------------------------------------------ files


def _prompt_lines(text: str) -> list[str]:
    """The lines ``std::getline`` gives of ``text`` as ``-f`` reads it (one trailing newline dropped): the
    ``prompt_lines`` that hellaswag_score and load_winogrande_from_csv read."""
    text = text[:-1] if text.endswith("\n") else text
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def parse_hellaswag(text: str, source: str = "the HellaSwag file") -> list[ChoiceTask]:
    """llama.cpp's HellaSwag file (hellaswag_val_full.txt): 6 lines a task, the context (``activity_label + ": "
    + ctx``), the gold ending's index 0-3, then the 4 endings. Lines are kept as they are (a CR stays)."""
    lines = _prompt_lines(text)
    fix = ("pass llama.cpp's HellaSwag file (hellaswag_val_full.txt): 6 lines a task, the context, the gold "
           "ending 0-3, the 4 endings")
    whole, left_over = divmod(len(lines), HELLASWAG_LINES)
    tasks = []
    for start in range(0, whole * HELLASWAG_LINES, HELLASWAG_LINES):
        label = lines[start + 1].strip()
        if label not in ("0", "1", "2", "3"):
            raise EdgeSDKError(f"{source}, line {start + 2}: the gold ending of the task starting on line "
                               f"{start + 1} must be 0, 1, 2 or 3, got {lines[start + 1]!r}", fix)
        tasks.append(ChoiceTask(lines[start], tuple(lines[start + 2:start + HELLASWAG_LINES]),
                                tuple(int(i == int(label)) for i in range(HELLASWAG_ENDINGS)), f"line {start + 1}"))
    if left_over:
        raise EdgeSDKError(f"{source} has {len(lines)} lines, not a multiple of 6: the last task, from line "
                           f"{whole * HELLASWAG_LINES + 1}, has {left_over} of its 6 lines", fix)
    if not tasks:
        raise EdgeSDKError(f"{source} holds no task", fix)
    return tasks


_CSV_ANSWER = re.compile(r"\s*[+-]?\d+")  # what ``std::istringstream >> int`` reads


def parse_winogrande(text: str, source: str = "the Winogrande file") -> list[WinograndeTask]:
    """llama.cpp's Winogrande CSV (winogrande-debiased-eval.csv): ``index,sentence,choice1,choice2,answer``, the
    sentence in double quotes where it holds a comma, a ``_`` where a choice goes, the answer 1 or 2.

    Fields are cut as ``load_winogrande_from_csv`` cuts them: at the first 4 commas outside double quotes, a quoted
    sentence losing its first and last character, the choices taken as they are. A first line that is a header
    (its answer field not a number, no ``_`` in its sentence field) and blank lines are passed over; any other
    line llama.cpp would drop is refused, naming it. Every line is read, the last one too, where llama.cpp stops
    before a last line that no newline ends: as its ``-f`` drops one trailing newline, that is the last row of a
    file ending in a single newline or in none (such a file gives llama-perplexity one task fewer, and a subset
    of ``count`` drawn from one task fewer).
    """
    fix = ("pass llama.cpp's Winogrande CSV (winogrande-debiased-eval.csv): index,sentence,choice1,choice2,answer "
           "with a _ in the sentence and the answer 1 or 2")
    tasks = []
    for number, line in enumerate(_prompt_lines(text), 1):
        if not line.strip():
            continue
        commas, quoted = [], False
        for i, char in enumerate(line):
            if quoted:
                quoted = char != '"'
            elif char == ",":
                commas.append(i)
                if len(commas) == 4:
                    break
            elif char == '"':
                quoted = True
        if len(commas) != 4:
            raise EdgeSDKError(f"{source}, line {number}: found {len(commas)} of the 4 commas outside quotes that "
                               f"separate index,sentence,choice1,choice2,answer in {line!r}", fix)
        c0, c1, c2, c3 = commas
        sentence = line[c0 + 2:c1 - 1] if line[c0 + 1] == '"' else line[c0 + 1:c1]
        answer = _CSV_ANSWER.match(line[c3 + 1:])
        if answer is None and number == 1 and "_" not in sentence:
            continue  # the header row (index,sentence,option1,option2,answer); a task's row has its blank
        if answer is None or int(answer.group()) not in (1, 2):
            raise EdgeSDKError(f"{source}, line {number}: the answer (5th field) must be 1 or 2, got "
                               f"{line[c3 + 1:]!r}", fix)
        blank = sentence.find("_")
        if blank < 0:
            raise EdgeSDKError(f"{source}, line {number}: the sentence (2nd field) has no _ where a choice goes: "
                               f"{sentence!r}", fix)
        choices = (line[c1 + 1:c2], line[c2 + 1:c3])
        if choices[0] == choices[1]:
            raise EdgeSDKError(f"{source}, line {number}: the two choices are the same, {choices[0]!r}", fix)
        tasks.append(WinograndeTask(sentence[:blank], sentence[blank + 1:], choices, int(answer.group()),
                                    f"line {number}"))
    if not tasks:
        raise EdgeSDKError(f"{source} holds no task", fix)
    return tasks


class _Reader:
    """Little-endian reads from ``data`` at ``at`` that name the field and offset where the data runs out."""

    def __init__(self, data: bytes, source: str, at: int = 0):
        self.data, self.source, self.at = data, source, at

    def fail(self, what: str, at: int | None = None) -> EdgeSDKError:
        return EdgeSDKError(f"{self.source}: {what} (byte {self.at if at is None else at} of {len(self.data)})",
                            "pass a multiple-choice file in llama.cpp's binary format (e.g. arc-easy-validation.bin, "
                            "mmlu-validation.bin, truthful-qa-validation.bin from "
                            "huggingface.co/datasets/ikawrakow/validation-datasets-for-llama.cpp)")

    def uint32s(self, count: int, what: str) -> tuple[int, ...]:
        end = self.at + 4 * count
        if end > len(self.data):
            raise self.fail(f"the file ends inside {what}")
        values = struct.unpack_from(f"<{count}I", self.data, self.at)
        self.at = end
        return values

    def string(self, what: str) -> str:
        (size,) = self.uint32s(1, f"the length of {what}")
        if self.at + size > len(self.data):
            raise self.fail(f"{what} is {size} bytes long, past the end of the file")
        raw, start = self.data[self.at:self.at + size], self.at
        self.at += size
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8 ({exc.reason})", start + exc.start) from exc

    def answers(self, what: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """An answer list as ``multiple_choice_answers::deserialize`` reads it: the answers and their labels."""
        (count,) = self.uint32s(1, f"the answer count of {what}")
        if count > MULTIPLE_CHOICE_MAX_ANSWERS:
            raise self.fail(f"{what} has {count} answers; llama.cpp reads at most {MULTIPLE_CHOICE_MAX_ANSWERS}",
                            self.at - 4)
        answers = tuple(self.string(f"answer {i + 1} of {what}") for i in range(count))
        raw = self.uint32s(count, f"the labels of {what}")
        labels = tuple(struct.unpack("<i", struct.pack("<I", value))[0] for value in raw)  # int32 each
        return answers, labels


def read_multiple_choice(data: bytes, source: str = "the multiple-choice file",
                         count: int = 0) -> list[ChoiceTask]:
    """llama.cpp's binary multiple-choice file, the tasks ``multiple_choice_score`` scores: ``uint32`` task count
    n, n ``uint32`` byte offsets of the tasks, then each task: the question, the ``mc1`` answers (one right) and
    the ``mc2`` answers (read, not scored); an answer list is a ``uint32`` count (at most 100), the strings and
    an ``int32`` label each (1: right); a string is a ``uint32`` byte length and UTF-8 bytes. All in
    little-endian order.

    ``count`` 0 or at least n reads every task in order; fewer reads ``count`` tasks drawn as llama.cpp draws
    them, each from its recorded offset. A task with an empty question, no answer or an empty answer is refused
    (``multiple_choice_prepare_one_task``)."""
    reader = _Reader(data, source)
    (n_task,) = reader.uint32s(1, "the task count") if len(data) >= 4 else (0,)
    if n_task == 0:
        raise reader.fail("holds no task")
    offsets = reader.uint32s(n_task, f"the {n_task} task offsets")
    if count and count < n_task:
        chosen = [(index, offsets[index]) for index in random_subset(n_task, count)]
    else:
        chosen = [(index, None) for index in range(n_task)]
    tasks = []
    for index, offset in chosen:
        what = f"task {index + 1} of {n_task}"
        if offset is not None:
            if offset >= len(data):
                raise reader.fail(f"{what} is recorded at byte {offset}, past the end of the file", 4 + 4 * index)
            reader.at = offset
        question = reader.string(f"the question of {what}")
        answers, labels = reader.answers(f"the mc1 answers of {what}")
        reader.answers(f"the mc2 answers of {what}")
        if not question or not answers or not all(answers):
            empty = "question" if not question else "answer list" if not answers else \
                f"answer {[bool(a) for a in answers].index(False) + 1}"
            raise reader.fail(f"{what} has an empty {empty}; llama.cpp refuses such a task")
        tasks.append(ChoiceTask(question, answers, labels, f"task {index + 1}"))
    return tasks


def read_task_file(kind: str, path: Path, count: int | None = None) -> list[ChoiceTask] | list[WinograndeTask]:
    """The tasks ``kind`` scores from ``path``, selected as llama-perplexity selects them: HellaSwag
    ``min(count, tasks)`` (``count`` None: 400) in its random order, the others all in file order (``count`` None
    or 0, or at least the tasks llama-perplexity reads; Winogrande: ``count`` equal to the rows it reads gives
    those ``count`` rows) or ``count`` drawn at random. The file is read as llama-perplexity's ``-f`` (text) or ``-bf`` (binary)
    reads it."""
    if kind not in TASK_KINDS:
        raise ValueError(f"kind must be one of {', '.join(TASK_KINDS)}, got {kind!r}")
    if count is not None and count < (1 if kind == HELLASWAG else 0):
        raise EdgeSDKError(f"--{kind}-tasks {count}: the number of tasks to score must be "
                           f"{'at least 1' if kind == HELLASWAG else '0 (all) or more'}",
                           f"pass --{kind}-tasks N with N >= 1")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EdgeSDKError(f"the {kind} file {path} cannot be read ({exc.strerror or exc})",
                           "pass a readable task file") from exc
    source = f"the {kind} file {path}"
    if kind == MULTIPLE_CHOICE:
        return read_multiple_choice(data, source, count or 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeSDKError(f"{source} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           utf8_fix(data, path)) from exc
    if kind == HELLASWAG:
        tasks = parse_hellaswag(text, source)
        return [tasks[i] for i in hellaswag_order(len(tasks), HELLASWAG_DEFAULT_TASKS if count is None else count)]
    tasks = parse_winogrande(text, source)
    # N tasks are drawn from the rows llama-perplexity reads, so that they are its N: it reads every row but a last
    # one that no newline ends after -f drops one trailing newline (parse_winogrande); all rows are scored where
    # all are asked (0, or N past those rows). N equal to the rows it reads is those rows in file order, as
    # winogrande_score draws only for N below its task count: N tasks, not the N + 1 of the whole file. 0 asks for all
    # of them, even where llama-perplexity reads none (a file of one row)
    seen = len(tasks) - winogrande_rows_llama_drops(text)
    if count and count < seen:
        return [tasks[i] for i in random_subset(seen, count)]
    return tasks[:seen] if count and count == seen else tasks


def winogrande_rows_llama_drops(text: str) -> int:
    """1 where llama-perplexity leaves out the last row of the Winogrande file ``text``, else 0: its ``-f`` drops one
    trailing newline and ``load_winogrande_from_csv`` stops before a last line that no newline then ends, so a file
    ending in a single newline, or in none, loses its last row (one ending in a blank line keeps it)."""
    text = text[:-1] if text.endswith("\n") else text
    return int(bool(text.rpartition("\n")[2].strip()))


# ------------------------------------------------------------------------------------------- selection


def _mt19937(seed: int) -> random.Random:
    """A generator whose ``getrandbits(32)`` gives ``std::mt19937(seed)()``'s numbers: CPython's Random is the same
    MT19937, given the state ``init_genrand`` (the C++ seeding) leaves."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        previous = state[-1]
        state.append((1812433253 * (previous ^ (previous >> 30)) + i) & 0xFFFFFFFF)
    rng = random.Random()
    rng.setstate((3, (*state, 624), None))
    return rng


def _uniform_below(rng: random.Random, n: int) -> int:
    """libstdc++'s ``std::uniform_int_distribution<size_t>(0, n - 1)(mt19937)``: Lemire's nearly divisionless
    method on one 32-bit draw (bits/uniform_int_dist.h, ``_S_nd``)."""
    product = rng.getrandbits(32) * n
    if product & 0xFFFFFFFF < n:
        threshold = (-n) % 2**32 % n
        while product & 0xFFFFFFFF < threshold:
            product = rng.getrandbits(32) * n
    return product >> 32


def hellaswag_order(total: int, count: int) -> list[int]:
    """The file indices of the tasks ``hellaswag_score`` scores, in its order: ``min(count, total)`` draws from
    ``std::mt19937 rng(1)``, each task drawn removed from those left."""
    rng, left = _mt19937(1), list(range(total))
    return [left.pop(_uniform_below(rng, len(left))) for _ in range(min(count, total))]


def random_subset(total: int, count: int) -> list[int]:
    """The file indices of the ``count`` tasks ``winogrande_score`` and ``multiple_choice_score`` draw from
    ``total``: ``j = int(scale * rng() * n)`` computed in float32 (``scale = 1 / (1 + 2^32 - 1)``), the task at
    ``aux[j]`` taken and replaced by the last one. A draw that float32 rounds up to n (llama.cpp then reads past
    its array) takes the last task."""
    rng, aux = _mt19937(1), list(range(total))
    scale = np.float32(1) / (np.float32(1) + np.float32(2**32 - 1))
    chosen = []
    for _ in range(min(count, total)):
        j = min(int(scale * np.float32(rng.getrandbits(32)) * np.float32(len(aux))), len(aux) - 1)
        chosen.append(aux[j])
        aux[j] = aux[-1]
        aux.pop()
    return chosen


# --------------------------------------------------------------------------------------------- scoring


def _sequence_logprobs(score_window, tokens: list[int], start: int, end: int | None = None) -> np.ndarray:
    """log P(tokens[p] | tokens[:p]) for p = start .. end - 1 (``end`` default: the whole sequence; start >= 1:
    nothing predicts the first token), from the logits of the whole sequence; the log-softmax is taken over
    those rows only."""
    end = len(tokens) if end is None else end
    logits = score_window(np.asarray(tokens, np.int64))
    rows = log_softmax(logits[start - 1:end - 1])
    return rows[np.arange(len(rows)), tokens[start:end]]


def _common_prefix(sequences: list[list[int]]) -> int:
    """How many leading tokens all ``sequences`` share (llama.cpp's ``n_base`` / common prefix length)."""
    shortest = min(len(s) for s in sequences)
    for k in range(shortest):
        if any(s[k] != sequences[0][k] for s in sequences[1:]):
            return k
    return shortest


def _first_max(values: list[float]) -> int:
    """The index of the highest value, the first of equal ones, as llama.cpp's ``>`` scan finds it."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def _ranked(kind: str, where: str, means: tuple[float, ...], noun: str = "ending") -> tuple[float, ...]:
    """``means``, the scores of a task's endings, after refusing a NaN among them: the model gave NaN logits, or a
    row of -inf for every token (no token possible: its log-softmax is NaN), as a float16 engine's overflow leaves
    them. A NaN compares false with everything, so the pick fell on the first ending (Winogrande: the second choice)
    whatever the model gave, and such a model scored the share of tasks whose answer is that one, 100 % on a file
    whose answers all are. A score of -inf (a token of probability 0) is a score, and ranks last."""
    bad = [i + 1 for i, mean in enumerate(means) if math.isnan(mean)]
    if bad:
        raise EdgeSDKError(f"{kind} task at {where}: the score of {noun} {bad[0]} of {len(means)} is NaN, as the model "
                           "gave NaN logits for it, or -inf for every token (a position where no token is possible), "
                           "so its endings cannot be ranked",
                           "check the model's logits with edgesdk eval --reference --kl-divergence (perplexity beside "
                           "the source model's); a float16 engine's overflow is gone with --backend ort-cpu")
    return means


class TaskTooLong(EdgeSDKError):
    """A task whose longest sequence (:func:`_longest_sequence`) is past the tokens the scorer takes, or
    (``packed``) whose sequences packed as llama-perplexity packs them (:func:`_required_tokens`) are past the
    context it is scored in: its kind (``name``), where it is in the file, the tokens it needs (``longest``) and the
    limit, for a caller that words the limit its own way (``eval --context``). ``positions``: the model's
    max_position_embeddings the bundle's manifest records (edgesdk.bundle.model_positions), which the fix names as
    the most a rebuild gives, or says the bundle is at; None: not recorded."""

    def __init__(self, name: str, where: str, longest: int, limit: int, packed: bool = False,
                 positions: int | None = None):
        from edgesdk.bundle import context_fix

        self.name, self.where, self.longest, self.limit, self.packed = name, where, longest, limit, packed
        if packed:
            super().__init__(f"{self.packed_need()}, more than the context of {limit}; llama-perplexity -c {limit} "
                             "stops at such a task too",
                             "score it in a larger context, or remove that task from the file")
            return
        super().__init__(f"{name} task at {where} needs {longest} tokens ({_longest_sequence(name)}), more than the "
                         f"{limit} the model takes (max_context); llama-perplexity stops at such a task too",
                         context_fix("remove that task from the file", limit, positions, longest,
                                     "rebuild the bundle with a larger --max-context, or remove that task from the "
                                     "file"))

    def packed_need(self) -> str:
        """What a ``packed`` task needs, in words a caller's refusal starts with."""
        return (f"{self.name} task at {self.where} needs {self.longest} tokens (the prefix its sequences share, BOS "
                "first where the model adds one, once, then each sequence's tokens past that prefix, as "
                "llama-perplexity packs a task)")


def _longest_sequence(name: str) -> str:
    """What the longest sequence of a task of kind ``name`` is made of, for a refusal: a Winogrande task has no
    context and endings, but a sentence whose blank each choice fills; BOS only where the model adds one."""
    made_of = "its sentence with its longer choice" if name == WINOGRANDE else "its context and longest ending"
    return f"BOS where the model adds one, {made_of}"


def _required_tokens(sequences: list[list[int]]) -> int:
    """llama.cpp's ``required_tokens`` of a task: the tokens its sequences take in one batch, the prefix they all
    share once (its cache shared by their sequence ids) and then each one's tokens past it. llama-perplexity scores a
    task only where these fit its context (``n_cur + required_tokens <= n_ctx``), else stops: "task %zu does not fit
    in the context window"."""
    prefix = _common_prefix(sequences)
    return prefix + sum(len(s) - prefix for s in sequences)


def _check_length(tasks_tokens: list[tuple[str, list[list[int]]]], score_window, max_tokens: int | None,
                  name: str, context: int | None = None) -> None:
    """Refuse, naming it, the first task with a sequence longer than the scorer takes: ``max_tokens``, else
    ``score_window.max_tokens`` where the scorer has one (none: no limit); or, where a ``context`` is given
    (llama-perplexity's -c), one whose sequences packed as llama-perplexity packs them need more tokens than it. The
    scorer's ``model_positions`` (the bundle's: :func:`bundle_accuracy`) go to the refusal's fix."""
    limit = max_tokens if max_tokens is not None else getattr(score_window, "max_tokens", None)
    for where, sequences in tasks_tokens:
        if context is not None and (needed := _required_tokens(sequences)) > context:
            raise TaskTooLong(name, where, needed, context, packed=True)
        longest = max(len(s) for s in sequences)
        if limit is not None and longest > limit:
            raise TaskTooLong(name, where, longest, limit, positions=getattr(score_window, "model_positions", None))


def _result(kind: str, correct: int, picks: list[int], scores: list[tuple[float, ...]], endings: int
            ) -> AccuracyResult:
    """The figures over the tasks scored: accuracy, its uncertainty ``sqrt(p (1 - p) / (n - 1))`` (winogrande_score,
    multiple_choice_score) and the Wilson score 95 % interval (hellaswag_score); ``endings`` counts the endings
    offered, for the random chance."""
    n = len(picks)
    p = correct / n
    uncertainty = math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else None
    z = Z_95 * Z_95 / n  # hellaswag_score's Wilson score interval
    spread = z * math.sqrt(n * (4 * p * (1 - p) + z)) / (2 * Z_95)
    interval = ((p + z / 2 - spread) / (1 + z), (p + z / 2 + spread) / (1 + z))
    return AccuracyResult(kind, n, correct, p, uncertainty, interval, n / endings, tuple(picks), tuple(scores))


def _choice_prefix(kind: str, task: ChoiceTask, where: str, sequences: list[list[int]]) -> int:
    """The tokens of a task's sequences that no ending's score counts: the prefix all share, stopped one token
    short of the shortest one's end (module docstring); a task whose endings cannot be told apart, or that leaves
    nothing to predict its endings' first token, is refused."""
    prefix = _common_prefix(sequences)
    if all(s == sequences[0] for s in sequences[1:]):
        same = "it has one ending" if len(sequences) == 1 else "its endings are all the same tokens"
        raise EdgeSDKError(f"{kind} task at {where}: ending 1 adds no token past the {prefix} all its endings "
                           f"share ({task.endings[0]!r}): {same}, nothing to choose between",
                           "remove or fix the task: give it two endings or more, each different from the others")
    prefix = min(prefix, min(len(s) for s in sequences) - 1)  # an ending all of whose tokens lead the others'
    if prefix == 0:
        raise EdgeSDKError(f"{kind} task at {where}: its sequences share no first token, so nothing predicts "
                           "their first one", "give the task a context (question) ahead of its endings")
    return prefix


def choice_score(score_window, encode, tasks: list[ChoiceTask], bos_id: int | None = None,
                 max_tokens: int | None = None, kind: str = HELLASWAG, progress: bool = False,
                 context: int | None = None) -> AccuracyResult:
    """HellaSwag (``hellaswag_score``) or multiple choice (``multiple_choice_score``) over ``tasks`` in their
    order (module docstring). ``score_window(ids) -> logits (T, V)`` from an empty cache; ``encode(text)`` adds
    no special token, ``bos_id`` leads every sequence where given; ``max_tokens`` (default:
    ``score_window.max_tokens`` where the scorer has one) is the longest sequence taken; ``context`` (None: none),
    llama-perplexity's -c, the most tokens a task's sequences take packed as it packs them. A task that cannot be
    scored is refused before any is scored, as llama.cpp's ``multiple_choice_score`` checks every task
    (``multiple_choice_prepare_one_task``) before its first batch."""
    from tqdm import tqdm

    if not tasks:
        raise EdgeSDKError(f"no {kind} task to score", f"pass a {kind} task file with at least one task")
    lead = [] if bos_id is None else [bos_id]
    tokenized = [(task.where, [lead + list(encode(f"{task.context} {ending}")) for ending in task.endings])
                 for task in tasks]
    _check_length(tokenized, score_window, max_tokens, kind, context)
    prefixes = [_choice_prefix(kind, task, where, sequences)
                for task, (where, sequences) in zip(tasks, tokenized, strict=True)]
    correct, picks, scores, endings = 0, [], [], 0
    bar = tqdm(tokenized, desc=kind, disable=not progress, unit="task")
    for task, prefix, (_, sequences) in zip(tasks, prefixes, bar, strict=True):
        means = tuple(float(_sequence_logprobs(score_window, s, prefix).mean()) for s in sequences)
        means = _ranked(kind, task.where, means)
        pick = _first_max(list(means))
        correct += task.labels[pick] == 1
        picks.append(pick)
        scores.append(means)
        endings += len(sequences)
    return _result(kind, correct, picks, scores, endings)


def hellaswag_score(score_window, encode, tasks: list[ChoiceTask], bos_id: int | None = None,
                    max_tokens: int | None = None, progress: bool = False, context: int | None = None
                    ) -> AccuracyResult:
    """:func:`choice_score` under HellaSwag's name (llama.cpp's ``hellaswag_score``)."""
    return choice_score(score_window, encode, tasks, bos_id, max_tokens, HELLASWAG, progress, context)


def multiple_choice_score(score_window, encode, tasks: list[ChoiceTask], bos_id: int | None = None,
                          max_tokens: int | None = None, progress: bool = False, context: int | None = None
                          ) -> AccuracyResult:
    """:func:`choice_score` under llama.cpp's ``multiple_choice_score``'s name."""
    return choice_score(score_window, encode, tasks, bos_id, max_tokens, MULTIPLE_CHOICE, progress, context)


def winogrande_spans(tokens: tuple[list[int], list[int]], bases: tuple[int, int]) -> tuple[range, range]:
    """The positions ``winogrande_score`` scores in each of a task's two sequences (module docstring), given
    the token counts of ``first + choice`` (``n_base1``, ``n_base2``)."""
    prefix = _common_prefix(list(tokens))
    skip_choice = all(len(s) - prefix > WINOGRANDE_MIN_TRAILING for s in tokens)
    spans = []
    for sequence, base in zip(tokens, bases, strict=True):
        start = base if skip_choice else prefix
        last = 1 if len(sequence) - start > 1 else 0
        spans.append(range(start, len(sequence) - last))
    return spans[0], spans[1]


def _scorable_spans(task: WinograndeTask, where: str, spans: tuple[range, range]) -> tuple[range, range]:
    """``spans`` (:func:`winogrande_spans`), after refusing a task they leave nothing to score in, or whose first
    scored token is its sequence's first, which nothing predicts (a sentence that starts with its blank, no BOS in
    front), each named as such."""
    choices = f"({task.choices[0]!r} / {task.choices[1]!r})"
    if not all(spans):
        raise EdgeSDKError(f"winogrande task at {where}: a choice leaves no token to score {choices}",
                           "remove or fix the task: the sentence needs words after the blank, or choices that differ")
    if min(span.start for span in spans) < 1:
        raise EdgeSDKError(f"winogrande task at {where}: its sentences with the two choices {choices} share no "
                           "first token and no BOS leads them, so nothing predicts the first token to score",
                           "remove or fix the task: give the sentence words before the blank")
    return spans


def winogrande_score(score_window, encode, tasks: list[WinograndeTask], bos_id: int | None = None,
                     max_tokens: int | None = None, progress: bool = False, context: int | None = None
                     ) -> AccuracyResult:
    """Winogrande (``winogrande_score``) over ``tasks`` in their order; arguments as :func:`choice_score`'s."""
    from tqdm import tqdm

    if not tasks:
        raise EdgeSDKError("no winogrande task to score", "pass a Winogrande CSV with at least one task")
    lead = [] if bos_id is None else [bos_id]
    tokenized = [(task.where, [lead + list(encode(task.first + choice + task.second)) for choice in task.choices])
                 for task in tasks]
    _check_length(tokenized, score_window, max_tokens, WINOGRANDE, context)
    all_spans = []  # every task's checked before any is scored
    for task, (where, sequences) in zip(tasks, tokenized, strict=True):
        bases = tuple(len(lead) + len(encode(task.first + choice)) for choice in task.choices)
        all_spans.append(_scorable_spans(task, where, winogrande_spans((sequences[0], sequences[1]), bases)))
    correct, picks, scores = 0, [], []
    bar = tqdm(tokenized, desc=WINOGRANDE, disable=not progress, unit="task")
    for task, spans, (_, sequences) in zip(tasks, all_spans, bar, strict=True):
        means = tuple(float(_sequence_logprobs(score_window, s, span.start, span.stop).mean())
                      for s, span in zip(sequences, spans, strict=True))
        means = _ranked(WINOGRANDE, task.where, means, "choice")
        pick = 0 if means[0] > means[1] else 1
        correct += pick + 1 == task.answer
        picks.append(pick)
        scores.append(means)
    return _result(WINOGRANDE, correct, picks, scores, 2 * len(tasks))


def plain_text_encoder(runtime):
    """``encode(text) -> ids`` with the bundle's tokenizer as ``common_tokenize(ctx, text, true)`` tokenizes a task's
    text: no special token added (the scorers put BOS in front), special tokens' text read as plain text
    (:meth:`~edgesdk.runtime.text.ChatTokenizer.plain_text`)."""
    return runtime.tokenizer.encode_plain


SCORERS = {HELLASWAG: hellaswag_score, WINOGRANDE: winogrande_score, MULTIPLE_CHOICE: multiple_choice_score}


def bundle_accuracy(runtime, kind: str, tasks, progress: bool = False, max_tokens: int | None = None,
                    context: int | None = None) -> AccuracyResult:
    """``kind`` over ``tasks`` through the bundle's runtime, BOS in front where its tokenizer adds one; a task
    longer than ``max_tokens`` (the bundle's max_context where None), or than ``context`` (llama-perplexity's -c) as
    llama-perplexity packs it, is refused (:class:`TaskTooLong`)."""
    from edgesdk.evaluate import bundle_scorer, leading_bos

    return SCORERS[kind](_with_positions(bundle_scorer(runtime), runtime), plain_text_encoder(runtime), tasks,
                         leading_bos(runtime.tokenizer), max_tokens=max_tokens, progress=progress, context=context)


def reference_accuracy(model, runtime, kind: str, tasks, progress: bool = False, max_tokens: int | None = None,
                       context: int | None = None) -> AccuracyResult:
    """The same through the PyTorch source ``model`` (host only), with the bundle's tokenizer and BOS, refusing
    what the bundle refuses (``max_tokens``, its max_context where None; ``context``), so both score the same
    tasks."""
    from edgesdk.evaluate import leading_bos, reference_scorer

    return SCORERS[kind](_with_positions(reference_scorer(model.eval()), runtime), plain_text_encoder(runtime), tasks,
                         leading_bos(runtime.tokenizer),
                         max_tokens=max_tokens or runtime.backend.max_context, progress=progress, context=context)


def _with_positions(score, runtime):
    """``score`` with the ``model_positions`` of the runtime's bundle (edgesdk.bundle.model_positions), which a
    refusal of a task past the bundle's context names (:class:`TaskTooLong`)."""
    from edgesdk.bundle import model_positions

    score.model_positions = model_positions(runtime.bundle.manifest)
    return score
