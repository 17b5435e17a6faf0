"""The error a profile's step cost carries for a case outside its fit (capacity/inputs/step_cost_fidelity.py) and
the `cross_validation` section that records it (hw_profiles/*.yaml, written by `capacity calibrate`)."""

from __future__ import annotations

import pytest
import yaml

from capacity.errors import CapacityError
from capacity.fidelity import calibrate
from capacity.fidelity.serving import default_files
from capacity.inputs.hardware import load_gpu, save_profile
from capacity.inputs.step_cost_fidelity import expected_error, margin_against_error, transferred_from
from capacity.measurements import readers
from capacity.measurements.schemas import model_aliases

CROSS_VALIDATED = ("MI300X", "MI355X", "H100", "H200", "B200")


@pytest.mark.parametrize("gpu", CROSS_VALIDATED)
def test_the_recorded_fit_is_the_one_the_shipped_rows_give(gpu):
    """What a profile says it was fitted on (rows, models, TP sizes) is what `capacity calibrate` selects from the
    shipped rows today; a change of the rows without a refit fails here."""
    profile = load_gpu(gpu)
    _, rows, _ = calibrate._read_rows(default_files(), profile, gpu, readers.Overrides(gpu=profile.name), None)
    cv = profile.cross_validation
    aliases = model_aliases()
    assert cv["rows"] == len(rows)
    assert cv["models"] == sorted({aliases.get(m, m) for m in rows["model"]})
    assert cv["tensor_parallel_sizes"] == sorted({int(float(t)) for t in rows["tp"]})


def test_each_hold_out_answers_its_own_case():
    """A model outside the fit takes leave-one-model-out; a fitted model at a fitted TP the fitted rows' error; a
    fitted model at a TP outside the fit leave-one-TP-size-out (H100's rows are TP 2-8)."""
    mi355x = load_gpu("MI355X")
    cv = mi355x.cross_validation
    dense = expected_error(mi355x, "google/gemma-4-31B-it", 1)
    assert dense["basis"] == "leave_one_model_out" and dense["figures"] == cv["leave_one_model_out"]
    assert dense["model_in_fit"] is False and "is not one of them" in dense["in_words"]
    fitted = expected_error(mi355x, "openai/gpt-oss-120b", 8)
    assert fitted["basis"] == "fitted_rows" and fitted["figures"] == cv["fitted_rows"]
    h100 = load_gpu("H100")
    tp1 = expected_error(h100, "openai/gpt-oss-120b", 1)
    assert tp1["basis"] == "leave_one_tp_size_out" and tp1["figures"] == h100.cross_validation["leave_one_tp_size_out"]


def test_a_transferred_profile_has_no_measured_error_and_says_whose_values_it_carries():
    for gpu, sibling in (("MI325X", "MI300X"), ("MI350X", "MI355X")):
        profile = load_gpu(gpu)
        assert profile.cross_validation == {} and transferred_from(profile) == sibling
        err = expected_error(profile, "google/gemma-4-31B-it", 1)
        assert err["basis"] == "sibling_leave_one_model_out" and err["sibling"] == sibling
        assert err["figures"] == load_gpu(sibling).cross_validation["leave_one_model_out"]
        assert "no serving rows" in err["in_words"] and "at least" in err["in_words"]


def test_overridden_efficiencies_are_not_the_cross_validated_ones():
    profile = load_gpu("MI355X").with_overrides(efficiency={"gemm": 0.5})
    assert profile.cross_validation == {}
    assert expected_error(profile, "openai/gpt-oss-120b", 1)["basis"] == "not_measured"
    priced = load_gpu("MI355X").with_overrides(cost_per_gpu_hour_usd=4.0)   # a price is not an efficiency
    assert priced.cross_validation == load_gpu("MI355X").cross_validation


def test_the_margin_is_read_against_the_metric_that_judges_its_slo():
    err = {"figures": {"tpot_pct": [12.0, 26.7], "ttft_pct": [29.4, 59.3], "output_tok_s_per_gpu_pct": [11.1, 29.9]}}
    assert "covers the median TPOT error (12.0 %) but not its p90 (26.7 %)" in margin_against_error(
        err, "tpot", 0.25)
    assert "exceeds that TPOT p90 error" in margin_against_error(err, "tpot", 0.30)
    assert "below the median TPOT error" in margin_against_error(err, "tok_s_per_user", 0.10)
    assert "covers the median TTFT error (29.4 %)" in margin_against_error(err, "ttft", 0.50)
    assert margin_against_error({"figures": None}, "ttft", 0.5) is None
    assert margin_against_error(err, None, None) is None


def _section(**change):
    section = {"measured_by": "capacity calibrate --gpu MI300X (test)", "rows": 3, "models": ["openai/gpt-oss-120b"],
               "tensor_parallel_sizes": [1, 8],
               "leave_one_model_out": None,
               "leave_one_tp_size_out": {"output_tok_s_per_gpu_pct": [1.0, 2.0], "tpot_pct": [3.0, 4.0],
                                         "ttft_pct": [5.0, 6.0]},
               "fitted_rows": {"output_tok_s_per_gpu_pct": [0.5, 1.0], "tpot_pct": [0.5, 1.0], "ttft_pct": [0.5, 1.0]}}
    section.update(change)
    return section


def test_a_written_profile_carries_its_own_cross_validation_and_drops_the_old(tmp_path):
    profile = load_gpu("MI300X")
    out = tmp_path / "fit.yaml"
    save_profile(profile, out, {"gemm": 0.4}, "test rows", _section())
    written = load_gpu(out)
    assert written.cross_validation == _section()
    save_profile(profile, tmp_path / "plain.yaml", {"gemm": 0.4}, "test rows")
    assert load_gpu(tmp_path / "plain.yaml").cross_validation == {}   # the old figures describe other values
    assert "cross_validation" not in yaml.safe_load((tmp_path / "plain.yaml").read_text())


def test_a_malformed_section_is_one_line_that_names_it(tmp_path):
    with pytest.raises(CapacityError, match="cross_validation") as e:
        save_profile(load_gpu("MI300X"), tmp_path / "bad.yaml", {"gemm": 0.4}, "test rows",
                     _section(fitted_rows={"tpot_pct": [1.0]}))
    assert "\n" not in str(e.value) and not (tmp_path / "bad.yaml").exists()
    doc = yaml.safe_load(open(load_gpu("MI325X").path))
    doc["cross_validation"] = _section()
    (tmp_path / "MI325X.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(CapacityError, match="transfers its sibling's"):
        load_gpu(tmp_path / "MI325X.yaml")


def test_calibrate_writes_the_all_rows_figures_in_percent():
    def table(m):
        return [{"model": "gpt-oss", "metric": k, "n": 2, "median_ape": 0.5, "p90_ape": 0.9} for k in calibrate.FIT_METRICS] + [
            {"model": "all", "metric": k, "n": 4, "median_ape": m, "p90_ape": 2 * m} for k in calibrate.FIT_METRICS]
    result = calibrate.CalibrationResult(gpu="MI300X", fitted={}, start={}, rows_used=4, skipped={},
                                         train_errors=table(0.0512), lomo_errors=table(0.1234))
    section = calibrate.cross_validation_section(result, ["gpt-oss-120b"] * 3 + ["MiniMax-M2.5"], [8, 8, 1, 2], "cmd")
    assert section["rows"] == 4 and section["models"] == ["MiniMaxAI/MiniMax-M2.5", "openai/gpt-oss-120b"]
    assert section["tensor_parallel_sizes"] == [1, 2, 8]
    assert section["leave_one_model_out"]["tpot_pct"] == [12.3, 24.7] and section["leave_one_tp_size_out"] is None
    assert section["fitted_rows"]["ttft_pct"] == [5.1, 10.2]
    result.lomo_errors = []
    assert calibrate.cross_validation_section(result, ["gpt-oss-120b"], [8], "cmd") is None


@pytest.mark.parametrize("gpu, model, tp", [("MI300X", "meta-llama/Llama-3.3-70B-Instruct", 2),
                                            ("MI355X", "openai/gpt-oss-120b", 8), ("H200", "MiniMaxAI/MiniMax-M2.5", 4)])
def test_the_slower_step_what_if_scales_every_step_by_its_factor(gpu, model, tp):
    """The plan's 'step cost + p90 error' what-if: every component of the roofline, the collectives and the fixed
    costs scale together, so a step takes exactly `factor` times as long (decode and a prompt chunk alike)."""
    from capacity.cost.step_cost import StepCostModel
    from capacity.inputs.models import load_model
    from capacity.studies.plan import slower_step_overrides

    g, m = load_gpu(gpu), load_model(model)
    slow = g.with_overrides(**slower_step_overrides(g, 1.3))
    for new, ctx in (([1] * 16, [2048] * 16), ([512, 1, 1], [512, 900, 4000])):
        before = StepCostModel(g, m, tp).step_time_s(new, ctx)
        assert StepCostModel(slow, m, tp).step_time_s(new, ctx) == pytest.approx(1.3 * before, rel=1e-9)
    assert slow.efficiency["request_overhead_ms"] == g.efficiency["request_overhead_ms"]   # a TTFT delay, not a step


def test_a_transferred_profile_checked_on_its_own_rows_gives_that_error():
    """B300 carries B200's values and records their error on B300's own serving rows (no refit): a model among
    those rows gets that error; another model the larger of it and B200's own leave-one-model-out, figure by
    figure, since both hold-outs apply to it."""
    b300, b200 = load_gpu("B300"), load_gpu("B200")
    check = b300.transfer_check
    assert check and transferred_from(b300) == "B200" and b300.cross_validation == {}
    minimax = expected_error(b300, "MiniMaxAI/MiniMax-M2.5", 4)
    assert minimax["basis"] == "family_transfer_rows" and minimax["figures"] == check["errors"]
    assert "checked on" in minimax["in_words"] and "\n" not in minimax["in_words"]
    dense = expected_error(b300, "google/gemma-4-31B-it", 1)
    lomo = b200.cross_validation["leave_one_model_out"]
    assert dense["basis"] == "family_transfer_and_sibling_leave_one_model_out"
    for key, (median, p90) in dense["figures"].items():
        assert median == max(check["errors"][key][0], lomo[key][0]) and p90 == max(check["errors"][key][1], lomo[key][1])
    assert b300.with_overrides(efficiency={"gemm": 0.5}).transfer_check == {}   # not the checked values any more


def test_the_recorded_transfer_check_is_on_the_rows_the_shipped_file_gives():
    """The rows, models and TP sizes a transfer check records are what the serving rows select for that GPU today
    (calibrate's reader: rows it could fit on); a change of the rows without a new check fails here."""
    profile = load_gpu("B300")
    _, rows, _ = calibrate._read_rows(default_files(), profile, "B300", readers.Overrides(gpu=profile.name), None)
    check = profile.transfer_check
    aliases = model_aliases()
    assert check["rows"] == len(rows)
    assert check["models"] == sorted({aliases.get(m, m) for m in rows["model"]})
    assert check["tensor_parallel_sizes"] == sorted({int(float(t)) for t in rows["tp"]})
