"""Power distillation, review 46: entropy targets no window can hold."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edgesdk.power.controller import ControllerConfig
from edgesdk.power.distribution import FLOOR, WINDOW, distribution, entropy, least_entropy


@pytest.mark.parametrize(("window", "floor"), [(WINDOW, FLOOR), (8, 0.0), (8, 0.05), (4, 0.01), (16, 0.01)])
def test_the_least_entropy_is_the_lowest_any_window_of_powers_gives(window, floor):
    """Every 0/1 corner of the min-max box (the extremes, the entropy being concave) and random powers: none
    goes below least_entropy, and one corner reaches it."""
    corners = [entropy(distribution(np.array(bits, np.float64), np.ones(window), floor))
               for bits in itertools.product((0.0, 1.0), repeat=window) if 0 < sum(bits) < window]
    assert min(corners) == pytest.approx(least_entropy(window, floor), abs=1e-12)
    rng = np.random.default_rng(0)
    powers = rng.gamma(0.3, size=(20000, window))
    found = entropy(distribution(powers, np.ones_like(powers), floor))
    assert found.min() >= least_entropy(window, floor) - 1e-12
    assert least_entropy(window, floor) < math.log(window)


def test_the_defaults_least_entropy_is_all_the_power_on_one_token():
    top = 1.01 / 1.08  # one token at 1 + 0.01, seven at 0.01, over their sum 1.08
    expected = -top * math.log(top) - 7 * (0.01 / 1.08) * math.log(0.01 / 1.08)
    assert least_entropy() == pytest.approx(expected, rel=1e-12)
    assert round(least_entropy(), 3) == 0.366


@pytest.mark.parametrize("target", [0.05, 0.2, 0.36])
def test_an_entropy_target_below_what_the_floor_lets_a_window_hold_is_refused(target):
    """With the floor 0.01 every token of an 8-token window keeps 0.9 % of its mass, so H >= 0.366 nats; a target
    of 0.2 was accepted, could never be met, and drove tau to its ceiling (as few FFN blocks as the quality floor
    allows) for every text, with no word of why."""
    with pytest.raises(ValueError, match="entropy_target must lie in") as info:
        ControllerConfig(entropy_target=target)
    message = str(info.value)
    assert "entropy_target must lie in (0.366, 2.079) nats" in message
    assert f"got {target}" in message
    assert "set it inside that range" in message


def test_the_bound_follows_the_bundles_floor():
    ControllerConfig(entropy_target=0.2, floor=0.001)  # least 0.055 nats at this floor: 0.2 can be held
    with pytest.raises(ValueError, match=r"must lie in \(2\.020, 2\.079\) nats"):
        ControllerConfig(entropy_target=1.5, floor=1.0)  # a floor as large as the range: 1.5 is out of reach


def test_a_profiles_target_no_window_can_hold_is_refused_before_the_power_stage_works(tmp_path):
    """The profile's schema took any target in (0, ln 8); the stage used it as it was, profiled c_t, trained the
    adapters, and only the sweep's controller refused it, with a traceback after the whole training. A profile
    file is now refused when it loads; the stage still refuses one that reached it unchecked."""
    torch = pytest.importorskip("torch")
    from importlib import resources

    import yaml

    from edgesdk.build.registry import BuildContext, make_config, stage_spec
    from edgesdk.compress.data import DataConfig
    from edgesdk.errors import BuildError, ProfileError
    from edgesdk.profile import get_profile
    from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer

    data = yaml.safe_load((resources.files("edgesdk.targets") / "host.yaml").read_text(encoding="utf-8"))
    data["name"], data["aliases"] = "low-entropy-host", []
    data["power"]["entropy_target"] = 0.2
    (tmp_path / "low.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"entropy_target must lie in \(0.366, 2.079\)"):
        get_profile(str(tmp_path / "low.yaml"))  # a profile file is refused when it loads
    # one built in Python without validation (model_copy) still reaches the stage, which refuses it before work
    host = get_profile("host")
    profile = host.model_copy(update={"name": "low-entropy-host",
                                      "power": host.power.model_copy(update={"entropy_target": 0.2})})
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    torch.manual_seed(0)
    model = tiny_llama()
    ctx = BuildContext(profile=profile, work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=None,
                       progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))
    settings = {"rounds": 0, "sweep_tokens": 8, "bucket_size": 4, "profile_up_to": 8, "profile_buckets": 2,
                "prompt_tokens": 4, "new_tokens": 8, "sweep": [[0.25, 0.5, 0.25]]}
    with pytest.raises(BuildError) as info:
        stage_spec("power").run(model, make_config("power", settings), ctx)
    assert "low-entropy-host's power.entropy_target" in str(info.value)
    assert "must lie in (0.366, 2.079) nats" in str(info.value)
    assert not any(".power_adapter." in name for name, _ in model.named_parameters())  # refused before any work


@pytest.mark.parametrize(("override", "message"), [
    ("power.micro_batch=0", "micro_batch=0: the sequences per backward pass"),
    ("power.micro_batch=-4", "micro_batch=-4: the sequences per backward pass"),
    ("power.max_nll_increase=-0.1", "max_nll_increase=-0.1: the sweep's quality bound"),
])
def test_a_micro_batch_or_sweep_bound_that_cannot_apply_is_refused_before_the_build(override, message):
    """micro_batch 0 or below ran micro-batches of 1 (train_adapters took max(1, ...)); a negative sweep bound left
    no point within it, so the lowest-NLL point was chosen, whatever the bound asked for, without a word."""
    pytest.importorskip("torch")
    from edgesdk.build.recipes import load_recipe
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError) as info:
        load_recipe("power").with_overrides([override]).validated()
    assert message in str(info.value)


def test_a_sweep_bound_that_is_not_a_number_is_refused_through_the_api():
    pytest.importorskip("torch")
    from edgesdk.power.stage import PowerConfig

    with pytest.raises(ValueError, match=r"max_nll_increase=nan: .* must be a number >= 0"):
        PowerConfig(max_nll_increase=float("nan"))
    PowerConfig(max_nll_increase=0.0, micro_batch=1)  # the edges are fine
