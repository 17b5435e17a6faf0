"""How far a GPU profile's step cost can be trusted for one model and TP size: the error its own
cross-validation measured for a case like this one (the profile's `cross_validation` section, written by
`capacity calibrate`).

A user asks about what was not fitted: a model the GPU was not calibrated on, a TP size, a GPU without
serving rows. The figure that applies is the error of the same kind of hold-out, not the error on the rows
fitted on (docs/seed_validation.md; README "Fidelity"):
  * the model and the TP size are both among the rows fitted on: the fitted rows' error (in sample);
  * the model is not: leave-one-model-out;
  * the model is, the TP size is not: leave-one-TP-size-out;
  * the profile transfers a sibling's efficiencies and records their error on its own serving rows
    (`family_transfer.checked_on`, no refit): that error, for a model among those rows; for another model the
    sibling's own leave-one-model-out too, the larger of the two per figure (both hold-outs apply);
  * the profile transfers a sibling's efficiencies with no rows of its own: not measured; the sibling's
    own leave-one-model-out is given as a lower bound, since the transfer adds its own error;
  * anything else (a profile without the section, or with efficiencies overridden): not measured.
"""

from __future__ import annotations

from typing import Any

from capacity.inputs.hardware import TRANSFERRED_BASIS, GpuProfile, load_gpu

# which error figure an SLO's metric (`sim.metrics.Slo.metric`) is judged by: TPOT for the per-token and per-request
# decode metrics
_SLO_FIGURE = {"ttft": "ttft_pct", "tpot": "tpot_pct", "itl": "tpot_pct", "tok_s_per_user": "tpot_pct",
               "e2e": "tpot_pct"}


def transferred_from(profile: GpuProfile) -> str | None:
    """The sibling GPU whose efficiencies `profile` carries (its `family_transfer`), or None."""
    for key, record in profile.provenance.items():
        if key.startswith("efficiency.") and record.basis.startswith(TRANSFERRED_BASIS):
            return record.basis[len(TRANSFERRED_BASIS):].split()[0]
    return None


def expected_error(profile: GpuProfile, model_id: str, tensor_parallel_size: int) -> dict[str, Any]:
    """The measured error that applies to `model_id` at `tensor_parallel_size` on `profile` (module docstring):
    basis ('fitted_rows', 'leave_one_model_out', 'leave_one_tp_size_out', 'family_transfer_rows',
    'family_transfer_and_sibling_leave_one_model_out', 'sibling_leave_one_model_out' or 'not_measured'), the figures (median, p90 in % per metric, or None), what the fit saw, and a sentence."""
    cv = profile.cross_validation
    out: dict[str, Any] = {"gpu": profile.name, "model": model_id, "tensor_parallel_size": int(tensor_parallel_size),
                           "basis": "not_measured", "figures": None, "model_in_fit": None, "tp_in_fit": None,
                           "sibling": None, "measured_by": None}
    if not cv:
        sibling = transferred_from(profile)
        if sibling is None:
            out["in_words"] = (f"{profile.name}'s step cost is not cross-validated (no serving rows fitted, or its "
                               "efficiencies overridden): its error on this case is not measured.")
            return out
        own = load_gpu(sibling).cross_validation
        out["sibling"] = sibling
        check = profile.transfer_check
        if check:
            in_rows = model_id.lower() in [m.lower() for m in check["models"]]
            figures, basis = check["errors"], "family_transfer_rows"
            if not in_rows and own.get("leave_one_model_out"):
                figures = {k: [max(a, b) for a, b in zip(v, own["leave_one_model_out"][k])] for k, v in figures.items()}
                basis = "family_transfer_and_sibling_leave_one_model_out"
            out.update(basis=basis, figures=figures, model_in_fit=False, measured_by=check["measured_by"])
            rows = (f"{profile.name}'s efficiencies are {sibling}'s (same family, no refit), checked on {check['rows']} "
                    f"serving rows of its own ({', '.join(check['models'])})")
            out["in_words"] = (f"{rows}: {_figures_text(check['errors'])}." if in_rows else
                               f"{rows}; {model_id} is not one of them, so expect the larger of that error and "
                               f"{sibling}'s own on a left-out model: {_figures_text(figures)}.")
            return out
        if own.get("leave_one_model_out"):
            out.update(basis="sibling_leave_one_model_out", figures=own["leave_one_model_out"],
                       measured_by=own.get("measured_by"))
        out["in_words"] = (f"{profile.name} has no serving rows: its efficiencies are {sibling}'s (same family), "
                           "so its error is not measured"
                           + (f"; at least {sibling}'s own error on a left-out model: {_figures_text(own['leave_one_model_out'])}"
                              if own.get("leave_one_model_out") else "") + ".")
        return out
    models = [m.lower() for m in cv["models"]]
    model_in = model_id.lower() in models
    tp_in = int(tensor_parallel_size) in cv["tensor_parallel_sizes"]
    basis = ("fitted_rows" if model_in and tp_in else "leave_one_model_out" if not model_in
             else "leave_one_tp_size_out")
    figures = cv.get(basis)
    out.update(basis=basis if figures is not None else "not_measured", figures=figures, model_in_fit=model_in,
               tp_in_fit=tp_in, measured_by=cv["measured_by"])
    fit = (f"{profile.name}'s efficiencies were fitted on {cv['rows']} serving rows of {len(cv['models'])} models "
           f"({', '.join(cv['models'])}) at TP {', '.join(map(str, cv['tensor_parallel_sizes']))}")
    if basis == "fitted_rows":
        case = f"{model_id} at TP{tensor_parallel_size} is among them: error on those rows"
    elif basis == "leave_one_model_out":
        case = (f"{model_id} is not one of them" + ("" if tp_in else f" (nor is TP{tensor_parallel_size})")
                + ", so expect the error on a left-out model")
    else:
        case = f"TP{tensor_parallel_size} is not among them, so expect the error on a left-out TP size"
    out["in_words"] = f"{fit}; {case}: {_figures_text(figures)}." if figures else f"{fit}; not measured for this case."
    return out


def margin_against_error(error: dict[str, Any], slo_metric: str | None, margin: float | None) -> str | None:
    """A sentence comparing the margin (a fraction) of an SLO on `slo_metric` (`sim.metrics.Slo.metric`: ttft, tpot,
    itl, e2e, tok_s_per_user) with the p90 error of the figure that judges it, or None where either is missing."""
    figures = error.get("figures")
    key = _SLO_FIGURE.get(slo_metric) if slo_metric else None
    if not figures or key is None or margin is None:
        return None
    median, p90 = figures[key]
    name = "TTFT" if key == "ttft_pct" else "TPOT"
    pct = f"{margin * 100:.0f} %"
    if margin * 100 >= p90:
        return f"the binding SLO's margin ({pct}) exceeds that {name} p90 error ({p90:.1f} %)."
    if margin * 100 >= median:
        return (f"the binding SLO's margin ({pct}) covers the median {name} error ({median:.1f} %) but not its p90 "
                f"({p90:.1f} %): confirm on one replica with the bench line below before buying.")
    return (f"the binding SLO's margin ({pct}) is below the median {name} error ({median:.1f} %): the answer may "
            "be off by a replica; confirm with the bench line below before buying.")


def _figures_text(f: dict[str, list[float]]) -> str:
    return (f"TPOT {f['tpot_pct'][0]:.1f} % median / {f['tpot_pct'][1]:.1f} % p90, TTFT {f['ttft_pct'][0]:.1f} / "
            f"{f['ttft_pct'][1]:.1f} %, output tok/s per GPU {f['output_tok_s_per_gpu_pct'][0]:.1f} / "
            f"{f['output_tok_s_per_gpu_pct'][1]:.1f} %")
