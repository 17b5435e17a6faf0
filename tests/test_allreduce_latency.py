"""MI300X's all-reduce priced from measured latencies (capacity/data/measurements/allreduce_latency.yaml, the QuickReduce
library's RCCL and QuickReduce tables; vLLM's own custom all-reduce from allreduce_kernels.csv), on the path vLLM takes.
Shipped since docs/seed_validation.md section 44 (step_cost.ALLREDUCE_MEASURED_LATENCY; section 39 built it).

Independent truth, none of it in the table the code reads:
- Azure's RCCL all-reduce bus bandwidth on 8 MI300X at 8 GB (the profile's measured.allreduce_busbw_gb_s, 316.82 GB/s):
  the table stops at 64 MiB, so this checks its extension to large messages;
- vLLM's and AITER's own QuickReduce int4 kernel times (allreduce_kernels.csv, PR #19744 at TP4, PR #801 at TP2 up to
  128 MiB): the library's table stands for vLLM's port of the kernel;
- vLLM's dispatch rule: custom all-reduce below 8 MiB (custom_all_reduce.py max_size), RCCL from there, QuickReduce
  from its minimum size when a codec is set (quick_all_reduce.py _QR_MIN_SIZE, the fp16 row).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capacity.cost import step_cost
from capacity.cost.step_cost import StepCostModel, measured_allreduce_s
from capacity.inputs.hardware import load_gpu, measured_allreduce
from capacity.inputs.models import load_model
from capacity.paths import data_dir

MIB = 2 ** 20


@pytest.fixture(scope="module")
def table():
    return measured_allreduce("MI300X")


def test_rccl_at_eight_gigabytes_is_azures_bus_bandwidth(table):
    """Bus bandwidth = message / time x 2 (n - 1) / n (nccl-tests' definition); Azure ND MI300X v5 measured 316.82 GB/s
    at 8 GB on 8 GPUs. The table's last two sizes (32, 64 MiB) extended to 8 GiB land within 3 % of it."""
    gpu = load_gpu("MI300X")
    size = 8 * 2 ** 30
    seconds = measured_allreduce_s(float(size), table, 8)
    busbw_gb_s = size / seconds * 2 * 7 / 8 / 1e9
    assert busbw_gb_s == pytest.approx(gpu.measured["allreduce_busbw_gb_s"], rel=0.03)


def test_the_library_table_stands_for_vllms_quickreduce(table):
    """vLLM ported QuickReduce from this library (PR #19744); its own int4 kernel times at TP2 (AITER PR #801) and TP4
    (vLLM PR #19744) from 512 KiB on are within 20 % of the library's, and AITER's 128 MiB point at TP2, twice the
    table's largest size, within 3 % of the table extended."""
    rows = pd.read_csv(data_dir() / "measurements" / "allreduce_kernels.csv")
    rows = rows[(rows.gpu == "MI300X") & (rows.kernel == "QuickReduce int4") & (rows.message_bytes >= 512 * 1024)]
    assert len(rows) >= 10
    for tp in (2, 4):
        r = rows[rows.tp == tp]
        predicted = measured_allreduce_s(r.message_bytes.to_numpy(float), table, tp, "int4", 0.0) * 1e6
        err = predicted / r.time_us.to_numpy() - 1
        assert np.abs(err).max() < 0.20, (tp, np.round(err, 2))
    big = rows[(rows.tp == 2) & (rows.message_bytes == 128 * MIB)].time_us.item()
    assert measured_allreduce_s(128.0 * MIB, table, 2, "int4", 0.0) * 1e6 == pytest.approx(big, rel=0.03)


def test_vllms_path_by_message_size(table):
    """TP4, no QuickReduce: 4 MiB runs vLLM's custom all-reduce (PR #19744's baseline, 63.86 us), 16 MiB RCCL (the
    library's 205.4 us). With int4 on, from TP4's 2 MiB floor QuickReduce int4 (4 MiB: 40.30 us); below it, custom."""
    assert measured_allreduce_s(4.0 * MIB, table, 4) * 1e6 == pytest.approx(63.86)
    assert measured_allreduce_s(16.0 * MIB, table, 4) * 1e6 == pytest.approx(205.4)
    assert measured_allreduce_s(4.0 * MIB, table, 4, "int4", 2.0 * MIB) * 1e6 == pytest.approx(40.30)
    assert measured_allreduce_s(1.0 * MIB, table, 4, "int4", 2.0 * MIB) * 1e6 == pytest.approx(22.91)
    sizes = np.array([1.0, 4.0, 16.0]) * MIB
    assert np.allclose(measured_allreduce_s(sizes, table, 4, "int4", 2.0 * MIB) * 1e6, [22.91, 40.30, 113.67])


def test_a_step_pays_two_measured_all_reduces_per_layer_over_the_efficiency(monkeypatch):
    """Llama-3.3-70B at TP8 on MI300X decoding 64 sequences: each layer all-reduces 64 x 8192 x 2 bytes = 1 MiB twice;
    with QuickReduce off that is vLLM's custom all-reduce (no TP8 measurement of it: the library's unquantized two-shot,
    20.01 us), over `efficiency.allreduce`. MI325X, a family transfer on the same platform, prices it the same."""
    monkeypatch.setattr(step_cost, "ALLREDUCE_MEASURED_LATENCY", True)
    model = load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")
    for name in ("MI300X", "MI325X"):
        cost = StepCostModel(load_gpu(name), model, 8)
        f = cost.features([1] * 64, [1000] * 64)
        expected = 2 * model.num_layers * 20.01e-6 / cost.efficiency["allreduce"]
        assert cost.time_parts(f)["allreduce"] == pytest.approx(expected)


def test_gpus_without_measurements_keep_the_latency_plus_bytes_form():
    assert measured_allreduce("H100") is None and measured_allreduce("MI355X") is None


def test_on_as_shipped_and_the_switch_restores_the_latency_plus_bytes_form(monkeypatch):
    """As shipped (section 44) MI300X prices its all-reduces from the measured latencies at `allreduce` 1, the
    microbenchmark itself; the switch off restores the latency-plus-bytes form."""
    assert step_cost.ALLREDUCE_MEASURED_LATENCY is True
    assert load_gpu("MI300X").efficiency["allreduce"] == 1.0
    model = load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")
    assert StepCostModel(load_gpu("MI300X"), model, 8)._allreduce_measured is not None
    monkeypatch.setattr(step_cost, "ALLREDUCE_MEASURED_LATENCY", False)
    assert StepCostModel(load_gpu("MI300X"), model, 8)._allreduce_measured is None


def test_tp8s_one_shot_is_derived_from_the_measured_tp2_and_tp4_one_shots(table):
    """No measurement of vLLM's custom all-reduce on 8 MI300X exists; below 256 KiB it runs one-shot there
    (csrc/custom_all_reduce.cuh: world sizes 5-8 below 256 KiB). The derived line is fitted on the measured one-shot
    sizes only (allreduce_kernels.csv: AITER PR #801 at TP2, every size; vLLM PR #19744 at TP4, below 512 KiB), and it
    reproduces each of those within 1 us; carried to TP8 it is cheaper than the two-shot stand-in up to half the limit
    and meets it at the limit (within 10 %), where vLLM switches kernels."""
    rows = pd.read_csv(data_dir() / "measurements" / "allreduce_kernels.csv")
    rows = rows[(rows.gpu == "MI300X") & rows.kernel.str.startswith("vLLM custom all-reduce")]
    for tp, below in ((2, np.inf), (4, 512 * 1024)):
        r = rows[(rows.tp == tp) & (rows.message_bytes < below)]
        alpha, per_peer = step_cost.one_shot_line(table, tp)
        assert np.abs(alpha + r.message_bytes / per_peer - r.time_us).max() < 1.0, tp
    limit = 256 * 1024
    sizes = np.array([4096.0, 32768.0, 65536.0, 131072.0, limit - 1.0])
    one_shot = measured_allreduce_s(sizes, table, 8) * 1e6
    xs, ys = table.curves[8]["fp"]
    two_shot = np.interp(sizes, xs, ys)
    assert (one_shot[:-1] < two_shot[:-1]).all()
    assert one_shot[-1] == pytest.approx(measured_allreduce_s(float(limit), table, 8) * 1e6, rel=0.10)


def test_tp8s_derived_one_shot_against_mi355xs_measured_one(table):
    """vLLM PR #39080 measured the same one-shot kernel on 8 MI355X (24-196 KiB, bf16), whose mesh links run 76.8 GB/s
    against MI300X's 64 (the profiles' scale-up bandwidths / 7). MI300X's derived TP8 one-shot is slower than that
    measurement at each size, by no more than the link ratio plus a third; the two-shot stand-in it replaces was
    more than twice it at 24 KiB."""
    rows = pd.read_csv(data_dir() / "measurements" / "allreduce_kernels.csv")
    r = rows[(rows.gpu == "MI355X") & (rows.tp == 8) & (rows.message_bytes < 256 * 1024)]
    assert len(r) >= 4
    link_ratio = load_gpu("MI355X").scaleup_bandwidth_gb_s / load_gpu("MI300X").scaleup_bandwidth_gb_s
    ratio = measured_allreduce_s(r.message_bytes.to_numpy(float), table, 8) * 1e6 / r.time_us.to_numpy()
    assert (ratio > 1.0).all() and (ratio < link_ratio + 1 / 3).all(), np.round(ratio, 2)
    xs, ys = table.curves[8]["fp"]
    assert np.interp(24576.0, xs, ys) / r.time_us.iloc[0] > 2.0


def test_the_switch_restores_the_two_shot_stand_in_at_tp8(monkeypatch, table):
    monkeypatch.setattr(step_cost, "ALLREDUCE_ONE_SHOT_DERIVED", False)
    xs, ys = table.curves[8]["fp"]
    assert measured_allreduce_s(65536.0, table, 8) * 1e6 == pytest.approx(np.interp(65536.0, xs, ys))


def test_the_large_message_switch_prices_from_vllms_nccl_size_at_the_bus_bandwidth(monkeypatch):
    """Screening switch, off as shipped (docs/seed_validation.md section 50). On, a B200 all-reduce at or above the size
    from which vLLM hands it to NCCL on capability 10.0 (TP4: 32 MiB, all_reduce_utils.py) costs the latency plus the
    ring's 2 (n - 1) / n of the message at the given bus bandwidth; below it, the fitted form is unchanged."""
    assert step_cost.LARGE_ALLREDUCE_BUSBW_GB_S == 0.0
    model = load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")
    gpu = load_gpu("B200")
    cost = StepCostModel(gpu, model, 4)
    small, large = 16.0 * MIB, 64.0 * MIB
    before = [cost._allreduce_call_s(x, cost.efficiency) for x in (small, large)]
    monkeypatch.setattr(step_cost, "LARGE_ALLREDUCE_BUSBW_GB_S", 679.61)
    assert cost._allreduce_call_s(small, cost.efficiency) == pytest.approx(before[0])
    expected = gpu.scaleup_latency_us * 1e-6 + 1.5 * large / 679.61e9
    assert cost._allreduce_call_s(large, cost.efficiency) == pytest.approx(expected)
    assert expected < before[1]
