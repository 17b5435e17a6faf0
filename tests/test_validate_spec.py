"""Validation against the seed article (capacity.fidelity.speedups): schema, load inference, per-row
prediction, re-pricing, regret."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from capacity.fidelity import common
from capacity.fidelity import speedups as vs
from capacity.measurements import schemas
from capacity.util import jsonio
from capacity.fidelity import spec_serving as serving
from capacity.errors import CapacityError

SEED = vs.default_spec_files()[0]


@pytest.fixture(scope="module")
def seed_rows() -> pd.DataFrame:
    return schemas.read_spec_measurements(SEED)


# ------------------------------------------------------------------------------------------- schema
def test_seed_file_reads_with_the_schema(seed_rows):
    assert len(seed_rows) == 292
    assert all(c in seed_rows.columns for c in schemas.SPEC_REQUIRED)
    assert seed_rows["num_speculative_tokens"].dtype.kind in "if"
    assert schemas.is_spec_file(SEED)
    assert not schemas.is_spec_file(schemas.default_serving_file())


def test_missing_columns_name_the_file_and_the_columns(tmp_path):
    bad = tmp_path / "mine.csv"
    bad.write_text("target,method,gpu\nQwen/Qwen3-8B,EAGLE-3,MI300X\n")
    with pytest.raises(CapacityError) as e:
        schemas.read_spec_measurements(bad)
    msg = str(e.value)
    assert "mine.csv" in msg and "draft_checkpoint" in msg and "speedup" in msg and "\n" not in msg


def test_missing_and_unreadable_files_are_one_line(tmp_path):
    with pytest.raises(CapacityError, match="not found"):
        schemas.read_spec_measurements(tmp_path / "nope.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\x00\x01\x02\xff\xfe")
    with pytest.raises(CapacityError) as e:
        schemas.read_spec_measurements(binary)
    assert "\n" not in str(e.value)


def test_labels_and_rates_parse():
    assert schemas.method_name("Native MTP") == "mtp"
    assert schemas.method_name("Gemma 4 MTP") == "gemma4_mtp"
    assert schemas.method_name("EAGLE-3") == "eagle3"
    assert schemas.method_name("DFlash") == "dflash" and schemas.method_name("DSpark") == "dspark"
    with pytest.raises(CapacityError, match="unknown method"):
        schemas.method_name("Medusa-9")
    assert schemas.marginal_rates("0.9 0.8 0.7") == [0.9, 0.8, 0.7]
    with pytest.raises(CapacityError):
        schemas.marginal_rates("0.9 x")
    assert schemas.marginal_rates("0.9;0.7") == schemas.marginal_rates("0.9, 0.7") == schemas.marginal_rates("0.9 0.7") == [0.9, 0.7]


# --------------------------------------------------------------------------------------- load model
def test_bisection_picks_the_closest_integer_load():
    """A throughput exactly proportional to C: 1,234 tok/s lies between C = 12 and 13, closer to 12."""
    dep = vs.Deployment("Qwen/Qwen3-8B", "MI300X", 1, None, None, None)
    fake = lambda sc: 100.0 * sc["traffic"]["arrival"]["concurrency"]  # noqa: E731
    ld = vs.infer_concurrency(dep, 1234.0, throughput=fake)
    assert ld.concurrency == 12 and ld.bracket == (12, 13)
    assert ld.simulated_baseline_tok_s == 1200.0
    ld = vs.infer_concurrency(dep, 1290.0, throughput=fake)
    assert ld.concurrency == 13


@pytest.mark.parametrize("exponent", [1.0, 0.25])
def test_load_conditioning_is_the_baseline_elasticity_in_c(exponent):
    """For a baseline B(C) = a * C^e the elasticity d ln B / d ln C is e at every C, and a 10 % error
    in B moves the inferred C by the factor 1.1^(1/e): 1.1 when B grows like C, 1.46 when it
    saturates like C^0.25."""
    dep = vs.Deployment("Qwen/Qwen3-8B", "MI300X", 1, None, None, None)
    fake = lambda sc: 100.0 * sc["traffic"]["arrival"]["concurrency"] ** exponent  # noqa: E731
    ld = vs.infer_concurrency(dep, 100.0 * 40 ** exponent, throughput=fake)
    assert ld.concurrency == 40
    assert ld.elasticity == pytest.approx(exponent, rel=1e-12)
    assert ld.c_factor_per_10pct == pytest.approx(1.1 ** (1 / exponent), rel=1e-12)
    assert (ld.elasticity < vs.POORLY_DETERMINED) == (exponent < 0.5)


def test_inferred_load_reproduces_the_measured_baseline():
    """Re-simulating the returned C (independently of the search's cache) gives the measured baseline
    within the step between the two bracketing integer loads."""
    dep = vs.Deployment("Qwen/Qwen3-8B", "MI300X", 1, None, 16384, 4096)
    measured = 900.0
    ld = vs.infer_concurrency(dep, measured, prompts_per_user=vs.QUICK_PROMPTS_PER_USER)
    lo, hi = ld.bracket_tok_s
    assert lo <= measured <= hi and ld.bracket[1] == ld.bracket[0] + 1
    again = vs._throughput(vs.scenario_dict(dep, ld.concurrency, vs.QUICK_PROMPTS_PER_USER))
    assert again == pytest.approx(ld.simulated_baseline_tok_s, rel=1e-12)   # deterministic
    assert abs(again / measured - 1.0) <= ld.tolerance


def test_workload_respects_max_model_len():
    dep = vs.Deployment("Qwen/Qwen3-8B", "MI300X", 1, None, None, 1024)
    w = vs.workload(dep)
    assert w["input_tokens"]["high"] + w["output_tokens"]["high"] <= 1024
    assert w["output_tokens"]["low"] <= w["output_tokens"]["high"]


# ------------------------------------------------------------------------------------- end to end
def test_four_rows_of_one_target_run_end_to_end(seed_rows):
    sub = seed_rows[(seed_rows.target == "moonshotai/Kimi-K2.5") & (seed_rows.method == "EAGLE-3")
                    & (seed_rows.dataset == "GSM8K")]
    assert len(sub) == 4
    report = vs.run(rows=sub, quick=True, workers=1, progress=False)
    rows = report.rows
    assert rows["skipped"].isna().all()
    assert np.isfinite(rows["predicted_speedup"]).all() and (rows["predicted_speedup"] > 0).all()
    assert np.isfinite(rows["predicted_output_tok_s"]).all()
    # the simulator draws acceptance from the row's own marginal rates: tokens per step match
    assert np.allclose(rows["simulated_mean_accepted_length"], rows["mean_accepted_length"], atol=0.06)
    s = report.summary
    assert s["modelled"] == 4 and s["targets"]["all_modelled"]
    assert len(s["loads"]) == 1 and s["loads"][0]["concurrency"] >= 1
    jsonio.dumps(report.to_json())                        # JSON-able
    text = report.summary_text()
    assert "eagle3" in text and "Best-N regret" in text


def _row(**kw):
    base = {"target": "Qwen/Qwen3-8B", "method": "EAGLE-3", "draft_checkpoint": "RedHatAI/Qwen3-8B-Thinking-speculator.eagle3",
            "gpu": "MI300X", "tp": 1, "precision": "bf16", "dataset": "GSM8K", "num_speculative_tokens": 3,
            "per_position_acceptance": "0.8 0.6 0.4", "mean_accepted_length": 2.8, "baseline_output_tok_s": 1000.0,
            "output_tok_s": 1500.0, "speedup": 1.5, "source": "test", "max_num_batched_tokens": 16384,
            "max_model_len": 4096}
    base.update(kw)
    return base


def test_zero_acceptance_is_a_slowdown():
    """Every draft rejected: each step still emits one token per request but also drafts and verifies
    N more, so the speculative run is slower than the baseline at the same load."""
    dep = vs.Deployment.from_row(_row())
    c = 8
    base = vs._throughput(vs.scenario_dict(dep, c, vs.QUICK_PROMPTS_PER_USER))
    ld = vs.LoadInference(dep, base, c, base, (c, c), (base, base), vs.num_prompts(c, 4), 0)
    run = vs.run_row(_row(per_position_acceptance="0 0 0", mean_accepted_length=1.0), ld, vs.QUICK_PROMPTS_PER_USER)
    assert run.mean_accepted_length == 1.0
    assert run.throughput() / base < 1.0


@pytest.mark.parametrize("method,draft,n", [("EAGLE-3", "RedHatAI/Qwen3-8B-Thinking-speculator.eagle3", 3),
                                            ("DFlash", "z-lab/Qwen3-8B-DFlash-b16", 7)])
def test_repricing_equals_a_full_simulation_with_the_override(method, draft, n):
    """Without a serving-stack request delay the closed-loop schedule does not depend on step
    durations, so changing draft_pass_overhead_us changes the run's duration by (drafting steps x
    overhead units) x the change - exactly what a new simulation with `speculative.overrides` gives."""
    import dataclasses

    rates = " ".join(f"{0.8 ** (j + 1):.3f}" for j in range(n))
    row = _row(method=method, draft_checkpoint=draft, num_speculative_tokens=n, per_position_acceptance=rates)
    dep = dataclasses.replace(vs.Deployment.from_row(row), gpu_overrides={"efficiency": {"request_overhead_ms": 0.0}})
    assert vs.repricing_is_exact(dep)
    c = 6
    base = vs._throughput(vs.scenario_dict(dep, c, 4))
    ld = vs.LoadInference(dep, base, c, base, (c, c), (base, base), vs.num_prompts(c, 4), 0)
    rec = vs.run_row(row, ld, 4)
    direct = vs.run_row(row, ld, 4, overrides={common.FITTED_PARAMETER: 2500.0})
    assert rec.throughput(2500.0) == pytest.approx(direct.throughput(), rel=1e-9)
    assert rec.overhead_count == rec.drafting_steps * vs.overhead_units(schemas.method_name(method), n)
    # the per-sequence host cost of speculative steps re-prices exactly too (hardware-profile override)
    dep2 = dataclasses.replace(dep, gpu_overrides={"efficiency": {"request_overhead_ms": 0.0, common.SEQ_KEY: 900.0}})
    ld2 = dataclasses.replace(ld, deployment=dep2)
    direct2 = vs.run_row(row, ld2, 4)
    assert rec.verify_seq_count > rec.drafting_steps
    assert rec.throughput(None, 0.0, 900.0) == pytest.approx(direct2.throughput(), rel=1e-9)


def test_block_drafter_beyond_its_block_is_modelled():
    """The article ran Kimi-K2.5's block-8 DFlash drafter at N = 15; build_speculation refuses N > 7,
    unless asked to allow N past the block (as the speedup validation does), and then prices the N asked for."""
    from capacity.spec import decoding as drafting
    from capacity.inputs.hardware import load_gpu
    from capacity.inputs.models import load_model

    gpu, target = load_gpu("MI300X"), load_model("moonshotai/Kimi-K2.5")
    cfg = {"method": "dflash", "num_speculative_tokens": 15, "draft": "z-lab/Kimi-K2.5-DFlash",
           "acceptance": {"model": "iid", "alpha": 0.8}}
    with pytest.raises(CapacityError, match="block"):
        drafting.build_speculation(cfg, gpu, target, 4)
    spec = drafting.build_speculation(cfg, gpu, target, 4, allow_n_past_block=True)
    assert spec.num_spec_tokens(8) == 15
    t15 = spec.draft_cost.time_s(8, 8 * 16, 8 * 1000, 15)
    t7 = spec.draft_cost.time_s(8, 8 * 8, 8 * 1000, 7)
    assert t15 > t7 > 0


# ------------------------------------------------------------------------------------ error, regret
def test_regret_of_a_perfect_ranking_is_zero_and_of_a_wrong_one_is_the_loss():
    t = pd.DataFrame({
        "target": ["a"] * 3 + ["b"] * 3, "method": ["m"] * 6, "dataset": ["d"] * 6,
        "num_speculative_tokens": [1, 2, 3, 1, 2, 3],
        "output_tok_s": [100.0, 120.0, 110.0, 100.0, 90.0, 80.0],
        "perfect": [1.0, 3.0, 2.0, 9.0, 5.0, 1.0],          # same order as measured
        "wrong": [1.0, 2.0, 3.0, 1.0, 2.0, 3.0],             # picks N=3 in both groups
    })
    r = vs.best_n_regret(t, pred="perfect")
    assert (r.regret == 0).all() and (r.measured_best_n == r.model_best_n).all()
    r = vs.best_n_regret(t, pred="wrong")
    assert r.set_index("target").regret.to_dict() == pytest.approx({"a": 10 / 120, "b": 20 / 100})


def test_error_table_is_median_and_p90_of_relative_error():
    t = pd.DataFrame({"target": ["x"] * 10, "speedup": [2.0] * 10,
                      "predicted_speedup": [2.0 * (1 + e) for e in np.linspace(-0.1, 0.35, 10)]})
    (row,) = vs.error_table(t, "target")
    errs = np.abs(np.linspace(-0.1, 0.35, 10))
    assert row["median_ape"] == pytest.approx(np.median(errs))
    assert row["p90_ape"] == pytest.approx(np.quantile(errs, 0.9))
    assert row["n"] == 10


@pytest.mark.parametrize("n", [292, 100, 37, 10])
def test_rows_above_the_threshold_and_the_most_the_p90_allows(n):
    """`most_above` is the largest k such that k rows above 20 %, however far above, still leave the 90th percentile
    (numpy's linear interpolation, as error_table) at or below 20 % when the rest are below it; with one more row far
    enough above it is over."""
    def frame(k):
        e = np.r_[np.full(n - k, 0.10), np.full(k, 0.50)]
        return pd.DataFrame({"target": ["a"] * (n - k) + ["b"] * k, "speedup": 2.0,
                             "predicted_speedup_default": 2.0 * (1 + e)})
    k = vs.rows_above(frame(0))["most_above"]
    assert np.quantile(np.r_[np.full(n - k, 0.10), np.full(k, 1e6)], 0.9) <= 0.20
    assert np.quantile(np.r_[np.full(n - k - 1, 0.10), np.full(k + 1, 1e6)], 0.9) > 0.20
    a = vs.rows_above(frame(k + 1))
    assert a["above"] == k + 1 and a["by_target"] == {"b": k + 1} and a["rows"] == n


def test_fit_recovers_known_overheads():
    """Rows generated from known per-method pass overheads, per-GPU per-sequence host costs and
    per-GPU costs per verified draft token (synthetic RowRuns on two GPUs): the fit returns them."""
    rng = np.random.default_rng(0)
    runs, methods = [], []
    truth = {"eagle3": 700.0, "dflash": 1500.0, common.seq_key("MI300X"): 400.0, common.seq_key("MI355X"): 120.0,
             common.tok_key("MI300X"): 30.0, common.tok_key("MI355X"): 45.0}
    for i in range(24):
        m = "eagle3" if i % 2 else "dflash"
        runs.append(vs.RowRun(duration_s=10.0 + rng.random(), overhead_us=100.0, overhead_count=1000.0 * (1 + i % 5),
                              drafting_steps=1000, output_tokens=20000.0, num_steps=1000, mean_accepted_length=3.0,
                              gpu="MI300X" if i % 3 else "MI355X", verify_seq_count=1000.0 * (4 + i % 7),
                              seq_overhead_us=0.0, draft_token_count=1000.0 * (3 + (i * 7) % 11)))
        methods.append(m)
    base = np.full(24, 1000.0)
    measured = vs.predict_with(runs, methods, base, truth)
    fitted = vs.fit_overheads(runs, methods, base, measured, {"eagle3": 100.0, "dflash": 150.0})
    for k, v in truth.items():
        assert fitted[k] == pytest.approx(v, rel=1e-4), k


def test_fold_fallbacks_never_use_the_left_out_value():
    """A method or GPU the fold has no rows for takes the fold's same-kind methods / other GPUs."""
    fit = {"dflash": 1000.0, "eagle3": 300.0, "mtp": 500.0, common.seq_key("MI300X"): 450.0, common.tok_key("MI300X"): 30.0}
    out = vs.fold_fallbacks(fit, ["dflash", "dspark", "eagle3", "mtp", "gemma4_mtp"], ["MI300X", "MI355X"])
    assert out["dspark"] == 1000.0                       # block drafter: DFlash's backbone
    assert out["gemma4_mtp"] == pytest.approx(400.0)     # sequential: mean of EAGLE-3 and MTP
    assert out[common.seq_key("MI355X")] == 450.0
    assert out[common.tok_key("MI355X")] == 30.0


# ------------------------------------------------------------------------------------ serving rows
def test_serving_rows_are_planned_with_reasons():
    df = pd.read_csv(schemas.default_serving_file(), dtype=str, keep_default_na=False)
    df = df[df.source_id.str.startswith("rocm_blog")].reset_index(drop=True)
    cases = serving.plan_serving_rows(df)
    assert len(cases) == len(df)
    by = {(c.row["source_id"], c.row["model"], c.row["spec_method"], c.row["concurrency_or_qps"]): c for c in cases}
    skipped = [c for c in cases if c.status == "skip"]
    assert all(c.reason for c in skipped)
    ep = [c for c in cases if c.status == "baseline" and "MiniMax-M2.5" in c.row["model"]]   # TP4 + EP baselines
    assert ep and all(c.scenario["deployment"].get("expert_parallel") is True for c in ep)
    assert any("Llama-3.2-1B" in c.reason for c in skipped)                # draft without a config
    single = [c for c in cases if c.status == "predict"]
    assert single and all(c.scenario["traffic"]["arrival"]["concurrency"] == 1 for c in single)
    pinned = [c for c in cases if c.status == "pin"]
    assert pinned and all(c.speculative["num_speculative_tokens"] > 0 for c in pinned)
    assert all(not math.isnan(c.measured) for c in single + pinned)
    assert len(by) >= 1


def test_a_row_that_cannot_be_modelled_says_why(tmp_path, seed_rows):
    bad = seed_rows.iloc[[0]].drop(columns=["file", "row"]).assign(gpu="TPUv9")
    path = tmp_path / "mine.csv"
    bad.to_csv(path, index=False)
    report = vs.run(files=[str(path)], quick=True, workers=1, progress=False)
    assert report.serving is None                       # given files: no serving rows
    reason = report.rows["skipped"].iloc[0]
    assert isinstance(reason, str) and "TPUv9" in reason and "\n" not in reason
    assert report.summary["modelled"] == 0 and not report.summary["targets"]["all_modelled"]
    assert "0 of 1 modelled" in report.summary_text()
