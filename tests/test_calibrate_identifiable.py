"""calibrate.identifiable_keys: a key is fitted only if changing it moves a fitted metric."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from capacity.fidelity import calibrate


class FakePricer:
    """A run whose TPOT is step overhead + per-sequence overhead x 8 sequences (ms) + weights read at
    `hbm`: nothing else of the profile moves it."""

    def __init__(self, tpot_ms: float):
        model = SimpleNamespace(num_moe_layers=0, num_layers=32)
        self.cost = SimpleNamespace(model=model, tp=1, moe_efficiency_key="moe")
        self.rec = SimpleNamespace(row={"tpot_ms": tpot_ms}, prompt_tokens=np.array([1000]))

    def predict(self, eff):
        tpot = eff["step_overhead_ms"] + 8 * eff["per_seq_overhead_us"] * 1e-3 + 10.0 / eff["hbm"]
        return {"predicted_tpot_ms": tpot}


def test_an_overhead_fitted_to_about_zero_is_still_tested():
    """A per-sequence overhead left at 1e-25 us by an earlier fit moves TPOT when raised by a fixed step
    (a 10 % change of ~0 would move nothing and wrongly call it unidentifiable)."""
    start = {k: 0.5 for k in calibrate.FITTED_KEYS}
    start.update(step_overhead_ms=1e-20, per_seq_overhead_us=1e-25, hbm=0.8)
    keys, why = calibrate.identifiable_keys([FakePricer(14.0), FakePricer(15.0)], start, ("tpot_ms",))
    assert "per_seq_overhead_us" in keys and "step_overhead_ms" in keys and "hbm" in keys
    assert "gemm" in why and "attention" in why            # nothing in these runs depends on them
    assert "moe" in why and "allreduce" in why and "layer_overhead_us" in why   # the structural rules


class TpPricer(FakePricer):
    """A run of model `model` at TP `tp` whose TPOT is 10 ms of weights / hbm."""

    def __init__(self, tpot_ms: float, tp: int, model: str = "m"):
        super().__init__(tpot_ms)
        self.cost.tp = tp
        self.rec.row = {"tpot_ms": tpot_ms, "model": model}

    def predict(self, eff):
        return {"predicted_tpot_ms": 10.0 / eff["hbm"]}


def test_leave_one_tp_size_out_predicts_each_size_from_the_others_only():
    """TP1 rows measured as if hbm were 0.5 (TPOT 20 ms), TP2 rows as if 0.8 (12.5 ms). Holding out TP1
    fits hbm = 0.8 on TP2 alone and predicts TP1 at 12.5 ms (|error| 37.5 %); holding out TP2 fits 0.5
    and predicts 20 ms (60 %). The pooled median of the four rows is their middle: 48.75 %."""
    rows = [TpPricer(20.0, 1), TpPricer(20.0, 1), TpPricer(12.5, 2), TpPricer(12.5, 2)]
    start = {k: 0.5 for k in calibrate.FITTED_KEYS} | {"hbm": 0.6}
    table, fits = calibrate.leave_one_group_out(rows, start, ("hbm",), {"metrics": ("tpot_ms",)},
                                                lambda ps, eff: ps, lambda p: p.cost.tp)
    assert fits[1]["hbm"] == pytest.approx(0.8, rel=1e-6) and fits[2]["hbm"] == pytest.approx(0.5, rel=1e-6)
    pooled = [g for g in table if g["model"] == "all" and g["metric"] == "tpot_ms"][0]
    assert pooled["n"] == 4
    assert pooled["median_ape"] == pytest.approx((0.375 + 0.6) / 2, rel=1e-6)


def test_one_group_gives_no_cross_validation():
    rows = [TpPricer(20.0, 1), TpPricer(21.0, 1)]
    start = {k: 0.5 for k in calibrate.FITTED_KEYS}
    assert calibrate.leave_one_group_out(rows, start, ("hbm",), {}, lambda ps, eff: ps, lambda p: p.cost.tp) == ([], {})


def test_a_fitted_all_reduce_is_bounded_by_its_measured_ceiling_not_by_one():
    # H200's NCCL NVLS bus bandwidth (479.98 GB/s, Azure ND H200 v5) beats its 450 GB/s NVLink: the fit may go there
    # and no further; a fraction without such a measurement, and every overhead, keep their BOUNDS.
    from capacity.fidelity.calibrate import BOUNDS, upper_bound
    from capacity.inputs.hardware import load_gpu
    h200, mi300x = load_gpu("H200"), load_gpu("MI300X")
    assert upper_bound("allreduce", h200) == pytest.approx(479.98 / 450)
    assert upper_bound("allreduce", mi300x) == 1.0
    assert upper_bound("gemm", h200) == 1.0
    assert upper_bound("layer_overhead_us", h200) == BOUNDS["layer_overhead_us"][1]


def test_a_re_priced_time_below_zero_is_a_large_error_not_a_crash():
    """Re-pricing far from the recorded schedule can shift a TTFT below zero (scripts/screen_cost_terms.py on a
    variant profile hit it): the fit must see a very large, finite residual there, not fail on log(<= 0)."""
    row = {"output_tok_s_per_gpu": 100.0, "ttft_ms": 30.0, "tpot_ms": 5.0}
    pricer = SimpleNamespace(rec=SimpleNamespace(row=row),
                             predict=lambda eff: {"predicted_output_tok_s_per_gpu": 100.0,
                                                  "predicted_ttft_ms": -10.0, "predicted_tpot_ms": 5.0})
    r = calibrate._residuals(np.array([0.5]), ("gemm",), {}, [pricer])
    assert np.all(np.isfinite(r)) and r[0] == 0.0 and r[2] == 0.0
    assert r[1] == pytest.approx(np.log(calibrate.NONPOSITIVE_PREDICTION_RATIO)) and r[1] < -10
