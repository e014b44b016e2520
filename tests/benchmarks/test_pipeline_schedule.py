"""benchmarks/pipeline_schedule.py: the pipeline benchmark's systems are schedule text that the front end
checks and code generation compiles, with the orders the lowering gives those keys (on the CPU)."""

from dataclasses import replace

import pytest

from benchmarks.pipeline_schedule import (
    FULL_MODEL,
    TINY_MODEL,
    ScheduleKeys,
    compile_schedule_text,
    schedule_text,
    system_configs,
    variant_keys,
)
from schedlang.diagnostics import ScheduleError
from schedlang.frontend import load_program_text
from schedlang.lowering.orders import one_f_one_b_orders
from schedlang.lowering.placement import place_stage_actions
from schedlang.vocabulary import CudaGraphs, Recompute


def test_system_names_map_to_schedule_keys():
    assert variant_keys("schedlang:8") == ScheduleKeys(chunks=8)
    assert variant_keys("schedlang:4g+2w") == ScheduleKeys(4, cuda_graphs=CudaGraphs.CHUNK_SLOTS, extra_warmup=2, split_backward=True)
    assert variant_keys("schedlang:16gw") == ScheduleKeys(16, cuda_graphs=CudaGraphs.CHUNK_SLOTS, split_backward=True)
    assert variant_keys("schedlang:8s") == ScheduleKeys(8, cuda_graphs=CudaGraphs.STEP)
    assert variant_keys("schedlang:2g+1wfd2") == ScheduleKeys(2, CudaGraphs.CHUNK_SLOTS, 1, True, True, 2)
    assert variant_keys("schedlang:2g+1wd1") == ScheduleKeys(2, CudaGraphs.CHUNK_SLOTS, 1, True, False, 1)
    assert variant_keys("torch") == ScheduleKeys(chunks=1)
    assert variant_keys("torch+ckpt") == ScheduleKeys(chunks=1)
    assert variant_keys("schedlang:16/full") == ScheduleKeys(16, recompute=Recompute.FULL)
    assert variant_keys("schedlang:16/full,none") == ScheduleKeys(16, recompute=(Recompute.FULL, Recompute.NONE))
    assert variant_keys("schedlang:8+1w/mixer/offload") == ScheduleKeys(
        8, extra_warmup=1, split_backward=True, recompute=Recompute.MIXER, offload=True
    )
    assert variant_keys("schedlang:4/offload") == ScheduleKeys(4, offload=True)
    for malformed in ("schedlang:2gf", "schedlang:2g+1d2", "schedlang:x", "8g", "schedlang:4/offload/full", "schedlang:4/all"):
        with pytest.raises(ValueError, match="a schedlang system is"):
            variant_keys(malformed)


@pytest.mark.parametrize(
    "name", ["schedlang:1", "schedlang:8", "schedlang:4g+2w", "schedlang:2g+1wfd2", "schedlang:16/mlp",
             "schedlang:8/mixer/offload", "schedlang:16/full,mlp", "torch", "torch+ckpt"],
)
def test_each_system_is_a_schedule_the_front_end_accepts_with_its_keys(name):
    keys = variant_keys(name)
    program = load_program_text(schedule_text(FULL_MODEL, keys, 32768, 4, "bf16"), "<test>")
    assert program.n_chunks == keys.chunks and program.n_stages == 2 and program.n_microbatches == 4
    assert program.pipeline.cuda_graphs == keys.cuda_graphs
    assert program.pipeline.extra_warmup == keys.extra_warmup
    assert program.pipeline.split_backward == keys.split_backward
    assert program.pipeline.forward_before_weight == keys.forward_before_weight
    assert program.pipeline.extra_deferred_weights == keys.extra_deferred_weights
    assert program.pipeline.recompute == keys.recompute and program.pipeline.offload == keys.offload
    assert program.stage_layers == (tuple(range(8)), tuple(range(8, 16)))


@pytest.mark.parametrize("name", ["schedlang:1", "schedlang:4", "schedlang:2+2", "schedlang:4g+1w", "schedlang:2g+1wfd2"])
def test_compiled_systems_run_the_orders_the_benchmark_used_to_build_by_hand(name):
    keys = variant_keys(name)
    configs = system_configs(name, TINY_MODEL, 1024, 4, "fp32")
    orders = one_f_one_b_orders(
        2, 4, keys.chunks, keys.extra_warmup, keys.split_backward, keys.forward_before_weight,
        keys.extra_deferred_weights,
    )
    expected_actions = tuple(tuple(str(action) for action in stage) for stage in place_stage_actions(orders))
    assert configs.pipeline.stage_actions == expected_actions
    assert configs.pipeline.chunk_boundaries == tuple(1024 * index // keys.chunks for index in range(keys.chunks + 1))
    assert configs.pipeline.cuda_graphs == keys.cuda_graphs and configs.pipeline.microbatch_size == 1
    assert configs.pipeline.stage_layers == ((0, 1), (2, 3))
    assert configs.train.dtype == "fp32" and configs.train.optimizer.lr == pytest.approx(1e-4)
    assert configs.model.layers == ("gla",) * 4 and configs.model.mlp_ratio == 2.0


def test_split_mlp_and_first_stage_layers_are_model_keys():
    model = replace(FULL_MODEL, split_mlp=True, first_stage_layers=19)
    configs = system_configs("schedlang:2", model, 32768, 4, "bf16")
    assert configs.model.layers == ("gla", "mlp") * 16
    assert configs.pipeline.stage_layers == (tuple(range(19)), tuple(range(19, 32)))
    assert configs.model.mlp_ratio == 8 / 3


def test_a_bad_option_is_refused_by_the_checker():
    model = replace(TINY_MODEL, first_stage_layers=4)  # leaves stage 1 no layer
    with pytest.raises(ScheduleError, match="stage 1"):
        compile_schedule_text(schedule_text(model, ScheduleKeys(chunks=2), 1024, 4, "fp32"))


def test_predicted_reserved_peaks_follow_the_recompute_mode():
    from benchmarks.pipeline_schedule import predicted_reserved_bytes

    kept, recomputed = (
        predicted_reserved_bytes(name, FULL_MODEL, 32768, 4, "bf16") for name in ("schedlang:8", "schedlang:8/full")
    )
    assert len(kept) == 2 and all(full < none for full, none in zip(recomputed, kept))
