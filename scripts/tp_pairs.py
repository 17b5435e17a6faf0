"""Fixed time and streamed bytes of a decode step (or a prompt's prefill), read from two TP sizes of one measured series.

    python scripts/tp_pairs.py MI355X [--users 4] [--profile hw_profiles/MI355X.yaml] [--prefill]

At a few users a decode step is fixed time F (the layer kernels' fixed cost, per step) plus the weight and KV
bytes B that tensor parallelism divides, plus the all-reduces A(TP): TPOT(TP) ~ F + B / TP + A(TP). Two TP sizes
of one series (same model, precision, date, vLLM build, prompt and output lengths, users) give F and B, with
A(TP) taken from the step-cost model (`decode_parts` of the row's own scenario at `--users` sequences of the mean
decode context). Beside them the model's own F (the "overhead" part) and B (the roofline parts times TP, in TP1
terms), so a fixed cost counted from structure can be checked against the rows without a fit
(docs/seed_validation.md section 34). Rows: the shipped calibration rows of the GPU
(capacity/data/measurements/serving_vllm.csv). Run by hand; not part of the tests.

With --prefill the same reading is made of TTFT at a few users: TTFT(TP) ~ F + W / TP + A(TP), F now the part of a
prompt's time TP does not divide (the request delay, the fixed costs of its step, anything every rank repeats for
every token), W the work TP divides (GEMMs, attention), A(TP) the prompt step's all-reduces from the step-cost model.
The model's own F and W are solved the same way from its two prefill steps of the row's prompt (`time_parts` of isl
new tokens, plus its request delay). Queueing behind other users' steps is in the measured TTFT and not in the
model's columns, so read the two F columns for their trend with the prompt length, not their level
(docs/seed_validation.md section 48). A last table reads each series at its shortest and longest prompt as a line in
the prompt length: the part that does not grow with the prompt (intercept) and the time per prompt token (slope), of W
and of F (section 49).
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import pandas as pd

from capacity.fidelity.serving import default_files
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.measurements.row_scenario import row_scenario
from capacity.measurements.schemas import parse_float, read_measurements
from capacity.sim import simulate

SERIES = ["model", "precision", "date", "framework_version", "isl", "osl"]


def modelled(row: dict, users: int, profile: str, prefill: bool = False) -> dict[str, float] | None:
    """The model's decode step of `row`'s deployment at `users` sequences (with `prefill`: one step prefilling the
    row's prompt, plus the request delay): (all-reduce, fixed, divided work in TP1 terms) ms."""
    sc, why = row_scenario(row)
    if sc is None:
        return None
    sc["deployment"]["gpu"] = profile
    dep = simulate.deploy(scenario_mod.from_dict(sc, "tp-pair"))
    delay_ms = 0.0
    if prefill:
        isl = np.array([parse_float(row["isl"])])
        parts = dep.cost.time_parts(dep.cost.features(isl, isl))
        delay_ms = float(np.ravel(simulate.request_delays_s(dep.cost.efficiency, isl))[0]) * 1e3
    else:
        context = int(parse_float(row["isl"]) + parse_float(row["osl"]) / 2)
        _, parts = dep.cost.decode_parts(np.full((1, users), context), 1)
    ms = {k: float(np.ravel(v)[0]) * 1e3 for k, v in parts.items()}
    tp = dep.cost.tp
    return {"allreduce": ms.get("allreduce", 0.0), "fixed": ms["overhead"] + delay_ms, "total": sum(ms.values()) + delay_ms,
            "divided_tp1": tp * (ms.get("dense_gemm", 0.0) + ms.get("moe_gemm", 0.0) + ms.get("attention", 0.0)),
            "layers": dep.model.num_layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--profile", help="profile the model's parts come from (default: the GPU's shipped one)")
    ap.add_argument("--prefill", action="store_true", help="read TTFT (a prompt's prefill) instead of TPOT")
    args = ap.parse_args()
    metric, label, work = ("ttft_ms", "TTFT ms", "W") if args.prefill else ("tpot_ms", "TPOT ms", "B")
    profile = args.profile or args.gpu
    load_gpu(profile)
    rows = pd.concat([read_measurements(p) for p in default_files()], ignore_index=True)
    rows = rows[(rows["gpu"] == args.gpu) & (pd.to_numeric(rows["concurrency_or_qps"], errors="coerce") == args.users)]
    rows = rows[rows["spec_method"].isna() | (rows["spec_method"] == "none")]
    out, lines = [], []
    for key, group in rows.groupby(SERIES, dropna=False):
        by_tp = {int(parse_float(r["tp"])): r for r in group.to_dict(orient="records")}
        for t1, t2 in itertools.combinations(sorted(by_tp), 2):
            m1 = modelled(by_tp[t1], args.users, profile, args.prefill)
            m2 = modelled(by_tp[t2], args.users, profile, args.prefill)
            if m1 is None or m2 is None:
                continue
            y1 = parse_float(by_tp[t1][metric]) - m1["allreduce"]
            y2 = parse_float(by_tp[t2][metric]) - m2["allreduce"]
            b = (y1 - y2) / (1 / t1 - 1 / t2)
            f = y1 - b / t1
            if args.prefill:
                # the model's own F and W, solved from its two steps as the measured ones are: its per-token MoE time
                # and per-call GEMM time are parts TP does not divide, which its roofline parts x TP would count as W
                z1, z2 = m1["total"] - m1["allreduce"], m2["total"] - m2["allreduce"]
                divided = (z1 - z2) / (1 / t1 - 1 / t2)
                m1 = dict(m1, divided_tp1=divided, fixed=z1 - divided / t1)
            lines.append({"series": (str(key[0])[:24], key[1], key[2]), "isl": parse_float(key[4]), "F": f, "W": b,
                          "model F": m1["fixed"], "model W": m1["divided_tp1"]})
            out.append({"model": str(key[0])[:24], "precision": key[1], "date": key[2], "isl/osl": f"{parse_float(key[4]):.0f}/{parse_float(key[5]):.0f}",
                        "TP pair": f"{t1}/{t2}", label: f"{parse_float(by_tp[t1][metric]):.2f}/{parse_float(by_tp[t2][metric]):.2f}",
                        "A ms": f"{m1['allreduce']:.2f}/{m2['allreduce']:.2f}",
                        "F ms": round(f, 2),
                        **({} if args.prefill else {"F us/layer": round(1e3 * f / m1["layers"], 0)}),
                        "model F ms": round(m1["fixed"], 2), f"{work} ms (TP1)": round(b, 2),
                        f"model {work} ms (TP1)": round(m1["divided_tp1"], 2)})
    pd.set_option("display.width", 250)
    print(pd.DataFrame(out).to_string(index=False) if out else "no series with two TP sizes at this load")
    if args.prefill and lines:
        print()
        print(two_lengths(pd.DataFrame(lines)))


def two_lengths(pairs: pd.DataFrame) -> str:
    """Each series' F and W (medians over its TP pairs) at its shortest and longest prompt, read as a line in the
    prompt length: an intercept (ms a prompt costs whatever its length) and a slope (us per prompt token), measured /
    model (docs/seed_validation.md section 49)."""
    out = []
    for series, g in pairs.groupby("series"):
        at = g.groupby("isl")[["F", "W", "model F", "model W"]].median()
        if len(at) < 2:
            continue
        (l1, a), (l2, b) = (at.index[0], at.iloc[0]), (at.index[-1], at.iloc[-1])
        row = {"model": series[0], "precision": series[1], "date": series[2], "prompts": f"{l1:.0f}/{l2:.0f}"}
        for part in ("W", "F"):
            slope = {k: (b[k] - a[k]) / (l2 - l1) for k in (part, f"model {part}")}
            row[f"{part} at 0 ms"] = f"{a[part] - slope[part] * l1:.1f} / {a['model ' + part] - slope['model ' + part] * l1:.1f}"
            row[f"{part} us/token"] = f"{1e3 * slope[part]:.1f} / {1e3 * slope['model ' + part]:.1f}"
        out.append(row)
    if not out:
        return "no series at two prompt lengths"
    return ("Two prompt lengths (medians over the TP pairs; measured / model):\n"
            + pd.DataFrame(out).to_string(index=False))


if __name__ == "__main__":
    main()
