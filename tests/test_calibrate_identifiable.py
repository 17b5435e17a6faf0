"""calibrate.identifiable_keys: a key is fitted only if changing it moves a fitted metric."""

from __future__ import annotations

from types import SimpleNamespace

from capacity.fidelity import calibrate


class FakePricer:
    """A run whose TPOT is step overhead + per-sequence overhead x 8 sequences (ms) + weights read at
    `hbm`: nothing else of the profile moves it."""

    def __init__(self, tpot_ms: float):
        model = SimpleNamespace(num_moe_layers=0, num_layers=32)
        self.cost = SimpleNamespace(model=model, tp=1, moe_efficiency_key="moe")
        self.rec = SimpleNamespace(row={"tpot_ms": tpot_ms})

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
