"""Rows are rebuilt with the length distribution their benchmark client actually drew, and V0-engine
runs are validated but not fitted."""

import numpy as np
import pandas as pd
import pytest

from capacity.fidelity import calibrate

from capacity.measurements.clients import v0_engine
from capacity.measurements.row_scenario import row_scenario
from capacity.measurements.schemas import read_measurements
from capacity.paths import data_dir


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return read_measurements(data_dir() / "measurements" / "serving_vllm.csv")


def _first(rows: pd.DataFrame, source_id: str, **where) -> dict:
    sel = rows[rows.source_id == source_id]
    for k, v in where.items():
        sel = sel[sel[k] == v]
    return sel.iloc[0].to_dict()


def test_deep_dive_rows_draw_sglang_random_lengths(rows):
    """sglang.bench_serving (the ROCm deep-dive blog's client, no --random-range-ratio, default 0.0)
    draws np.random.randint(max(int(isl * 0), 1), isl + 1): prompts uniform in [1, 8192], mean ~4096,
    not 8,192 tokens each."""
    row = _first(rows, "rocm_blog_sd_deepdive_mi300x_2025-03", spec_method="none", concurrency_or_qps="0.2")
    sc, reason = row_scenario(row, speculative=False)
    assert reason is None
    cls = sc["traffic"]["classes"][0]
    assert cls["input_tokens"] == {"dist": "uniform", "low": 1, "high": 8192}
    assert cls["output_tokens"] == {"dist": "uniform", "low": 1, "high": 256}
    assert sc["traffic"]["num_requests"] == 500            # the blog's --num-prompt 500
    sglang_draw = np.random.default_rng(0).integers(max(int(8192 * 0.0), 1), 8192 + 1, 100_000)
    assert abs(sglang_draw.mean() - (cls["input_tokens"]["low"] + cls["input_tokens"]["high"]) / 2) < 30


def test_inferencex_rows_keep_the_range_ratio_0_8(rows):
    row = _first(rows, "inferencex_api_snapshot_2026-05-09", gpu="MI300X", spec_method="none", isl="8192.0", osl="1024.0")
    sc, _ = row_scenario(row, speculative=False)
    cls = sc["traffic"]["classes"][0]
    assert cls["input_tokens"] == {"dist": "uniform", "low": round(0.8 * 8192), "high": 8192}
    assert cls["output_tokens"] == {"dist": "uniform", "low": round(0.8 * 1024), "high": 1024}


@pytest.mark.parametrize("version, v0", [("v0.6.7", True), ("v0.7.3", True), ("vllm/vllm-openai-rocm:v0.18.0", False),
                                         ("vllm/vllm-openai:v0.20.0-cu130", False), ("", False),
                                         ("0.0.0-simulated", False)])
def test_v0_engine_versions(version, v0):
    assert v0_engine({"framework_version": version}) is v0


def test_v0_engine_rows_are_not_fitted(rows):
    deep = _first(rows, "rocm_blog_sd_deepdive_mi300x_2025-03", spec_method="none", concurrency_or_qps="0.2")
    assert row_scenario(deep, speculative=False)[1] is None          # still validated
    assert calibrate.fit_exclusion(deep) == calibrate.V0_NOT_FITTED
    ix = _first(rows, "inferencex_api_snapshot_2026-05-09", gpu="MI300X", spec_method="none")
    assert calibrate.fit_exclusion(ix) is None
