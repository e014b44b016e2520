import pytest

from benchmarks.nccl_overlap import KernelRun, kernel_runs, merged, overlap_cost, overlap_with


def kernel(name, start, duration):
    return {"cat": "kernel", "name": name, "ts": start, "dur": duration}


def test_runs_split_into_compute_and_nccl_and_skip_other_events():
    events = [
        kernel("gemm", 10, 5),
        kernel("ncclDevKernel_SendRecv", 0, 30),
        {"cat": "gpu_memset", "name": "Memset", "ts": 1, "dur": 1},
        kernel("gemm", 2, 3),
    ]
    compute, nccl = kernel_runs(events)
    assert [run.start for run in compute] == [2, 10]
    assert [run.name for run in nccl] == ["ncclDevKernel_SendRecv"]


def test_the_grid_tells_one_kernel_at_two_shapes_apart():
    events = [
        dict(kernel("gemm", 0, 5), args={"grid": [4, 1, 1]}),
        dict(kernel("gemm", 9, 50), args={"grid": [64, 1, 1]}),
    ]
    compute, _ = kernel_runs(events)
    assert [run.name for run in compute] == ["gemm grid=(4, 1, 1)", "gemm grid=(64, 1, 1)"]


def test_overlap_of_merged_spans():
    spans = merged([KernelRun("a", 0, 10), KernelRun("b", 5, 15), KernelRun("c", 20, 30)])
    assert spans == [(0, 15), (20, 30)]
    assert overlap_with(spans, 10, 25) == 10
    assert overlap_with(spans, 15, 20) == 0
    assert overlap_with(spans, -5, 40) == 25


def test_excess_compares_runs_beside_nccl_with_runs_alone():
    compute = [
        KernelRun("gemm", 0, 100),  # alone: 100 us
        KernelRun("gemm", 100, 200),  # alone
        KernelRun("gemm", 1000, 1130),  # beside NCCL: 130 us, 30 more than alone
        KernelRun("norm", 1130, 1140),  # beside NCCL, never alone: not compared
    ]
    nccl = [KernelRun("ncclDevKernel_SendRecv", 900, 1135)]
    cost = overlap_cost(compute, nccl)
    assert cost.overlapped_kernels == 2
    assert cost.compared_kernels == 1
    assert cost.excess_ms == pytest.approx(0.030)
    assert cost.nccl_ms == pytest.approx(0.235)
    assert cost.nccl_beside_compute_ms == pytest.approx(0.135)
    assert cost.by_name == (("gemm", pytest.approx(0.030), 1),)
