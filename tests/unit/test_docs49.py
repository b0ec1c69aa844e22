"""README.md as a user reads it: what it shows is what the commands give (review 49).

Each test takes one thing the README states and that this machine can reproduce, and compares it with the code as it
is: the thermal guard's simulated 30-minute table (``edgesdk thermal plan``, deterministic), the Ollama
``keep_alive`` 0 sentence against the several-models section, and the ``deploy --status`` / ``--rollback`` form.
Nothing here depends on where the checkout or the temporary directory lies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEXT = " ".join(README.split())  # whitespace runs made single spaces: sentences wrap over lines


def _row(table: str, title: str) -> list[str]:
    """The cells after the title of the README table row that starts with ``| title |``."""
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0] == title:
            return cells[1:]
    raise AssertionError(f"README.md's thermal table has no row {title!r}: update this test with the README")


def test_the_thermal_table_is_what_thermal_plan_gives():
    """The Thermal guard section's table (rpi5, 35 °C, 30 min, 35 tok/s) and its "Higher caps" sentence are
    ``edgesdk thermal plan --target rpi5 --ambient 35 --decode-tok-s 35 [--clock-cap]``'s figures, the same
    ``thermal.plan.compare`` that ``tests/benchmarks/test_thermal_acceptance.py`` prints. Review 49: the README
    still gave 74.2 °C, 12,231 tokens, 6.30 tok/s and 73.7 °C / 16.92 s from before the guard's later changes."""
    from edgesdk.profile import get_profile
    from edgesdk.thermal.guard import CLOCK_CAP_RATIO, GuardConfig
    from edgesdk.thermal.plan import compare

    profile = get_profile("rpi5")
    paced = compare(profile, minutes=30, ambient_c=35, decode_tok_s=35.0)
    capped = compare(profile, minutes=30, ambient_c=35, decode_tok_s=35.0,
                     config=GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    u, g, c = paced["unguarded"].summary, paced["guarded"].summary, capped["guarded"].summary
    assert capped["unguarded"].summary.tokens == u.tokens
    table = README.split("| | unguarded | guard (pacing) | guard with `--clock-cap` |", 1)[1].split("\n\n", 1)[0]
    assert _row(table, "max temperature") == [f"{run.max_temp_c:.1f} °C" for run in (u, g, c)]
    assert _row(table, "firmware throttle") == [f"{run.throttle_s:,.0f} s" for run in (u, g, c)]
    assert _row(table, "total tokens") == [f"{u.tokens:,}"] + [f"{run.tokens:,} ({run.tokens / u.tokens:.1%})"
                                                              .replace("%", " %") for run in (g, c)]
    assert _row(table, "sustained tok/s (last 10 min)") == [f"{run.sustained_tok_s:.2f}" for run in (u, g, c)]
    assert _row(table, "p95 inter-token") == [f"{u.p95_inter_token_ms:.1f} ms"] + [
        f"{run.p95_inter_token_ms:.1f} ms ({u.p95_inter_token_ms / run.p95_inter_token_ms:.2f}x lower)"
        for run in (g, c)]
    assert _row(table, "mean time to first token") == [f"{run.mean_ttft_s:.2f} s" for run in (u, g, c)]

    higher = []
    for ghz in (1.8, 2.1):  # of the Pi 5's 2.4 GHz
        run = compare(profile, minutes=30, ambient_c=35, decode_tok_s=35.0,
                      config=GuardConfig(hot_clock_ratio=ghz / 2.4))["guarded"].summary
        higher.append((ghz, run))
    (_, fast), (_, faster) = higher
    sentence = (f"1.8 GHz gives {fast.tokens / u.tokens:.1%} of the unguarded tokens at p95 "
                f"{fast.p95_inter_token_ms:.1f} ms ({u.p95_inter_token_ms / fast.p95_inter_token_ms:.2f}x lower), "
                f"2.1 GHz {faster.tokens / u.tokens:.1%} at {faster.p95_inter_token_ms:.1f} ms "
                f"({u.p95_inter_token_ms / faster.p95_inter_token_ms:.2f}x)").replace("%", " %")
    assert sentence in TEXT, f"README.md's 'Higher caps' sentence should read {sentence!r}"


def test_the_ollama_keep_alive_sentence_agrees_with_several_models():
    """Several models on one server: ``keep_alive: 0`` unloads the named model (it leaves ``/api/ps``); with one
    bundle nothing unloads. Review 49: the Ollama paragraph said "nothing unloads" without the one-bundle condition,
    which the several-models section contradicts."""
    several = TEXT.split("### Several models on one server", 1)[1].split("## Embeddings", 1)[0]
    assert "`keep_alive: 0` unloads it" in several, "the several-models section no longer says keep_alive 0 unloads"
    ollama = TEXT.split("- **Ollama's API:**", 1)[1].split("- **OpenAI's Responses API:**", 1)[0]
    keep_alive = ollama.split("`keep_alive` (", 1)[1].split("), and the options", 1)[0]
    assert "nothing unloads" not in keep_alive.replace("with one bundle nothing unloads", ""), keep_alive
    assert "with one bundle" in keep_alive, keep_alive
    assert "several-models-on-one-server" in keep_alive, keep_alive


@pytest.mark.parametrize("flag", ["--status", "--rollback"])
def test_deploy_status_and_rollback_are_written_without_a_bundle(flag, tmp_path):
    """``edgesdk deploy BUNDLE --status`` is refused ("take no BUNDLE"), so the command table must not read as if
    ``--status`` / ``--rollback`` went after ``deploy BUNDLE --host user@board``."""
    result = CliRunner().invoke(main, ["deploy", str(tmp_path), "--to", str(tmp_path / "board"), flag])
    assert result.exit_code != 0
    assert "take no BUNDLE" in result.output
    row = next(line for line in README.splitlines() if line.startswith("| `edgesdk deploy BUNDLE --host"))
    assert re.search(r"`--status`, `--rollback` and `--remove ID` without BUNDLE", row), row[:200]


def test_model_answers_and_figures_of_an_earlier_default_build_say_so():
    """The JSON-schema, tool-call, KL-divergence and last-word figures of the `default` bundle were taken on the build
    that scored 29.240 (1-2 December), before the rebuild the accuracy table's `default` row gives (29.156); a
    default build now writes other answers (review 49, the first command's build: "Lionel" with ["French", "German",
    "English"], and set_light {"on": false} for the lamp, Oslo and Paris requests). The README says which build each
    figure is from, so a user whose build answers otherwise is not told it is broken."""
    assert "it scores 29.156" in TEXT
    assert "that build is the row below" in TEXT
    for quoted in ('`"name": "Eleanor"`', '"Olavsjuk"'):
        before = TEXT.split(quoted, 1)[0]
        sentence = before[before.rfind("On ", 0, len(before)) - 1:]
        assert sentence.startswith(" On an earlier `default` build"), f"{quoted}: {sentence[:120]!r}"
    kld = TEXT.split("| model | MB | mean KLD |", 1)[0].rsplit("Divergence from the uncompressed model", 1)[1]
    assert "the one that scored 29.240" in kld, kld[-300:]


def test_run_prompt_cache_says_an_answer_can_differ_as_serve_does():
    """``run --prompt-cache FILE``: the cached tokens' keys and values came from one whole prefill and the rest is
    prefilled apart, which an INT4 bundle rounds otherwise (review 49, the first command's `default` build: "What is
    2+2?" answered "Two+two = 4" without the file and "The answer to this question is 4." with it). The Serving
    section warns of this for `serve`'s cache; the `run` row said nothing of it."""
    row = next(line for line in README.splitlines() if line.startswith("| `edgesdk run BUNDLE [--prompt P"))
    cache = row.split("`--prompt-cache FILE`: the prompt's KV cache kept in FILE", 1)[1].split("; interactive", 1)[0]
    assert "a greedy answer can differ from an uncached run's" in cache, cache[-300:]
    assert "an answer can differ from the one an empty cache gives" in TEXT  # serve's own warning, which it points to
