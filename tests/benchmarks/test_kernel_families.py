"""benchmarks/common.py's kernel families: what a whole-step profile's table by family (issue 37) groups."""

from __future__ import annotations

import pytest

from benchmarks.common import kernel_family, time_by_family


@pytest.mark.parametrize("name, family", [
    ("nvjet_tst_192x192_64x4_1x2_h_bz_coopB_TNN", "matrix products (cuBLAS / CUTLASS)"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matrix products (cuBLAS / CUTLASS)"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention (flash / memory-efficient)"),
    ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention (flash / memory-efficient)"),
    ("gla_bwd_kernel_smooth_dqkg", "recurrent operators (Triton)"),
    ("simple_gla_fwd_kernel_output", "recurrent operators (Triton)"),
    ("chunk_state_scan_pair_kernel", "recurrent operators (Triton)"),
    ("ssd_map_bwd_kernel", "recurrent operators (Triton)"),
    ("swiglu_bwd_kernel", "pointwise operators (Triton)"),
    ("short_convolution_bwd_kernel", "pointwise operators (Triton)"),
    ("gated_rms_norm_fwd_kernel", "norms"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norms"),
    ("void at::native::cunn_SoftMaxForward<4, float, float>", "loss and softmax"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "copies, casts, fills"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "reductions"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>", "elementwise"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
    ("something_new", "other"),
])
def test_kernels_fall_into_their_family(name, family):
    assert kernel_family(name) == family


def test_time_by_family_sums_and_orders():
    totals = time_by_family({"gla_fwd": 1.0, "simple_gla_bwd": 2.0, "nvjet_x": 5.0, "odd": 0.5})
    assert list(totals) == ["matrix products (cuBLAS / CUTLASS)", "recurrent operators (Triton)", "other"]
    assert totals["recurrent operators (Triton)"] == 3.0
