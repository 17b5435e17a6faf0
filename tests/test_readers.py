"""Readers of the files real tools write, each tested on a real public file (tests/data/vllm/, sources in
tests/data/README.md). Expected values are computed from the file's own raw content (per-request lists,
printed counts), never copied from the reader's output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capacity.measurements import readers

from capacity.measurements import row_scenario as validate
from capacity.spec.acceptance import acceptance_from_config
from capacity.cli import main
from capacity.errors import CapacityError

DATA = Path(__file__).parent / "data" / "vllm"
DETAILED = DATA / "bench_serve_result_detailed.json"
NODETAIL = DATA / "bench_serve_result_nodetail.json"
APPEND = DATA / "benchmark_serving_append_l40s.jsonl"
LOG = DATA / "specdecode_club3090_vllm0.20.1.log"
OLD_LOG = DATA / "specdecode_old_format_pr15902.log"
PROM = DATA / "metrics_pr41916_excerpt.prom"
SHIPPED = Path(__file__).parents[1] / "capacity" / "data" / "measurements"


@pytest.mark.parametrize("path, kind", [
    (DETAILED, "vllm_result"), (NODETAIL, "vllm_result"), (APPEND, "vllm_result"), (LOG, "vllm_log"),
    (OLD_LOG, "vllm_log"), (PROM, "prometheus"), (SHIPPED / "serving_vllm.csv", "serving_csv"),
    (SHIPPED / "seed_spec_decode.csv", "spec_csv"),
])
def test_format_is_detected_from_content(path, kind):
    assert readers.detect_format(path) == kind


def test_unknown_formats_are_one_line_errors():
    with pytest.raises(CapacityError, match="unknown measurement format"):
        readers.detect_format(Path(__file__).parent / "data" / "azure2023_conv_first500.csv")
    config = Path(__file__).parents[1] / "capacity" / "data" / "model_configs" / "meta-llama__Llama-3.1-8B.json"
    with pytest.raises(CapacityError, match="not a `vllm bench serve --save-result` result"):
        readers.detect_format(config)


@pytest.mark.parametrize("name, drop", [("seed_spec_decode.csv", "baseline_output_tok_s"),
                                        ("serving_vllm.csv", "model")])
def test_a_known_csv_missing_a_column_says_which(tmp_path, capsys, name, drop):
    """A shipped measurement file with one required column removed is told which column it lacks, not
    "unknown format"."""
    bad = tmp_path / name
    pd.read_csv(SHIPPED / name, dtype=str, keep_default_na=False).drop(columns=[drop]).head(5).to_csv(bad, index=False)
    assert main(["validate", str(bad), "--quiet"]) == 2
    assert f"missing columns {drop} " in capsys.readouterr().err


def test_detailed_result_row_replays_the_recorded_requests():
    raw = json.loads(DETAILED.read_text())
    (row,) = readers.read_vllm_results(DETAILED).to_dict(orient="records")
    assert row["tp"] == 2 and row["num_gpus"] == 2                      # --metadata tp=2
    assert row["model"] == "meta-llama/Llama-3.1-8B"                     # -Instruct has the base architecture
    assert row["load_type"].startswith("poisson") and row["concurrency_or_qps"] == 20.0
    assert row["input_lens"] == raw["input_lens"] and row["output_lens"] == raw["output_lens"]
    assert row["ttft_ms"] == pytest.approx(np.median(raw["ttfts"]) * 1e3)
    tpots = [(lat - t) / (o - 1) for lat, t, o in zip(raw["latencies"], raw["ttfts"], raw["output_lens"])]
    assert row["tpot_ms"] == pytest.approx(np.median(tpots) * 1e3)
    assert row["output_tok_s_per_gpu"] == pytest.approx(sum(raw["output_lens"]) / raw["duration"] / 2)
    # the scenario and stream replay those six requests at their recorded send times
    assert validate.row_scenario(row)[1] == "no hardware profile for GPU ''"   # the JSON does not say
    row = dict(row, gpu="MI300X")                                              # --gpu MI300X
    sc, reason = validate.row_scenario(row)
    assert reason is None and sc["traffic"]["arrival"] == {"process": "poisson", "rate_rps": 20.0}
    stream = validate.row_stream(row, sc)
    assert stream.prompt_tokens.tolist() == raw["input_lens"]
    assert stream.arrival_s == pytest.approx(np.array(raw["start_times"]) - raw["start_times"][0])


def test_result_without_tp_needs_it_and_uses_mean_lengths():
    with pytest.raises(CapacityError, match=r"--tp N.*--metadata tensor_parallel_size=N"):
        readers.read_vllm_results(NODETAIL)
    raw = json.loads(NODETAIL.read_text())
    (row,) = readers.read_vllm_results(NODETAIL, readers.Overrides(tp=1)).to_dict(orient="records")
    assert "input_lens" not in row
    assert row["isl"] == raw["total_input_tokens"] / raw["completed"] == 1024


def test_old_benchmark_serving_append_file():
    raw = [json.loads(line) for line in APPEND.read_text().splitlines()]
    rows = readers.read_vllm_results(APPEND, readers.Overrides(tp=1)).to_dict(orient="records")
    assert [r["concurrency_or_qps"] for r in rows] == [10.0, 30.0, math.inf]
    assert [r["osl"] for r in rows] == [500.0] * 3                 # --metadata output_len=500
    assert rows[0]["tpot_ms"] == raw[0]["median_tpot_ms"] and rows[0]["gpu"] == "4xNVIDIA_L40S"
    reasons = [validate.row_scenario(r)[1] for r in rows]
    assert all("no hardware profile for GPU '4xNVIDIA_L40S'" in r for r in reasons[:2])
    # with a known GPU and model, the request-rate-inf burst is still reported as not modelled
    burst = dict(rows[2], gpu="MI300X", model="meta-llama/Llama-3.1-8B")
    assert "not modelled" in validate.row_scenario(burst)[1]


def test_failed_requests_and_unknown_versions_are_rejected(tmp_path):
    raw = json.loads(DETAILED.read_text())
    bad = tmp_path / "failed.json"
    bad.write_text(json.dumps(dict(raw, failed=1, completed=5)))
    with pytest.raises(CapacityError, match=r"failed.json: 1 of 6 requests failed"):
        readers.read_vllm_results(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in raw.items() if k != "output_throughput"}))
    with pytest.raises(CapacityError, match="unknown `vllm bench serve` result version: missing output_throughput"):
        readers.read_vllm_results(old)


def test_spec_decode_log_counts():
    rec = readers.read_spec_log(LOG)
    # the two logged intervals: Drafted 1572 and 1590 tokens over 6 positions; Accepted 489 + 455
    drafts = np.array([1572 / 6, 1590 / 6])
    assert rec.num_spec_tokens == 6 and rec.num_drafts == pytest.approx(drafts.sum()) and rec.num_accepted_tokens == 944
    rates = np.array([[0.740, 0.473, 0.309, 0.187, 0.099, 0.057], [0.728, 0.445, 0.275, 0.151, 0.075, 0.042]])
    assert rec.marginal == pytest.approx(drafts @ rates / drafts.sum())
    # vLLM printed each interval's mean acceptance length with 2 decimals: 2.87 and 2.72
    assert rec.mean_acceptance_length == pytest.approx((2.87 * drafts[0] + 2.72 * drafts[1]) / drafts.sum(), abs=0.005)
    # the profile it yields is a chain the simulator accepts, with the same P(A >= k)
    model = acceptance_from_config(readers.acceptance_config(rec), method="mtp", target=None)
    assert model.survival(6) == pytest.approx(rec.marginal, abs=1e-4)


def test_old_log_without_per_position_rates_is_rejected():
    with pytest.raises(CapacityError, match="no per-position acceptance"):
        readers.read_spec_log(OLD_LOG)


def test_prometheus_counters_ignore_created_timestamps(tmp_path):
    totals = readers.prometheus_totals(PROM)
    # the PR's point: the _created gauge (1.78e9) must not be added to the 6,491,797 drafts
    assert totals["vllm:spec_decode_num_drafts_total"] == 6491797
    assert totals["vllm:spec_decode_num_draft_tokens_total"] == 6491797
    with pytest.raises(CapacityError, match="missing vllm:spec_decode_num_accepted_tokens_total"):
        readers.read_prometheus(PROM)
    zero = tmp_path / "zero.prom"
    zero.write_text(PROM.read_text().replace("} 6.491797e+06", "} 0"))
    with pytest.raises(CapacityError, match="made no speculative drafts"):
        readers.read_prometheus(zero)


def test_cli_validate_reads_results_and_logs(capsys):
    assert main(["validate", str(DETAILED), "--gpu", "MI300X", "--quiet", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    (row,) = payload["rows"]
    assert row["skipped"] is None and row["predicted_ttft_ms"] > 0
    assert main(["validate", str(LOG), "--quiet"]) == 0
    assert "N=6, 527 drafts" in capsys.readouterr().out
    assert main(["validate", str(NODETAIL), "--quiet"]) == 2
    assert "tensor-parallel size unknown" in capsys.readouterr().err
