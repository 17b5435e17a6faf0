"""AITER's tuned fused-MoE kernel times (capacity/data/measurements/aiter_fused_moe.csv) against physics.

Truth: the shape of each row (tokens, hidden, expert width per GPU, experts, top-k) and the GPUs' datasheet peaks
in hw_profiles (vendor dense TFLOPS, HBM TB/s). The file was transcribed from ROCm/aiter's tuner output; these tests
check the transcription and the peaks, not the step-cost model (scripts/check_moe_kernels.py compares the model with
the kernels; docs/seed_validation.md section 41).
"""
import numpy as np
import pandas as pd
import pytest

from capacity.inputs.hardware import load_gpu
from capacity.paths import data_dir

WEIGHT_BYTES = {"float8_e4m3fn": 1.0, "float8_e4m3fnuz": 1.0, "bfloat16": 2.0}   # fnuz: CDNA3's FP8 encoding
COMPUTE_DTYPE = {"float8_e4m3fn": "fp8", "float8_e4m3fnuz": "fp8", "bfloat16": "bf16"}


@pytest.fixture(scope="module")
def rows():
    d = pd.read_csv(data_dir() / "measurements" / "aiter_fused_moe.csv")
    assert d.source_url.str.startswith("https://github.com/ROCm/aiter/blob/").all()
    return d


def _flops(d):
    """A gated expert MLP: gate and up (2 x width) then down (width), two FLOPs per multiply-add."""
    return 2.0 * d.tokens * d.topk * d.model_dim * d.inter_dim * 3


def test_aiter_tflops_column_is_the_shape_over_the_time(rows):
    """AITER's own `tflops` column recomputed from the shape and `us` (a transcription check, row by row)."""
    recomputed = _flops(rows) / (rows.kernel_us * 1e-6) / 1e12
    np.testing.assert_allclose(recomputed, rows.tflops_aiter, rtol=0.01)


def test_no_kernel_beats_its_gpus_roofline(rows):
    """Each time is at least the FLOPs over the vendor dense peak of the activations' dtype and the touched experts'
    weights over the HBM peak (every expert a token is routed to is read once: E (1 - (1 - k/E)^tokens) expected)."""
    for _, r in rows.iterrows():
        gpu = load_gpu(r.gpu)
        peak = gpu.peak_dense_tflops[COMPUTE_DTYPE[r.activation_dtype]] * 1e12
        touched = r.experts * (1 - (1 - r.topk / r.experts) ** r.tokens)
        weight_bytes = touched * 3 * r.model_dim * r.inter_dim * WEIGHT_BYTES[r.weight_dtype]
        floor_us = max(_flops(pd.DataFrame([r])).iloc[0] / peak, weight_bytes / (gpu.hbm_bandwidth_tb_s * 1e12)) * 1e6
        assert r.kernel_us >= floor_us, (r.gpu, r.checkpoint, r.tokens, r.inter_dim, r.kernel_us, floor_us)


def test_cdna4_over_cdna3_at_one_shape_is_bounded_by_the_datasheets(rows):
    """The same bf16 kernel shape (Qwen3-235B-A22B's experts, 384 wide per GPU) on MI355X and MI300X: the speed ratio
    at no token count exceeds the larger of the two datasheet ratios (bf16 peak 2.5 / 1.31 PFLOPS, HBM 8.0 / 5.3 TB/s);
    it is about 1 at one token (a fixed kernel time), above the HBM ratio once every expert's weights are streamed (64
    tokens and more) and within 5 % of the compute ratio at 32k tokens."""
    q = rows[rows.checkpoint.str.startswith("Qwen3-235B") & (rows.inter_dim == 384)]
    fast = q[q.gpu == "MI355X"].set_index("tokens").kernel_us
    slow = q[q.gpu == "MI300X"].set_index("tokens").kernel_us
    ratio = (slow / fast).dropna()
    assert len(ratio) == 16
    mi355x, mi300x = load_gpu("MI355X"), load_gpu("MI300X")
    compute = mi355x.peak_dense_tflops["bf16"] / mi300x.peak_dense_tflops["bf16"]
    hbm = mi355x.hbm_bandwidth_tb_s / mi300x.hbm_bandwidth_tb_s
    assert (ratio <= max(compute, hbm) * 1.02).all(), ratio.to_dict()
    assert 0.9 < ratio[1] < 1.1
    assert (ratio[ratio.index >= 64] > hbm).all(), ratio.to_dict()
    assert ratio[32768] > 0.95 * compute
