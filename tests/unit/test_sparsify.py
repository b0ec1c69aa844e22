"""Block sparsity: masks follow the global importance ranking with each weight's floor, training
keeps dropped blocks at zero, and a tiny Jetson build ships block-compressed weights plus AOT
kernels that the ``triton`` backend runs (PyTorch twins and Triton's interpreter on the CPU)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant, sparsify  # noqa: E402
from tests._utils.builds import build_tiny_jetson_bundle  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def test_block_sums_and_masks_cover_ragged_edges():
    values = torch.ones(70, 45)
    sums = sparsify.block_sums(values, 32)  # (3, 2) blocks, the last ones partial
    assert sums.shape == (3, 2)
    assert sums[0, 0] == 32 * 32
    assert sums[2, 1] == 6 * 13
    mask = torch.tensor([[True, False], [False, True], [True, True]])
    full = sparsify.expand_mask(mask, (70, 45), 32)
    assert full.shape == (70, 45)
    assert not full[:32, 32:].any()
    assert full[:32, :32].all()
    assert full[64:, 32:].all()


def test_plan_masks_keeps_the_global_density_and_each_floor():
    generator = torch.Generator().manual_seed(0)
    scores = {"strong": torch.rand(8, 8, generator=generator) + 1.0,  # every block beats "weak"
              "weak": torch.rand(8, 8, generator=generator) * 0.01}
    config = sparsify.SparsifyConfig(density=0.5, min_density=0.25)
    masks = sparsify.plan_masks(scores, config)
    assert sum(int(m.sum()) for m in masks.values()) == 64  # the density asked: the floors come out of it
    assert int(masks["strong"].sum()) == 48  # its floor (16) and all the 32 blocks left after both floors
    assert masks["strong"].view(-1)[scores["strong"].flatten().topk(48).indices].all()
    assert int(masks["weak"].sum()) == 16  # ... and the other only its floor, its best blocks
    assert masks["weak"].view(-1)[scores["weak"].flatten().topk(16).indices].all()
    assert sparsify.decode_mask(sparsify.encode_mask(masks["weak"])).equal(masks["weak"])


def test_sensitivity_allocation_spares_costly_weights_and_meets_the_density():
    sizes = {"cheap": 100, "costly": 100, "huge": 400}
    costs = {"cheap": 0.01, "costly": 1.0, "huge": 0.01}
    config = sparsify.SparsifyConfig(density=0.8, min_density=0.25)
    densities = sparsify.allocate_densities(costs, sizes, config)
    kept = sum(densities[n] * sizes[n] for n in sizes) / sum(sizes.values())
    assert abs(kept - 0.8) < 1e-6
    assert densities["costly"] > 0.99  # a weight that hurts when cut keeps (almost) everything
    assert densities["huge"] < densities["cheap"] < 1.0  # same cost per fraction, more blocks per fraction
    assert min(densities.values()) >= 0.25


def test_sensitivity_probe_restores_every_weight():
    model = tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = [torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    config = sparsify.SparsifyConfig(density=0.6, block_size=16)
    scores = sparsify.block_importance(model, batches, config, 16)
    masks = sparsify.plan(model, scores, batches, 16, config)
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    density = sparsify.density_summary(masks)["density"]
    assert 0.55 <= density <= 0.65


def test_bad_sparsify_settings_name_the_field():
    with pytest.raises(ValueError, match="density"):
        sparsify.SparsifyConfig(density=0.0)
    with pytest.raises(ValueError, match="importance"):
        sparsify.SparsifyConfig(importance="random")
    with pytest.raises(ValueError, match="allocation"):
        sparsify.SparsifyConfig(allocation="uniform")


@pytest.mark.parametrize("field", ["calibration_batches", "probe_batches", "batch_size", "sequence_length"])
def test_sparsify_counts_below_one_are_refused(field):
    """No calibration or probe batch would end in a division by zero after the importance pass."""
    with pytest.raises(ValueError, match=f"{field} must be >= 1, got 0"):
        sparsify.SparsifyConfig(**{field: 0})


def test_density_below_the_floor_is_refused():
    """Every weight keeps at least min_density of its blocks, so a lower density cannot be met."""
    with pytest.raises(ValueError, match="density 0.2 is below min_density 0.25"):
        sparsify.SparsifyConfig(density=0.2)
    assert sparsify.SparsifyConfig(density=0.2, min_density=0.1).density == 0.2


@pytest.mark.parametrize("importance", ["fisher", "wanda"])
def test_masks_hold_through_training(importance):
    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    batches = [torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    config = sparsify.SparsifyConfig(density=0.5, importance=importance, block_size=16)
    masks = sparsify.plan_masks(sparsify.block_importance(model, batches, config, 16), config)
    model.config.edgesdk_sparsity = {"block": 16, "masks": {n: sparsify.encode_mask(m) for n, m in masks.items()}}
    sparsify.apply_masks(model)
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="none",
                                                    embedding_bits=None))
    for p in model.parameters():
        p.requires_grad_(True)
    held = sparsify.hold_masks(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    for batch in batches:
        model(batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for handle in held:
        handle.remove()
    fake_quant.detach(model, bake=True)
    linears = fake_quant.decoder_linears(model)
    for name, mask in masks.items():
        weight = linears[name].weight
        dropped = ~sparsify.expand_mask(mask, tuple(weight.shape), 16)
        assert dropped.any() or mask.all()
        assert float(weight.detach()[dropped].abs().sum()) == 0.0, name
    assert 0.5 <= sparsify.density_summary(masks)["density"] <= 0.6  # floors of small weights add a few


@pytest.fixture(scope="module")
def sparse_bundle(tmp_path_factory):
    pytest.importorskip("triton", reason="AOT kernels need Triton's compiler (pip install edgesdk[host])")
    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("sparse"))


def test_jetson_build_ships_block_sparse_weights_and_sm87_kernels(sparse_bundle):
    record = sparse_bundle.manifest["sparse"]
    stage = sparse_bundle.manifest["stages"][1]
    assert stage["stage"] == "sparsify"
    assert stage["metrics"]["block"] == 32
    assert 0.5 <= stage["metrics"]["density"] <= 0.6
    # Stored blocks of the fused rows: gate (112 rows) then up share a straddling block row here.
    assert record["density"] <= 0.7
    assert record["bytes_sparse"] < 0.75 * record["bytes_dense_int8"]
    assert record["validation"]["top1_agree"] == 1.0
    sparsity = json.loads((sparse_bundle.path / "sparsity.json").read_text())
    assert set(sparsity["weights"]) >= {"layers.0.qkv", "layers.1.down"}
    assert record["kernels"]["sm"] == 87
    files = sparse_bundle.manifest["files"]
    cubins = [name for name in files if name.startswith("kernels/sm_87/") and name.endswith(".cubin")]
    assert cubins
    assert all(name.replace(".cubin", ".ptx") in files for name in cubins)
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.is_file():
        pytest.skip("this triton ships no cuobjdump")
    for name in cubins:  # cuobjdump names the ELF by the architecture it finds inside the file
        listing = subprocess.run([str(cuobjdump), "--list-elf", str(sparse_bundle.path / name)],
                                 capture_output=True, text=True, check=True).stdout
        assert ".sm_87.cubin" in listing, listing
        print(f"\n[cuobjdump] {name}: {listing.strip()}")


def test_triton_backend_refuses_the_cpu_unless_asked(sparse_bundle, monkeypatch):
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.triton_backend import open_triton_backend

    monkeypatch.delenv("EDGESDK_KERNELS", raising=False)
    with pytest.raises(RuntimeBackendError, match="CUDA"):
        open_triton_backend(sparse_bundle, threads=1)


def test_triton_backend_emulated_kernels_equal_their_twins(sparse_bundle, monkeypatch):
    """The whole decoder on the interpreted Triton kernels equals it on the PyTorch twins."""
    from edgesdk.runtime.triton_backend import open_triton_backend

    ids = np.random.default_rng(0).integers(3, 300, 10)
    outputs = {}
    for mode in ("reference", "emulated"):
        monkeypatch.setenv("EDGESDK_KERNELS", mode)
        backend = open_triton_backend(sparse_bundle, threads=1)
        prefill = backend.prefill(ids[:8], keep_logits=8)
        steps = [backend.decode(int(t)) for t in ids[8:]]
        outputs[mode] = np.concatenate([prefill, np.stack(steps)])
    scale = float(np.abs(outputs["reference"]).max())
    assert float(np.abs(outputs["emulated"] - outputs["reference"]).max()) <= 1e-4 * max(scale, 1.0)


def test_static_decode_step_equals_the_eager_one(sparse_bundle, monkeypatch):
    """The graph-ready decode step (token, position and length read from device tensors, the K/V row written
    by index_copy_) gives the eager step's logits; on a CPU nothing is captured, the static step runs as is."""
    from safetensors.torch import load_file

    from edgesdk.runtime.sparse_decoder import SparseDecoder

    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    record = {**sparse_bundle.manifest["sparse"], "max_context": 320}  # room to outgrow the first cache
    tensors = load_file(str(sparse_bundle.file(record["weights"])))
    ids = torch.as_tensor(np.random.default_rng(3).integers(3, 300, 300))
    runs = {}
    for graphs in (False, True):
        decoder = SparseDecoder(tensors, record, graphs=graphs)
        assert not decoder.graphs or decoder.capacity < decoder.max_context  # grown to max_context on first use
        logits = [decoder.step(ids[:5], keep=1)]
        logits += [decoder.step(ids[i : i + 1], keep=1) for i in range(5, 300)]  # crosses the 256 capacity
        decoder.reset()
        logits.append(decoder.step(ids[:1], keep=1))  # a reset sequence overwrites row 0
        runs[graphs] = torch.cat(logits)
        assert decoder.position == 1
    assert decoder._graph is False
    assert decoder.capacity == decoder.max_context
    assert torch.allclose(runs[True], runs[False], atol=1e-5, rtol=1e-5)


def test_reordering_channels_leaves_the_logits_unchanged_and_gathers_unimportant_weights():
    """TETRIS-style reordering is a permutation of the residual stream and of each FFN: the model
    computes the same logits, and the least important weights end up sharing blocks."""
    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2).eval()
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:  # RMSNorm weights start at 1, which no permutation would change
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
    batches = [torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    with torch.no_grad():
        before = model(batches[0]).logits
    config = sparsify.SparsifyConfig(density=0.75, block_size=16)
    kept_before = _kept_importance(model, batches, config)
    sparsify.reorder_channels(model, batches)
    with torch.no_grad():
        after = model(batches[0]).logits
    assert torch.allclose(before, after, atol=1e-5), float((before - after).abs().max())
    hidden, ffn = sparsify.channel_keys(model, batches)
    assert torch.all(hidden[1:] >= hidden[:-1] - 1e-4)  # sorted: the permutation was applied everywhere
    assert all(torch.all(keys[1:] >= keys[:-1] - 1e-4) for keys in ffn)
    assert _kept_importance(model, batches, config) > kept_before


def _kept_importance(model, batches, config) -> float:
    """Share of the Wanda importance that the blocks each weight keeps at ``config.density`` hold."""
    scores = sparsify.block_importance(model, batches, config, config.block_size)
    norms = sparsify.input_norms(model, fake_quant.decoder_linears(model), batches)
    kept = total = 0.0
    for name, linear in fake_quant.decoder_linears(model).items():
        blocks = sparsify.block_sums(sparsify.wanda(linear, norms[name]), config.block_size)
        mask = sparsify.keep_top(scores[name], round(config.density * scores[name].numel()))
        kept += float(blocks[mask].sum())
        total += float(blocks.sum())
    return kept / total


@pytest.mark.parametrize("grid", [{"granularity": "block", "block_size": 16}, {"embedding_bits": 8}])
def test_reordering_refuses_quantization_grouped_along_the_hidden_channels(grid):
    """Blocks of input channels sharing a scale (block granularity, the block-quantized embedding and head)
    are regrouped by a permutation: re-baked after reordering, the model would compute something else."""
    from edgesdk.errors import BuildError

    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2)
    settings = {"granularity": "channel", "activations": "none", "embedding_bits": None, **grid}
    fake_quant.attach(model, fake_quant.QuantScheme(weight_bits=8, **settings))
    fake_quant.detach(model, bake=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(BuildError, match="quantized in blocks along the hidden channels"):
        sparsify.reorder_channels(model, [torch.zeros(1, 8, dtype=torch.long)])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_reordering_refuses_a_model_with_power_adapters():
    from edgesdk.errors import BuildError

    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2)
    model.config.edgesdk_power = {"rank": 4}
    with pytest.raises(BuildError, match="power adapters"):
        sparsify.reorder_channels(model, [torch.zeros(1, 8, dtype=torch.long)])
