"""Power measurement side: the c_t profiler counts the buckets the context holds by their middle, where it times."""

from __future__ import annotations

import pytest

from edgesdk.power.profiler import REPEATS, buckets_timeable, measure_kv_cost


@pytest.mark.parametrize(("max_context", "bucket_size", "measure_up_to"), [
    (128, 64, 1024), (100, 64, 1024), (200, 64, 1024), (8192, 64, 1024), (8192, 64, 128), (64, 16, 40),
    (10, 64, 1024), (512, 4, 8), (100, 64, 100),
])
def test_buckets_timeable_counts_every_bucket_whose_middle_and_steps_fit(max_context, bucket_size, measure_up_to):
    """Bucket b is timed at the cache length b * size + size // 2 and ``REPEATS`` decode steps after it: every bucket
    counted lies below ``measure_up_to`` and its steps below the context, and the next one does not. A count of
    whole buckets read a context of 128 as one bucket of 64 (the power stage refused it) though the steps at 96-102
    fit."""
    count = buckets_timeable(max_context, bucket_size, measure_up_to)

    def fits(bucket: int) -> bool:
        end = bucket * bucket_size + bucket_size // 2 + REPEATS  # one past the last cache length timed
        return end < max_context and (bucket + 1) * bucket_size <= measure_up_to

    assert all(fits(b) for b in range(count))
    assert not fits(count)


def test_buckets_timeable_a_context_of_128_holds_two_buckets_of_64():
    assert buckets_timeable(128, 64, 1024) == 2


def test_measure_kv_cost_times_two_buckets_in_a_context_of_128():
    """The profiler itself times both buckets of a 128-position model (one gave a flat line: c_t 0 everywhere)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    stats = measure_kv_cost(model, 128, bucket_size=64, measure_up_to=1024, buckets=8)
    assert sorted(stats.measured, key=int) == ["0", "1"]
    assert all(entry["steps"] == REPEATS - 1 for entry in stats.measured.values())
    assert len(stats.table_ms) == 2
