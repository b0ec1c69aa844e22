"""The task files of llama-perplexity's accuracy tasks (edgesdk/accuracy.py): HellaSwag's 6-line text, Winogrande's
CSV and the binary multiple-choice file, read by llama.cpp's rules (tools/perplexity/perplexity.cpp), malformed ones
refused naming the line or field; and the tasks llama.cpp picks when fewer than all are asked for."""

from __future__ import annotations

import shutil
import struct
import subprocess

import pytest

from edgesdk.accuracy import (
    HELLASWAG,
    MULTIPLE_CHOICE,
    WINOGRANDE,
    _mt19937,
    _uniform_below,
    hellaswag_order,
    parse_hellaswag,
    parse_winogrande,
    random_subset,
    read_multiple_choice,
    read_task_file,
)
from edgesdk.errors import EdgeSDKError

HELLASWAG_TEXT = (
    "Baking cookies: A woman mixes flour and sugar in a bowl. She\n"
    "2\n"
    "throws the bowl at the wall.\n"
    "sings to the dog.\n"
    "adds eggs and stirs the dough.\n"
    "drives to the airport.\n"
    "Fishing: A man casts a line into the lake. He\n"
    "0\n"
    "waits for a fish to bite.\n"
    "paints the boat red.\n"
    "eats the fishing rod.\n"
    "flies over the lake.\n"
)

WINOGRANDE_TEXT = (
    "index,sentence,option1,option2,answer\n"
    "0,Sarah was a much better surgeon than Maria so _ always got the easier cases.,Sarah,Maria,2\n"
    '1,"The trophy didn\'t fit in the suitcase, because _ was too big.",trophy,suitcase,1\n'
    "\n"
    "2,He poured water from the jug into the cup until _ was full.,jug,cup,2"  # no newline: llama.cpp drops it
)


def test_hellaswag_tasks_are_six_lines_each():
    tasks = parse_hellaswag(HELLASWAG_TEXT)
    assert [t.context for t in tasks] == ["Baking cookies: A woman mixes flour and sugar in a bowl. She",
                                          "Fishing: A man casts a line into the lake. He"]
    assert tasks[0].endings[2] == "adds eggs and stirs the dough."
    assert tasks[0].labels == (0, 0, 1, 0)
    assert tasks[1].labels == (1, 0, 0, 0)
    assert tasks[1].where == "line 7"
    # -f drops one trailing newline; getline gives no empty last line either way
    assert parse_hellaswag(HELLASWAG_TEXT.rstrip("\n")) == tasks


@pytest.mark.parametrize(("text", "message"), [
    (HELLASWAG_TEXT + "A third task\n", r"13 lines, not a multiple of 6: the last task, from line 13, has 1 of its 6"),
    (HELLASWAG_TEXT.replace("\n0\n", "\nzero\n"), r"line 8: the gold ending of the task starting on line 7 must be "
                                                  r"0, 1, 2 or 3, got 'zero'"),
    (HELLASWAG_TEXT.replace("\n2\n", "\n4\n"), r"line 2: .* got '4'"),
    ("", "holds no task"),
])
def test_a_malformed_hellaswag_file_is_refused_naming_the_line(text, message):
    with pytest.raises(EdgeSDKError, match=message) as caught:
        parse_hellaswag(text, "hs.txt")
    assert "hs.txt" in str(caught.value)
    assert "6 lines a task" in caught.value.fix


def test_winogrande_rows_are_cut_as_llama_cpp_cuts_them():
    tasks = parse_winogrande(WINOGRANDE_TEXT)
    assert len(tasks) == 3  # the header and the blank line passed over; the last line read though unterminated
    first, quoted, last = tasks
    assert (first.first, first.second) == ("Sarah was a much better surgeon than Maria so ",
                                           " always got the easier cases.")
    assert first.choices == ("Sarah", "Maria")
    assert first.answer == 2
    assert first.where == "line 2"
    # a quoted sentence loses its quotes and keeps its comma; the comma inside does not split the row
    assert quoted.first == "The trophy didn't fit in the suitcase, because "
    assert quoted.answer == 1
    assert last.choices == ("jug", "cup")
    assert last.where == "line 5"


@pytest.mark.parametrize(("line", "message"), [
    ("7,No commas enough here,a,b", r"line 2: found 3 of the 4 commas"),
    ("7,There is no blank in this sentence.,a,b,1", r"line 2: the sentence \(2nd field\) has no _"),
    ("7,Pick _ please.,a,b,3", r"line 2: the answer \(5th field\) must be 1 or 2, got '3'"),
    ("7,Pick _ please.,a,b,x", r"line 2: the answer \(5th field\) must be 1 or 2, got 'x'"),
    ("7,Pick _ please.,same,same,1", r"line 2: the two choices are the same, 'same'"),
])
def test_a_malformed_winogrande_row_is_refused_naming_the_line(line, message):
    text = "0,Sarah was a much better surgeon than Maria so _ always got the easier cases.,Sarah,Maria,2\n" + line
    with pytest.raises(EdgeSDKError, match=message) as caught:
        parse_winogrande(text, "wg.csv")
    assert "wg.csv" in str(caught.value)
    assert "index,sentence,choice1,choice2,answer" in caught.value.fix


def test_only_the_first_line_may_be_a_header():
    with pytest.raises(EdgeSDKError, match="line 2: the answer"):
        parse_winogrande(WINOGRANDE_TEXT.replace("\n0,", "\nindex,sentence,option1,option2,answer\n0,", 1))


def _string(text: str | bytes) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<I", len(raw)) + raw


def _answers(answers, labels) -> bytes:
    return struct.pack("<I", len(answers)) + b"".join(_string(a) for a in answers) + \
        struct.pack(f"<{len(labels)}i", *labels)


def multiple_choice_file(tasks, stored_order=None) -> bytes:
    """llama.cpp's binary multiple-choice layout (multiple_choice_task::deserialize): task count, the byte
    offset of each task, then the tasks (question, mc1, mc2), stored in ``stored_order``."""
    bodies = [_string(q) + _answers(a, labels) + _answers(["x", "y"], [1, 0]) for q, a, labels in tasks]
    order = stored_order or list(range(len(tasks)))
    offsets, at = [0] * len(tasks), 4 + 4 * len(tasks)
    for index in order:
        offsets[index] = at
        at += len(bodies[index])
    return struct.pack(f"<{1 + len(tasks)}I", len(tasks), *offsets) + b"".join(bodies[i] for i in order)


MC_TASKS = [(f"Question {i}: which is right?", [f"answer {i}a", f"answer {i}b", f"answer {i}c"], [0, 1, 0])
            for i in range(6)]


def test_multiple_choice_reads_every_task_in_order_or_a_subset_at_its_offsets():
    data = multiple_choice_file(MC_TASKS, stored_order=[5, 4, 3, 2, 1, 0])
    every = read_multiple_choice(data)
    # all tasks: read one after the other from the header on, as llama.cpp does (offsets unused)
    assert [t.context for t in every] == [f"Question {i}: which is right?" for i in (5, 4, 3, 2, 1, 0)]
    assert every[0].endings == ("answer 5a", "answer 5b", "answer 5c")
    assert every[0].labels == (0, 1, 0)
    # fewer: llama.cpp's draw, each task read from its recorded offset
    subset = read_multiple_choice(data, count=3)
    assert [t.context for t in subset] == [f"Question {i}: which is right?" for i in random_subset(6, 3)]
    assert [t.where for t in subset] == [f"task {i + 1}" for i in random_subset(6, 3)]


@pytest.mark.parametrize(("data", "message"), [
    (b"", "holds no task"),
    (struct.pack("<I", 0), "holds no task"),
    (struct.pack("<II", 3, 12), r"the file ends inside the 3 task offsets \(byte 4 of 8\)"),
    (multiple_choice_file(MC_TASKS[:1])[:-3], "the file ends inside the labels of the mc2 answers of task 1 of 1"),
    (struct.pack("<II", 1, 8) + _string("Q?") + struct.pack("<I", 101),
     r"the mc1 answers of task 1 of 1 has 101 answers; llama.cpp reads at most 100 \(byte 14 of 18\)"),
    (struct.pack("<II", 1, 8) + _string("Q?") + _answers(["a", ""], [1, 0]) + _answers([], []),
     "task 1 of 1 has an empty answer 2"),
    (struct.pack("<II", 1, 8) + _string("") + _answers(["a"], [1]) + _answers([], []),
     "task 1 of 1 has an empty question"),
    (struct.pack("<II", 1, 8) + _string(b"Q\xff?") + _answers(["a"], [1]) + _answers([], []),
     r"the question of task 1 of 1 is not UTF-8 \(invalid start byte\) \(byte 13 of"),
    (struct.pack("<II", 1, 8) + struct.pack("<I", 50) + b"short", "is 50 bytes long, past the end of the file"),
])
def test_a_malformed_multiple_choice_file_is_refused_naming_the_field(data, message):
    with pytest.raises(EdgeSDKError, match=message) as caught:
        read_multiple_choice(data, "mc.bin")
    assert str(caught.value).startswith("mc.bin: ")
    assert "llama.cpp's binary format" in caught.value.fix


def test_a_subset_offset_past_the_end_is_named():
    data = bytearray(multiple_choice_file(MC_TASKS))
    struct.pack_into("<I", data, 4 + 4 * random_subset(6, 1)[0], 10_000)
    with pytest.raises(EdgeSDKError, match=r"is recorded at byte 10000, past the end of the file"):
        read_multiple_choice(bytes(data), count=1)


# std::mt19937 rng(1) with libstdc++'s uniform_int_distribution (hellaswag_score) and llama.cpp's float32 draw
# (winogrande_score, multiple_choice_score), as the C++ in LIBSTDCXX_SELECTION prints them (g++ 12).
HELLASWAG_FIRST_12_OF_10042 = [4187, 10013, 7233, 9363, 1, 1286, 3036, 10032, 1474, 2371, 927, 3984]
WINOGRANDE_12_OF_1267 = [528, 1262, 911, 1178, 0, 161, 381, 1258, 184, 296, 116, 498]


def test_the_tasks_drawn_are_llama_cpps():
    assert hellaswag_order(10042, 12) == HELLASWAG_FIRST_12_OF_10042
    assert hellaswag_order(10, 400) == [4, 9, 6, 8, 0, 1, 3, 7, 2, 5]  # every task, in llama.cpp's random order
    assert random_subset(1267, 12) == WINOGRANDE_12_OF_1267
    assert random_subset(10, 5) == [4, 8, 5, 6, 0]


LIBSTDCXX_SELECTION = r"""
#include <random>
#include <vector>
#include <cstdio>
#include <cstdlib>
int main(int argc, char ** argv) {
    size_t total = strtoull(argv[2], 0, 10), n = atoi(argv[3]);
    std::mt19937 rng(1);
    if (argv[1][0] == 'u') {  // one distribution, n draws
        std::uniform_int_distribution<size_t> dist(0, total - 1);
        for (size_t i = 0; i < n; ++i) printf("%zu ", dist(rng));
    } else if (argv[1][0] == 'h') {  // hellaswag_score
        std::vector<size_t> left(total);
        for (size_t i = 0; i < total; ++i) left[i] = i;
        for (size_t i = 0; i < n && i < total; ++i) {
            std::uniform_int_distribution<size_t> dist(0, left.size() - 1);
            size_t idx = dist(rng);
            printf("%zu ", left[idx]);
            left.erase(left.begin() + idx);
        }
    } else {  // winogrande_score, multiple_choice_score
        std::vector<int> aux(total);
        for (int i = 0; i < int(total); ++i) aux[i] = i;
        float scale = 1/(1.f + (float)rng.max());
        for (int i = 0; i < int(n); ++i) {
            int j = int(scale*rng()*aux.size());
            printf("%d ", aux[j]);
            aux[j] = aux.back();
            aux.pop_back();
        }
    }
    printf("\n");
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (libstdc++) to run llama.cpp's draw")
def test_the_draw_matches_libstdcxx_here(tmp_path):
    source = tmp_path / "draw.cpp"
    source.write_text(LIBSTDCXX_SELECTION)
    subprocess.run(["g++", "-O1", "-o", tmp_path / "draw", source], check=True)
    def draw(*args) -> list[int]:
        printed = subprocess.run([tmp_path / "draw", *map(str, args)], check=True, capture_output=True, text=True)
        return [int(i) for i in printed.stdout.split()]

    for total, count in [(10042, 40), (200_000, 8), (7, 7)]:
        assert hellaswag_order(total, count) == draw("h", total, count)
    for total, count in [(1267, 40), (200_000, 8), (5, 4)]:
        assert random_subset(total, count) == draw("w", total, count)
    # a range near 2^32, where Lemire's method rejects about a third of the 32-bit draws
    rng = _mt19937(1)
    assert [_uniform_below(rng, 3_000_000_000) for _ in range(64)] == draw("u", 3_000_000_000, 64)


def test_task_files_are_read_and_selected_as_llama_perplexity_reads_them(tmp_path):
    hellaswag = tmp_path / "hellaswag_val_full.txt"
    hellaswag.write_text(HELLASWAG_TEXT * 5, encoding="utf-8")
    ten = parse_hellaswag(HELLASWAG_TEXT * 5)
    assert read_task_file(HELLASWAG, hellaswag) == [ten[i] for i in hellaswag_order(10, 400)]
    assert read_task_file(HELLASWAG, hellaswag, 3) == [ten[i] for i in hellaswag_order(10, 3)]
    winogrande = tmp_path / "winogrande.csv"
    winogrande.write_text(WINOGRANDE_TEXT, encoding="utf-8")
    assert read_task_file(WINOGRANDE, winogrande) == parse_winogrande(WINOGRANDE_TEXT)
    assert read_task_file(WINOGRANDE, winogrande, 0) == parse_winogrande(WINOGRANDE_TEXT)
    # drawn from the 2 rows llama-perplexity reads (its reader drops the last, which no newline ends); 2 of 2: those
    # 2 in file order, as llama-perplexity scores them (tests/unit/test_eval51.py); 3: all
    assert read_task_file(WINOGRANDE, winogrande, 2) == parse_winogrande(WINOGRANDE_TEXT)[:2]
    assert read_task_file(WINOGRANDE, winogrande, 3) == parse_winogrande(WINOGRANDE_TEXT)
    assert read_task_file(WINOGRANDE, winogrande, 1) == [parse_winogrande(WINOGRANDE_TEXT)[i]
                                                         for i in random_subset(2, 1)]
    choices = tmp_path / "arc.bin"
    choices.write_bytes(multiple_choice_file(MC_TASKS))
    assert read_task_file(MULTIPLE_CHOICE, choices, 4) == read_multiple_choice(choices.read_bytes(), count=4)
    with pytest.raises(EdgeSDKError, match="--hellaswag-tasks 0: the number of tasks to score must be at least 1"):
        read_task_file(HELLASWAG, hellaswag, 0)
    latin = tmp_path / "latin1.csv"
    latin.write_bytes("0,Caf\xe9 _ ok.,a,b,1\n".encode("latin-1"))
    with pytest.raises(EdgeSDKError, match=r"the winogrande file .*latin1.csv is not UTF-8 text"):
        read_task_file(WINOGRANDE, latin)
