"""eval's accuracy tasks (edgesdk/accuracy.py) against llama.cpp's tools/perplexity/perplexity.cpp, review 51."""

from __future__ import annotations

import pytest

from edgesdk.accuracy import (
    WINOGRANDE,
    parse_winogrande,
    random_subset,
    read_task_file,
    winogrande_rows_llama_drops,
)


def _rows(count: int) -> str:
    return "".join(f"{i},The cup {i} fell off because _ was heavy.,cup,table,{1 + i % 2}\n" for i in range(count))


@pytest.mark.parametrize("end", ["", "\n"])
def test_winogrande_tasks_equal_to_the_rows_llama_perplexity_reads_scores_that_many(tmp_path, end):
    """winogrande_score draws only where --winogrande-tasks N is below the rows it read (``winogrande_tasks <
    data.size()``), else it scores those rows in file order. A 6-row file ending in a newline gives it 5 rows (its -f
    drops the newline, its reader the last line then unended): N = 5 scored 5 tasks there and 6 here."""
    path = tmp_path / "wino.csv"
    text = _rows(6)
    path.write_text(text, encoding="utf-8")
    every = parse_winogrande(text)
    seen = 6 - winogrande_rows_llama_drops(text)
    assert seen == 5
    assert read_task_file(WINOGRANDE, path, seen) == every[:seen]  # llama-perplexity's 5, in its order
    assert read_task_file(WINOGRANDE, path, 4) == [every[i] for i in random_subset(seen, 4)]
    for count in (0, 6, 7):  # all asked for: every row (eval --winogrande's help says so)
        assert read_task_file(WINOGRANDE, path, count) == every
    blank_end = tmp_path / "blank_end.csv"  # a blank last line: llama-perplexity reads all 6 rows
    blank_end.write_text(text + "\n" + end, encoding="utf-8")
    assert read_task_file(WINOGRANDE, blank_end, 6) == every
