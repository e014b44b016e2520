"""The cached rotary tables ([Note: cached rotary tables] in schedlang.runtime.rotary).

* A second call of one geometry reads the table the first built: one entry, the same tensors, views of them.
* A longer range rebuilds the table at least twice as long, keeps the replaced one alive, and every slice,
  before and after, equals the table built for that range alone and the trigonometry of its positions.
* Each geometry (head width, base, dtype) has a table of its own; ``rotate_queries_and_keys`` reads the
  process's cache and rotates exactly as the uncached tables do.
* On a CUDA device: a captured graph keeps reading its table after a later call extends the cache, and a
  capture that the cache cannot serve builds its table inside the graph without entering it in the cache.
"""

from __future__ import annotations

import pytest
import torch

from schedlang.runtime.rotary import (
    ROTARY_TABLES,
    RotaryGeometry,
    RotaryTableCache,
    apply_rotary,
    rotary_tables,
    rotate_queries_and_keys,
)

CPU = torch.device("cpu")


def _trigonometry(head_dim: int, theta: float, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosine and sine of ``position * theta ** (-2 i / head_dim)`` in float64."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    angles = torch.arange(start, end, dtype=torch.float64)[:, None] * theta ** (-exponents)[None, :]
    return angles.cos(), angles.sin()


def test_a_second_call_of_the_same_geometry_reads_the_first_calls_table():
    cache = RotaryTableCache()
    first_cosine, first_sine = cache.lookup(16, 500.0, 0, 40, torch.float32, CPU)
    (geometry, table), = cache.tables.items()
    assert geometry == RotaryGeometry(16, 500.0, torch.float32, CPU)
    second_cosine, second_sine = cache.lookup(16, 500.0, 10, 30, torch.float32, CPU)
    assert len(cache.tables) == 1 and cache.tables[geometry] is table and not cache.replaced
    for view in (first_cosine, second_cosine):
        assert view.untyped_storage().data_ptr() == table[0].untyped_storage().data_ptr()
    assert second_sine.untyped_storage().data_ptr() == table[1].untyped_storage().data_ptr()
    assert torch.equal(second_cosine, first_cosine[10:30]) and torch.equal(second_sine, first_sine[10:30])


@pytest.mark.parametrize("head_dim", [2, 6, 16])
def test_a_longer_range_extends_the_table_to_the_direct_formula(head_dim):
    theta = 10000.0
    cache = RotaryTableCache()
    early_cosine, early_sine = cache.lookup(head_dim, theta, 3, 17, torch.float64, CPU)
    short_table = cache.tables[RotaryGeometry(head_dim, theta, torch.float64, CPU)]
    assert short_table[0].shape == (17, head_dim // 2)
    later_cosine, later_sine = cache.lookup(head_dim, theta, 20, 63, torch.float64, CPU)
    long_table = cache.tables[RotaryGeometry(head_dim, theta, torch.float64, CPU)]
    assert long_table[0].shape == (63, head_dim // 2) and cache.replaced == [short_table]
    cache.lookup(head_dim, theta, 63, 64, torch.float64, CPU)  # one position past: at least twice as long
    assert cache.tables[RotaryGeometry(head_dim, theta, torch.float64, CPU)][0].shape[0] == 126
    assert len(cache.replaced) == 2
    slices = (((3, 17), (early_cosine, early_sine)), ((20, 63), (later_cosine, later_sine)))
    for (start, end), (cosine, sine) in slices:
        direct_cosine, direct_sine = rotary_tables(head_dim, theta, start, end, torch.float64, CPU)
        assert torch.equal(cosine, direct_cosine) and torch.equal(sine, direct_sine)
        formula_cosine, formula_sine = _trigonometry(head_dim, theta, start, end)
        # float32 angles of positions below 64: within float32 rounding of the float64 trigonometry
        torch.testing.assert_close(cosine, formula_cosine, rtol=0, atol=1e-5)
        torch.testing.assert_close(sine, formula_sine, rtol=0, atol=1e-5)
    whole_cosine, whole_sine = cache.lookup(head_dim, theta, 0, 126, torch.float64, CPU)
    direct_cosine, direct_sine = rotary_tables(head_dim, theta, 0, 126, torch.float64, CPU)
    assert torch.equal(whole_cosine, direct_cosine) and torch.equal(whole_sine, direct_sine)


def test_each_geometry_has_a_table_of_its_own():
    cache = RotaryTableCache()
    geometries = (
        (8, 50.0, torch.float32),
        (8, 50.0, torch.bfloat16),
        (8, 60.0, torch.float32),
        (4, 50.0, torch.float32),
    )
    for head_dim, theta, dtype in geometries:
        cosine, sine = cache.lookup(head_dim, theta, 5, 12, dtype, CPU)
        direct_cosine, direct_sine = rotary_tables(head_dim, theta, 5, 12, dtype, CPU)
        assert cosine.dtype == dtype and torch.equal(cosine, direct_cosine) and torch.equal(sine, direct_sine)
    assert len(cache.tables) == 4 and not cache.replaced


def test_an_odd_head_width_is_still_refused():
    with pytest.raises(ValueError, match="even head width"):
        RotaryTableCache().lookup(7, 50.0, 0, 4, torch.float32, CPU)


def test_rotate_queries_and_keys_reads_the_process_cache_and_rotates_as_the_uncached_tables():
    theta = 321.5  # a base no other test uses, so the process cache's entry is this test's
    generator = torch.Generator().manual_seed(3)
    queries = torch.randn(2, 9, 4, 8, dtype=torch.float64, generator=generator)
    keys = torch.randn(2, 9, 2, 8, dtype=torch.float64, generator=generator)
    geometry = RotaryGeometry(8, theta, torch.float64, CPU)
    rotated_queries, rotated_keys = rotate_queries_and_keys(queries, keys, theta, 11)
    table = ROTARY_TABLES.tables[geometry]
    again_queries, _ = rotate_queries_and_keys(queries, keys, theta, 2)
    assert ROTARY_TABLES.tables[geometry] is table
    cases = ((11, rotated_queries, queries), (11, rotated_keys, keys), (2, again_queries, queries))
    for start, rotated, tensor in cases:
        cosine, sine = rotary_tables(8, theta, start, start + 9, torch.float64, CPU)
        assert torch.equal(rotated, apply_rotary(tensor, cosine, sine))


def test_a_table_first_built_in_inference_mode_serves_a_later_backward():
    cache = RotaryTableCache()
    with torch.inference_mode():
        cache.lookup(8, 70.0, 0, 12, torch.float32, CPU)
    queries = torch.randn(1, 12, 2, 8, requires_grad=True)
    cosine, sine = cache.lookup(8, 70.0, 0, 12, torch.float32, CPU)
    apply_rotary(queries, cosine, sine).square().sum().backward()
    assert queries.grad is not None and torch.isfinite(queries.grad).all()

@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_gpu_a_captured_rotation_keeps_its_table_and_a_capture_never_fills_the_cache():
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(4)
    queries = torch.randn(1, 16, 2, 8, device=device, dtype=torch.bfloat16, generator=generator)
    keys = torch.randn(1, 16, 1, 8, device=device, dtype=torch.bfloat16, generator=generator)

    def expected(theta: float, start: int) -> torch.Tensor:
        cosine, sine = rotary_tables(8, theta, start, start + 16, torch.bfloat16, device)
        return apply_rotary(queries, cosine, sine)

    cached_theta = 654.25  # bases no other test uses
    rotate_queries_and_keys(queries, keys, cached_theta, 16)  # the warm-up call builds the table
    table = ROTARY_TABLES.tables[RotaryGeometry(8, cached_theta, torch.bfloat16, device)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_queries, _ = rotate_queries_and_keys(queries, keys, cached_theta, 16)
    assert ROTARY_TABLES.tables[RotaryGeometry(8, cached_theta, torch.bfloat16, device)] is table
    rotate_queries_and_keys(queries, keys, cached_theta, 100_000)  # replaces the table the graph reads
    torch.cuda.empty_cache()
    filler = [torch.full((1 << 20,), float("nan"), device=device) for _ in range(8)]
    graph.replay()
    torch.cuda.synchronize(device)
    assert torch.equal(captured_queries, expected(cached_theta, 16))
    del filler

    uncached_theta = 987.75
    uncached_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(uncached_graph):
        uncached_queries, _ = rotate_queries_and_keys(queries, keys, uncached_theta, 40)
    assert RotaryGeometry(8, uncached_theta, torch.bfloat16, device) not in ROTARY_TABLES.tables
    uncached_graph.replay()
    torch.cuda.synchronize(device)
    assert torch.equal(uncached_queries, expected(uncached_theta, 40))
