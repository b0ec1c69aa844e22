"""One way to word a bundle's rebuild for the command line and the Python API (edgesdk.bundle.CONTEXT_TERMS, which
context_fix and run -c's hint share), one reckoning of a stage's positions (edgesdk.build.pipeline.positions_past,
which the distill stage's check shares), and the gate options run names derived from api_checks.GATE_TERMS."""

from __future__ import annotations

import pytest

from edgesdk.api_checks import GATE_TERMS
from edgesdk.bundle import CONTEXT_TERMS, context_fix, largest_context_rebuild, rebuild_with
from edgesdk.cli import main
from edgesdk.cli_llama import _rebuild_hint
from edgesdk.cli_options import GATE_OPTIONS
from edgesdk.errors import BuildError
from tests.unit.test_cli import invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)

# ---------------------------------------------------------------------------------------- the rebuild's words


@pytest.mark.parametrize("terms", sorted(CONTEXT_TERMS))
def test_the_terms_word_the_fix_as_the_caller_s_own_words_did(terms):
    """terms="python" words the fix in build_bundle's terms throughout, the command line's in edgesdk build's."""
    shorten = "shorten the prompt"
    build, larger = {"cli": ("'edgesdk build --max-context 512'", "rebuild the bundle with a larger --max-context"),
                     "python": ("build_bundle(..., max_context=512)", "build the bundle again with a larger context "
                                "(build_bundle(..., max_context=N))")}[terms]
    assert context_fix(shorten, 256, 512, 600, terms=terms) == (
        f"{shorten}: the model's max_position_embeddings is 512, fewer than the 600 tokens, and no build of the model "
        f"goes past it ({build} gives the most)")
    assert context_fix(shorten, 256, None, 300, terms=terms) == f"{shorten}, or {larger}"
    assert context_fix(shorten, 256, 512, 300, terms=terms) == f"{shorten}, or {largest_context_rebuild(512, terms)}"


def test_python_terms_name_build_bundle():
    assert largest_context_rebuild(512, "python") == (
        "build the bundle again with build_bundle(..., max_context=512), the most the model's max_position_embeddings "
        "(512) allows")
    assert context_fix("shorten it", 256, None, 300, terms="python") == (
        "shorten it, or build the bundle again with a larger context (build_bundle(..., max_context=N))")


def test_run_c_s_hint_words_the_rebuild_as_context_fix_does():
    # a size under the bundle's runs as the run's context (-c); past it, the hint names the rebuild
    assert _rebuild_hint(300, 256).startswith(f"for another size {rebuild_with(300)}")
    assert rebuild_with(200) == "rebuild the bundle with 'edgesdk build --max-context 200'"
    assert context_fix("shorten the prompt", 256, 512, 300).endswith(largest_context_rebuild(512))


# ----------------------------------------------------------------------------------------------- the positions

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import check_stage_positions, check_stage_sizes  # noqa: E402
from edgesdk.build.registry import make_config  # noqa: E402
from edgesdk.compress.distill import check_soft_prompt  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _refused(check, *args) -> BuildError | None:
    try:
        check(*args)
    except BuildError as refused:
        return refused
    return None


SIZES = [(prefix, length) for prefix in (0, 1, 8, 16, 40) for length in (2, 8, 15, 16, 17, 24, 40)]


@pytest.mark.parametrize(("prefix", "length"), SIZES)
def test_the_distill_check_and_the_build_s_refuse_the_same_sizes(prefix, length):
    """The build's check of a stage's positions and the distill stage's own refuse the same distill sizes, with the
    same refusal; a fix they give fits the model's 16 positions."""
    model = tiny_llama(max_positions=16)
    config = make_config("distill", {"soft_prompt_tokens": prefix, "sequence_length": length})
    own = _refused(check_soft_prompt, config, model.config, "cli")
    build = _refused(check_stage_positions, "distill", config, model.config, "cli")
    early = _refused(check_stage_sizes, [("distill", config)], model, get_profile("host"))
    assert (own is None) == (prefix + length <= 16)
    for other in (build, early):
        assert (other is None) == (own is None)
        assert other is None or (other.problem, other.fix) == (own.problem, own.fix)
    if own is None:
        return
    for way in own.fix.split(", or "):  # each way out the fix names, applied, is taken
        if "shorter prefix" in way:  # a prefix shorter than the one given: not one setting to read
            continue
        sets = way.replace(" or less", "").replace(" (no prefix, the default)", "").split("--set ")[1:]
        values = {"soft_prompt_tokens": prefix, "sequence_length": length,
                  **{item.strip().split("=")[0].split(".")[1]: int(item.strip().split("=")[1]) for item in sets}}
        check_soft_prompt(make_config("distill", values), model.config, "cli")


def test_a_sequence_past_the_positions_with_a_prefix_names_a_fix_that_fits():
    """distill.sequence_length 24 with a prefix of 8 on 16 positions: the fix said "--set distill.soft_prompt_tokens=0
    (no prefix, the default)" as one way out, which leaves the 24-token blocks past the 16 positions."""
    model = tiny_llama(max_positions=16)
    refused = _refused(check_soft_prompt, make_config("distill", {"soft_prompt_tokens": 8, "sequence_length": 24}),
                       model.config)
    assert refused.fix == ("--set distill.sequence_length=8 or less, or --set distill.sequence_length=16 --set "
                           "distill.soft_prompt_tokens=0 (no prefix, the default)")


def test_the_kept_fixes_of_the_soft_prompt():
    model = tiny_llama(max_positions=16)
    fix = _refused(check_soft_prompt, make_config("distill", {"soft_prompt_tokens": 8, "sequence_length": 12}),
                   model.config, "python").fix
    assert fix == ("overrides=['distill.soft_prompt_tokens=4'] or less, or overrides=['distill.soft_prompt_tokens=0'] "
                   "(no prefix, the default)")
    fix = _refused(check_soft_prompt, make_config("distill", {"soft_prompt_tokens": 8, "sequence_length": 16}),
                   model.config).fix
    assert fix == ("--set distill.sequence_length=8 or less with a shorter prefix, or --set "
                   "distill.soft_prompt_tokens=0 (no prefix, the default)")


def test_distill_without_steps_reads_nothing_and_is_not_refused():
    """distill.steps 0 reads no text (the stage trains nothing), as qat and prune without their reads: its sequence
    past the model's positions was refused all the same."""
    model = tiny_llama(max_positions=16)
    config = make_config("distill", {"steps": 0, "sequence_length": 40, "soft_prompt_tokens": 8})
    check_soft_prompt(config, model.config)
    check_stage_sizes([("distill", config)], model, get_profile("host"))


# ------------------------------------------------------------------------------------------------ the gate options


def test_each_gate_option_is_an_option_of_run():
    run_options = {option for param in main.commands["run"].params for option in (*param.opts, *param.secondary_opts)}
    assert set(GATE_TERMS["cli"].values()) <= run_options
    assert set(GATE_OPTIONS) == {"entropy_target", "compute_budget", "gating"}
    for argument, hint in GATE_OPTIONS.items():
        option = GATE_TERMS["cli"]["no_gating" if argument == "gating" else argument]
        assert hint == f"'{option}'"


def test_no_gating_beside_a_budget_is_told_under_the_option_as_click_quotes_it(power_bundle):  # noqa: F811
    """The option was told "Invalid value for --no-gating", where the other gate options (and click's own refusals)
    are quoted: "Invalid value for '--compute-budget'"."""
    result = invoke("run", power_bundle.path, "-p", "hi", "-n", 1, "--threads", 1, "--ignore-target", "--no-gating",
                    "--compute-budget", 0.5)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--no-gating': --entropy-target and --compute-budget steer the gates, which " \
           "--no-gating turns off" in result.stderr
