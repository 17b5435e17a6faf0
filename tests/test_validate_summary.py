"""Coverage of `capacity validate`: rows that state no load or measure nothing the simulator predicts
cannot be modelled by any simulator and are counted apart; every other skip counts against it."""

from __future__ import annotations

import pandas as pd

from capacity.validate import LOAD_NOT_STATED, NOTHING_TO_PREDICT, ValidationReport, summarize


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
