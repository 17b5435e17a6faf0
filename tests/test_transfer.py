"""Leave one GPU out (capacity/fidelity/transfer.py): which GPUs are a fit's family siblings with rows, what a transfer
carries, and the identity that a GPU transferred onto itself is its own validation."""

from __future__ import annotations

import pandas as pd
import pytest

from capacity.fidelity import serving, transfer
from capacity.fidelity.calibrate import CalibrationResult
from capacity.inputs.hardware import HOST_EFFICIENCY_KEYS, load_gpu


@pytest.mark.parametrize("gpu, siblings", [("H100", ["H200"]), ("H200", ["H100"]), ("B200", ["B300"]),
                                           ("MI300X", []), ("MI355X", [])])
def test_siblings_are_the_familys_other_gpus_with_shipped_rows(gpu, siblings):
    """Hopper: H100 and H200 both have rows; Blackwell: B300's rows; CDNA3's MI325X has none, and CDNA4's MI350X only
    MLPerf rows that state no TP size or load, which the simulator cannot model."""
    assert transfer.siblings_with_rows(load_gpu(gpu)) == siblings


def test_a_transfer_carries_the_sources_values_and_optionally_the_targets_host_times():
    src, dst = load_gpu("MI300X"), load_gpu("MI355X")
    plain = transfer.transfer_overrides(src, dst)
    assert plain["efficiency"] == src.efficiency
    assert "expert_stream_bandwidth_tb_s" not in plain   # across a generation: fractions of the target's own HBM
    host = transfer.transfer_overrides(src, dst, target_host=True)["efficiency"]
    for k in HOST_EFFICIENCY_KEYS:
        if k in dst.efficiency:
            assert host[k] == dst.efficiency[k]
    assert {k: v for k, v in host.items() if k not in HOST_EFFICIENCY_KEYS} == \
        {k: v for k, v in src.efficiency.items() if k not in HOST_EFFICIENCY_KEYS}
    same_die = transfer.transfer_overrides(load_gpu("H100"), load_gpu("H200"))
    assert same_die["expert_stream_bandwidth_tb_s"] == load_gpu("H100").expert_stream_bw_tb_s


def test_a_gpu_transferred_onto_itself_is_its_own_validation():
    mine = transfer.predict(load_gpu("H200"), "H200", workers=1, max_rows=3)
    own = serving.run(gpus=["H200"], workers=1, max_rows=3, progress=False).rows
    cols = [f"predicted_{m}" for m in transfer.METRICS]
    pd.testing.assert_frame_equal(mine[cols], own[cols])
    assert transfer.errors(mine) == transfer.errors(own)


def test_calibrate_prints_the_siblings_error_first():
    eff = dict(load_gpu("H100").efficiency)
    res = CalibrationResult(gpu="H100", fitted=eff, start=eff, rows_used=0, skipped={}, train_errors=[],
                            lomo_errors=[{"model": "all", "metric": "tpot_ms", "n": 3, "median_ape": 0.1, "p90_ape": 0.2}],
                            sibling_errors=[{"sibling": "H200", "errors": {"tpot_ms": {"rows": 5, "median_pct": 5.0,
                                                                                        "p90_pct": 17.0}}}])
    text = res.summary_text()
    assert "Leave-one-GPU-out within the family (H200's shipped rows" in text
    assert text.index("Leave-one-GPU-out") < text.index("Leave-one-model-out")
    assert "5.0%" in text and "17.0%" in text
