"""Coverage of `capacity validate`: rows that state no load or measure nothing the simulator predicts
cannot be modelled by any simulator and are counted apart; every other skip counts against it."""

from __future__ import annotations

import pandas as pd

from capacity.fidelity.serving import ValidationReport, summarize
from capacity.measurements.row_scenario import LOAD_NOT_STATED, NOTHING_TO_PREDICT


def test_coverage_counts_uncomparable_rows_apart() -> None:
    rows = pd.DataFrame({
        "gpu": ["MI300X"] * 6, "model": ["m"] * 6,
        "tpot_ms": [10.0, 10.0, None, None, 10.0, 10.0], "predicted_tpot_ms": [11.0, 9.0, None, None, None, None],
        "skipped": [None, None, NOTHING_TO_PREDICT, LOAD_NOT_STATED, "unknown model 'x'",
                    "speculative decoding rows are validated with the speculative model (issue 3)"],
    })
    s = summarize(rows)
    assert (s["given"], s["comparable"], s["modelled"]) == (6, 4, 2)
    text = ValidationReport(rows, s).summary_text()
    assert "2 of 6 rows modelled (33%)" in text and "2 of the 4 that state a load" in text and "(50%)" in text


def test_coverage_is_also_given_per_gpu() -> None:
    rows = pd.DataFrame({"gpu": ["MI300X", "MI300X", "MI355X"], "model": ["m"] * 3,
                         "tpot_ms": [10.0] * 3, "predicted_tpot_ms": [10.0, None, 10.0],
                         "skipped": [None, "unknown model 'x'", None]})
    s = summarize(rows)
    assert s["coverage_by_gpu"] == {"MI300X": {"given": 2, "modelled": 1}, "MI355X": {"given": 1, "modelled": 1}}
    assert "Coverage by GPU: MI300X 1 of 2, MI355X 1 of 1" in ValidationReport(rows, s).summary_text()


def test_v0_engine_rows_are_labelled_in_the_table() -> None:
    """vLLM 0.8 was the first release with the V1 engine on by default (its release notes), so a v0.6.7 row
    ran V0: predicted but never fitted, and the table says so beside its errors."""
    rows = pd.DataFrame({"gpu": ["MI300X"] * 2, "model": ["m"] * 2, "framework_version": ["v0.6.7", "v0.18.0"],
                         "e2e_ms": [10.0, 10.0], "predicted_e2e_ms": [500.0, 10.0], "skipped": [None, None]})
    s = summarize(rows)
    labels = {g["model"]: g["median_ape"] for g in s["by_gpu_model_metric"]}
    assert labels == {"m [V0 engine]": 49.0, "m": 0.0}
    assert "[V0 engine]: vLLM < 0.8 ran the V0 engine" in ValidationReport(rows, s).summary_text()
