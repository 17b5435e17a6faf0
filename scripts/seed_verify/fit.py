"""Fit hypothesis parameters + per-method draft-pass overheads on re-priced rows; LOTO. See reprice.py."""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from reprice import *
from scipy.optimize import least_squares

METHODS = sorted(set(methods))

def fit(hkeys, h0, lo, hi, fit_ov=True, mask=None, fixed=None, ov_hi=20000.0):
    mask = np.ones(len(P), bool) if mask is None else mask
    fixed = fixed or {}
    ms = sorted(set(methods[mask])) if fit_ov else []
    x0 = list(h0) + [100.0] * len(ms)
    lb = list(lo) + [0.0] * len(ms); ub = list(hi) + [ov_hi] * len(ms)
    idx = np.where(mask)[0]
    def res(x):
        h = dict(fixed); h.update(zip(hkeys, x[:len(hkeys)]))
        ov = dict(zip(ms, x[len(hkeys):]))
        pr = predict_sub(h, ov, idx)
        return np.log(np.maximum(pr, 1e-9)) - np.log(meas[idx])
    sol = least_squares(res, np.array(x0, float), bounds=(lb, ub), loss="soft_l1", f_scale=0.05,
                        x_scale=np.maximum(np.abs(np.array(x0, float)), 1e-3))
    h = dict(fixed); h.update(zip(hkeys, sol.x[:len(hkeys)]))
    return h, dict(zip(ms, sol.x[len(hkeys):]))

def predict_sub(h, ov, idx):
    pr = np.empty(len(idx))
    for j, k in enumerate(idx):
        p = P[k]
        T = p["dur"] + step_times(p["cm"], p["F"], p["sp"], h).sum() - p["t0sum"]
        m = methods[k]
        if ov and m in ov:
            T += p["K"] * (ov[m] - p["ov0"]) * 1e-6
        pr[j] = p["outtok"] / T / BASE[targets[k]]
    return pr

def evaluate(name, hkeys, h0, lo, hi, fit_ov=True, fixed=None, loto=True, verbose=False, ov_hi=20000.0):
    t0 = time.time()
    h, ov = fit(hkeys, h0, lo, hi, fit_ov, fixed=fixed, ov_hi=ov_hi)
    pred = predict_sub(h, ov, np.arange(len(P)))
    line = summary(pred, label=f"{name} FIT")
    out = {"h": h, "ov": ov, "pred": pred}
    if loto:
        lp = np.full(len(P), np.nan)
        for t in sorted(set(targets)):
            tr = targets != t
            hh, oo = fit(hkeys, h0, lo, hi, fit_ov, mask=tr, fixed=fixed, ov_hi=ov_hi)
            # methods absent from training keep assumed
            lp[~tr] = predict_sub(hh, oo, np.where(~tr)[0])
        out["loto"] = lp
        line += " | " + summary(lp, label="LOTO")
    print(line, "|", {k: round(float(x), 4) for k, x in h.items()}, {k: round(float(x)) for k, x in ov.items()}, f"{time.time()-t0:.0f}s", flush=True)
    if verbose:
        print(by(pred, "target").round(3)); print(by(pred, "method_name").round(3))
    return out
