"""Screen step-cost variants by cross-validation in minutes: record a GPU's rows once, then re-price.

    python scripts/screen_cost_terms.py MI300X [--variant NAME=PROFILE.yaml ...] [--cache DIR] [--workers 2]
        [--hold KEY] [--fit KEY] [--out-prefix PREFIX] [--no-cv]

`capacity calibrate` re-simulates every row at each fit (two rounds, then once per leave-one-model-out
fold): exact, and 13-22 minutes per GPU on two cores. To compare several cost terms (the ablation of
issue 16) this script simulates each row once, on the shipped profile, keeps its schedule
(`calibrate.record_row`, cached under --cache) and then, for each variant profile, fits by
re-pricing only: the full fit, leave-one-model-out and leave-one-TP-size-out, each fold refitted on
the other rows with the keys its own rows identify (held at the full fit otherwise, as calibrate).
Re-pricing is exact for a closed loop at the recorded request delay and close near it, so the figures
rank variants; the one kept is then confirmed with `capacity calibrate --gpu VARIANT.yaml`.
Variants are profiles (a YAML path, e.g. written by a script) whose extra keys turn a mechanism on.
Prints median / p90 |error| of output tok/s per GPU, TPOT and TTFT, cross-validated first.
Run by hand; not part of the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from capacity.cost import step_cost
from capacity.fidelity import calibrate as cal
from capacity.fidelity.serving import default_files
from capacity.inputs.hardware import load_gpu, save_profile
from capacity.measurements import readers
from capacity.paths import data_dir

METRICS = ("output_tok_s_per_gpu", "tpot_ms", "ttft_ms")


def records(gpu: str, cache: Path, workers: int, max_rows: int | None) -> list[cal.RecordedRow]:
    """The GPU's fit rows simulated once on its shipped profile, cached under a key of the rows, the profile's values
    and the serve recipes that set the rows' scenarios (not of the simulator's code: clear the cache after changing it)."""
    profile = load_gpu(gpu)
    _, rows, _ = cal._read_rows(default_files(), profile, gpu, readers.Overrides(gpu=profile.name), max_rows)
    recipes = (data_dir() / "measurements" / "serve_recipes.yaml").read_text()
    key = hashlib.sha256(json.dumps([gpu, max_rows, len(rows), sorted(profile.efficiency.items()), recipes],
                                    default=str).encode()).hexdigest()[:12]
    path = cache / f"records_{profile.name}_{key}.pkl"
    if path.exists():
        return pickle.loads(path.read_bytes())
    recs = [r for r in cal.record_rows(rows, workers=workers, gpu=gpu) if not isinstance(r, str)]
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(recs))
    return recs


def table(df: pd.DataFrame) -> dict[str, tuple[float, float]]:
    out = {}
    for m in METRICS:
        meas = pd.to_numeric(df[m], errors="coerce").to_numpy(float)
        pred = pd.to_numeric(df[f"predicted_{m}"], errors="coerce").to_numpy(float)
        ok = np.isfinite(meas) & np.isfinite(pred) & (meas > 0)
        ape = np.abs(pred[ok] - meas[ok]) / meas[ok] * 100
        out[m] = (float(np.median(ape)), float(np.percentile(ape, 90))) if ok.any() else (float("nan"),) * 2
    return out


def fold_out(pricers, fitted, keys, fit_kw, group) -> tuple[pd.DataFrame, dict]:
    """Each group held out in turn: refit on the rest (keys its rows identify), predict the group."""
    groups = sorted({group(p) for p in pricers}, key=str)
    if len(groups) <= 1:
        return pd.DataFrame(), {}
    oof, fits = [], {}
    for g in groups:
        t0 = time.time()
        rest = [p for p in pricers if group(p) != g]
        fold_keys = tuple(k for k in cal.identifiable_keys(rest, fitted)[0] if k in keys)
        # a fold starts from the full fit only (it is near its optimum; calibrate also tries a neutral start)
        fits[g] = cal.fit(rest, fitted, fold_keys, neutral_start=False, **fit_kw)
        oof.append(cal.predictions([p for p in pricers if group(p) == g], fits[g]))
        print(f"    fold {g}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return pd.concat(oof, ignore_index=True), fits


def _constant(text: str, kind: type):
    """A module constant from its command-line text (bool('False') would be True)."""
    if kind is bool:
        if text.strip().lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"error: {text!r} is not a boolean; use True or False")
        return text.strip().lower() in ("true", "1")
    if kind is tuple:   # names separated by '|', '()' for none (e.g. AITER_MOE_KERNEL_CURVE=CDNA3 (gfx942)|CDNA4 (gfx950))
        return () if text.strip() in ("", "()") else tuple(x.strip() for x in text.split("|"))
    return kind(text)


def screen(recs, profile_ref: str, prior_weight, hold: tuple[str, ...] = (), fit_also: tuple[str, ...] = (),
           out: str | None = None, cross_validate: bool = True, rows_csv: str | None = None) -> dict:
    """The variant `PROFILE[;ATTR=VALUE...]`: a profile, and module constants of capacity.cost.step_cost
    set for it (e.g. VERIFY_ROUTING_EXPONENT=0.7), restored afterwards; `eff.KEY=V` adds an efficiency
    entry the profile lacks (e.g. eff.kv_read=0.6), held at V. `hold` and `fit_also` as `capacity calibrate --hold`
    / `--fit`; `out` writes the full fit as a profile (no cross-validation with `cross_validate` False)."""
    profile_ref, *sets = profile_ref.split(";")
    saved, extra = {}, {}
    try:
        for item in sets:
            attr, value = item.split("=", 1)
            if attr.startswith("eff."):           # an efficiency entry the profile does not have (held, not fitted)
                extra[attr[4:]] = float(value)
                continue
            saved[attr] = getattr(step_cost, attr)
            setattr(step_cost, attr, _constant(value, type(saved[attr])))
        return _screen(recs, profile_ref, prior_weight, extra, hold, fit_also, out, cross_validate,
                       rows_csv) | {"constants": sets}
    finally:
        for attr, value in saved.items():
            setattr(step_cost, attr, value)


def _screen(recs, profile_ref: str, prior_weight, extra: dict[str, float] | None = None, hold: tuple[str, ...] = (),
            fit_also: tuple[str, ...] = (), out: str | None = None, cross_validate: bool = True,
            rows_csv: str | None = None) -> dict:
    profile = load_gpu(profile_ref)
    pricers = [cal.Repricer(r, profile) for r in recs]
    start = dict(profile.efficiency) | (extra or {})
    keys, _ = cal.identifiable_keys(pricers, start)
    keys = cal.opt_in_keys_fitted(tuple(k for k in keys if k not in hold), fit_also, start, {})
    fit_kw = {"prior": cal.prior_efficiencies(profile), "prior_weight": prior_weight}
    info: dict = {}
    t0 = time.time()
    fitted = cal.fit(pricers, start, keys, info=info, **fit_kw)
    print(f"    full fit: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    if out:
        save_profile(profile, out, {k: fitted[k] for k in keys}, f"scripts/screen_cost_terms.py (re-priced), {profile_ref}")
    lomo, lomo_fits, lotpo = pd.DataFrame(), {}, pd.DataFrame()
    if cross_validate:
        lomo, lomo_fits = fold_out(pricers, fitted, keys, fit_kw, lambda p: p.rec.row["model"])
        lotpo, _ = fold_out(pricers, fitted, keys, fit_kw, lambda p: int(p.cost.tp))
    if rows_csv and not lomo.empty:
        lomo.to_csv(rows_csv, index=False)
    per_model = {}
    if not lomo.empty:
        for m, df in lomo.groupby("model"):
            per_model[m] = table(df)
    return {"variant": profile_ref, "rows": len(pricers), "keys": list(keys),
            "fitted": {k: fitted[k] for k in keys}, "at_bound": info.get("at_bound", []),
            "lomo": table(lomo) if not lomo.empty else None, "lotpo": table(lotpo) if not lotpo.empty else None,
            "fit": table(cal.predictions(pricers, fitted)), "lomo_by_model": per_model,
            "lomo_fits": {m: {k: f[k] for k in keys} for m, f in lomo_fits.items()}}


def fmt(t) -> str:
    return "-" if t is None else ", ".join(f"{t[m][0]:.1f} / {t[m][1]:.1f}" for m in METRICS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpu")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=PROFILE[;CONSTANT=VALUE...]: a YAML path or GPU name, and step_cost constants")
    ap.add_argument("--no-shipped", action="store_true", help="only the variants, not the shipped profile")
    ap.add_argument("--cache", default=".screen_cache")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-rows", type=int)
    ap.add_argument("--prior-weight", action="append", default=[], metavar="[KEY=]W",
                    help="as `capacity calibrate --prior-weight` (W, or KEY=W per anchor; repeatable)")
    ap.add_argument("--hold", action="append", default=[], metavar="KEY",
                    help="as `capacity calibrate --hold`: keep KEY at the profile's value (repeatable)")
    ap.add_argument("--fit", action="append", default=[], metavar="KEY",
                    help="as `capacity calibrate --fit`: also fit this opt-in parameter (repeatable)")
    ap.add_argument("--out-prefix", help="write each variant's full fit to PREFIX_NAME.yaml (a profile)")
    ap.add_argument("--no-cv", action="store_true", help="the full fit only, no cross-validation")
    ap.add_argument("--rows-prefix", help="write each variant's leave-one-model-out predictions, row by row, to "
                                          "PREFIX_NAME_lomo.csv")
    ap.add_argument("--json")
    args = ap.parse_args()
    recs = records(args.gpu, Path(args.cache), args.workers, args.max_rows)
    variants = ([] if args.no_shipped else [("shipped", args.gpu)]) + [tuple(v.split("=", 1)) for v in args.variant]
    results = []
    for name, ref in variants:
        r = screen(recs, ref, cal.parse_prior_weight(args.prior_weight), tuple(args.hold), tuple(args.fit),
                   f"{args.out_prefix}_{name}.yaml" if args.out_prefix else None, not args.no_cv,
                   f"{args.rows_prefix}_{name}_lomo.csv" if args.rows_prefix else None)
        r["name"] = name
        results.append(r)
        print(f"{name:24} LOMO {fmt(r['lomo'])} | LOTPO {fmt(r['lotpo'])} | fitted {fmt(r['fit'])}", flush=True)
        for m, t in r["lomo_by_model"].items():
            print(f"    {m:40} {fmt(t)}", flush=True)
        print("    fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in r["fitted"].items())
              + (f"  AT BOUND: {r['at_bound']}" if r["at_bound"] else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
