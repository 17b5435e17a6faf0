#!/usr/bin/env python
"""Regenerate ``capacity/data/acceptance_profiles.yaml`` from the seed measurements.

    /work/venv/bin/python scripts/fit_acceptance_profiles.py [--check]

Input: ``capacity/data/measurements/seed_spec_decode.csv`` (vLLM blog 2026-08-23, "Exploring
Speculative Decoding in vLLM on AMD GPUs", AMD and Embedded LLM; copied verbatim). Its
``per_position_acceptance`` column holds the MARGINAL survivals S_1..S_N (P(accepted >= j)) of one
run with N = ``num_speculative_tokens``; ``mean_accepted_length`` = E[tau] = 1 + sum S_j.

What is written (the rules themselves are implemented in ``capacity/spec/acceptance.py``):

* ``by_n``: for every method x target x dataset x N, the conditional rates a_j = S_j / S_{j-1} of
  that row (4 decimals). The default profile model uses the row of the requested N.
* ``rates`` (the pooled profile, one chain per method x target x dataset): for each position j,
  the arithmetic mean over the rows with N >= j of that row's conditional rate at j.
* ``decay`` per method (seed label), FITTED: the per-position factor delta <= 1 that continues the
  last conditional rate (a_{K+m} = a_K * delta^m). It minimises the squared error of predicting
  each row's mean_accepted_length from the next-smaller measured N's row extended this way (an
  out-of-sample extrapolation check; its residuals are stored under ``fit``).
* ``fit``: how well each rule reproduces the measured mean_accepted_length.
* ``literature`` profiles for methods without seed rows (draft_model, ngram), fitted here to the
  published tau(k) curves typed in below (source on every entry): a two-parameter chain, a_1 and a
  constant a_j for j >= 2, least squares on tau(k).
* ``chat_tau_ratio`` per method: tau(chat) / tau(math) at 7 draft positions for the same drafter,
  from the literature values typed in below (no seed row is chat).
* ``chat_factor`` per method with a ``chat_tau_ratio``, SOLVED: for every measured target and for
  the mean over the measured targets (what an unmeasured target or none gets), the factor c on
  every conditional rate of the math profile such that tau(7 drafts of c * rates) = chat_tau_ratio x
  tau(7 drafts of rates); rates = ``capacity.spec.acceptance.chat_base_rates`` of the YAML as written
  (its math pooled chain extended to 7 positions with the decay), c by brentq on [0, 1] (xtol 1e-10),
  0 where even c = 0 reaches the target. Stored with full (repr) precision; the simulator reads it
  instead of solving (no scipy at start-up).

``--check`` regenerates into memory and fails if the shipped YAML differs (used by the tests).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import brentq, least_squares, minimize_scalar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from capacity.spec.acceptance import chat_base_rates  # noqa: E402  (the profile rules the runtime applies)

SEED_CSV = ROOT / "capacity" / "data" / "measurements" / "seed_spec_decode.csv"
OUT_YAML = ROOT / "capacity" / "data" / "acceptance_profiles.yaml"

SEED_SOURCE = ('vLLM blog 2026-08-23 "Exploring Speculative Decoding in vLLM on AMD GPUs" (AMD and Embedded '
               'LLM), appendix panels, https://vllm.ai/blog/2026-08-23-speculative-decoding-amd-gpus; '
               'copied verbatim as capacity/data/measurements/seed_spec_decode.csv')

# Seed CSV `method` label -> capacity method key.
METHOD_KEYS = {"Native MTP": "mtp", "Gemma 4 MTP": "gemma4_mtp", "EAGLE-3": "eagle3",
               "DFlash": "dflash", "DSpark": "dspark"}
WORKLOAD_TYPES = {"GSM8K": "math", "MATH500": "math", "HumanEval": "code", "MBPP": "code"}

# ------------------------------------------------------------------------------------------------
# Literature values (typed in from the reference notes, with their sources)
# ------------------------------------------------------------------------------------------------

_S3 = ("Cheng et al. (DeepSeek-AI, PKU), DSpark paper, repo deepseek-ai/DeepSpec DSpark_paper.pdf Table 1 "
       "(Qwen3-8B and Gemma4-12B targets, 7 draft positions, T=1, offline), as tabulated in the project's "
       "modelling notes section 1.5 table (i)")
_ROCM_DFLASH = ("ROCm blog 'DFlash on MI355X' Table 1, https://rocm.blogs.amd.com/artificial-intelligence/"
                "dflash-on-MI355x/README.html (rows of capacity/data/measurements/acceptance.csv: method MTP, "
                "targets Qwen3.5-27B and Qwen3.5-35B-A3B, k=7)")

# tau (incl. bonus) per dataset at 7 draft positions: {method: {target: {dataset: tau}}}
_S3_TABLE = {
    "eagle3": {"Qwen3-8B": {"GSM8K": 5.30, "MATH": 4.77, "MT-Bench": 2.66},
               "Gemma4-12B": {"GSM8K": 5.87, "MATH": 5.46, "MT-Bench": 3.19}},
    "dflash": {"Qwen3-8B": {"GSM8K": 5.33, "MATH": 4.91, "MT-Bench": 3.11},
               "Gemma4-12B": {"GSM8K": 5.45, "MATH": 5.04, "MT-Bench": 2.98}},
    "dspark": {"Qwen3-8B": {"GSM8K": 6.17, "MATH": 5.78, "MT-Bench": 3.72},
               "Gemma4-12B": {"GSM8K": 6.05, "MATH": 5.78, "MT-Bench": 3.49}},
}
# acceptance.csv rows (ROCm DFlash blog), native MTP, k = 7: gsm8k, math500, MT-Bench
_MTP_ROCM = {"Qwen3.5-27B": {"GSM8K": 5.869, "MATH500": 5.833, "MT-Bench": 4.257},
             "Qwen3.5-35B-A3B": {"GSM8K": 5.589, "MATH500": 5.645, "MT-Bench": 4.111}}

# Literature tau(k) curves for methods the seed article did not measure.
LITERATURE = {
    "draft_model": {
        "all": {
            "k": [1, 2, 3, 4, 5, 6, 7, 8],
            "tau": [1.80, 2.40, 2.87, 3.28, 3.53, 3.70, 3.90, 4.04],
            "source": ("Qwen3-1.7B draft -> Qwen3-32B target in vLLM, tau for k=1..8, notebook "
                       "https://github.com/tomasruizt/vllm-scripts (secondary; modelling notes section 1.5 "
                       "table (iii), [S12]); dataset not stated"),
            "basis": "assumed for every workload type (the source does not name its dataset)",
        },
    },
    "ngram": {
        "math": {
            "k": [1, 3, 5, 7], "tau": [1.11, 1.16, 1.18, 1.18],
            "source": ("SpecDecode-Bench traces, Llama-3.1-8B-Instruct on H100 with vLLM, GSM8K, n-gram "
                       "(field acc_ngram), trace walk; repo SpecDecode-Bench/simulator data/llama3.1-8B/"
                       "combined_gsm8k.jsonl ([S10]), statistics from the modelling notes section 1.5 table (ii)"),
            "basis": "derived from measured traces",
        },
        "code": {
            "k": [1, 3, 5, 7], "tau": [1.51, 2.03, 2.29, 2.45],
            "source": ("SpecDecode-Bench traces, Llama-3.1-8B-Instruct on H100 with vLLM, InstructCoder, "
                       "n-gram (field acc_ngram), trace walk ([S10]; modelling notes section 1.5 table (ii))"),
            "basis": "derived from measured traces",
        },
        "chat": {
            "k": [1, 3, 5, 7], "tau": [1.11, 1.16, 1.18, 1.18],
            "source": "the GSM8K n-gram curve above ([S10]; no chat n-gram mean tau is tabulated)",
            "basis": ("assumed: chat answers reuse little prompt text verbatim, like GSM8K; cross-check: "
                      "Spec-Bench PLD (prompt lookup = n-gram) mean accepted tokens 1.55-1.73 on its 6-task mix "
                      "(acceptance.csv, Spec-Bench leaderboard)"),
        },
    },
}


def _cond(S: np.ndarray) -> np.ndarray:
    prev = np.concatenate([[1.0], S[:-1]])
    return np.divide(S, prev, out=np.zeros_like(S), where=prev > 0)


def _tau(rates: np.ndarray, n: int) -> float:
    return 1.0 + float(np.cumprod(np.asarray(rates, dtype=float)[:n]).sum())


def _extend(rates: np.ndarray, n: int, delta: float) -> np.ndarray:
    rates = np.asarray(rates, dtype=float)
    if n <= len(rates):
        return rates[:n]
    return np.concatenate([rates, rates[-1] * delta ** np.arange(1, n - len(rates) + 1)])


def _interp(rows: dict[int, np.ndarray], n: int, delta: float) -> np.ndarray:
    """The by-N rule (same as capacity.spec.acceptance._rates_by_n)."""
    ns = sorted(rows)
    if n in rows:
        return rows[n][:n]
    if n < ns[0]:
        return rows[ns[0]][:n]
    if n > ns[-1]:
        return _extend(rows[ns[-1]], n, delta)
    lo = max(k for k in ns if k < n)
    hi = min(k for k in ns if k > n)
    w = (n - lo) / (hi - lo)
    return (1 - w) * _extend(rows[lo], n, delta) + w * rows[hi][:n]


def _r4(x) -> list[float]:
    return [round(float(v), 4) for v in x]


def _stats(err: list[float]) -> dict:
    e = np.abs(np.asarray(err, dtype=float))
    return {"rows": int(len(e)), "median_abs_err": round(float(np.median(e)), 4),
            "p90_abs_err": round(float(np.quantile(e, 0.9)), 4), "max_abs_err": round(float(e.max()), 4)}


def _fit_two_param(k: list[int], tau: list[float]) -> tuple[list[float], float]:
    """a_1 and a constant a_j (j >= 2), least squares on tau(k); returns rates for max(k) positions."""
    K = max(k)

    def rates(p):
        return np.concatenate([[p[0]], np.full(K - 1, p[1])])

    def resid(p):
        r = rates(p)
        return np.array([_tau(r, kk) - t for kk, t in zip(k, tau)])

    sol = least_squares(resid, x0=[0.5, 0.5], bounds=([0.0, 0.0], [1.0, 1.0]))
    rmse = float(np.sqrt(np.mean(resid(sol.x) ** 2)))
    return _r4(rates(sol.x)), round(rmse, 4)


CHAT_MATCH_DRAFTS = 7


def _chat_factor(rates: np.ndarray, ratio: float) -> float:
    """c such that E[tau] with 7 drafts of c * rates = ratio * that of rates (0 if not reachable)."""
    target = ratio * _tau(rates, CHAT_MATCH_DRAFTS)
    if _tau(rates * 0.0, CHAT_MATCH_DRAFTS) >= target:
        return 0.0
    return float(brentq(lambda c: _tau(rates * c, CHAT_MATCH_DRAFTS) - target, 0.0, 1.0, xtol=1e-10))


def add_chat_factors(doc: dict) -> dict:
    """Solve and add ``methods.<m>.chat_factor`` for every method with a chat_tau_ratio, on the data as
    the runtime reads it back (the rendered YAML, loaded)."""
    shipped = yaml.safe_load(render(doc))
    for key, m in shipped["methods"].items():
        if "chat_tau_ratio" not in m:
            continue
        ratio = float(m["chat_tau_ratio"]["value"])
        doc["methods"][key]["chat_factor"] = {
            "rule": (f"chat = the math profile with every conditional rate x c, c such that tau({CHAT_MATCH_DRAFTS} "
                     f"drafts of c * rates) = chat_tau_ratio.value x tau({CHAT_MATCH_DRAFTS} drafts of rates); rates "
                     "= the target's math pooled chain (the mean, position by position, of its GSM8K and MATH500 "
                     "chains; mean_of_targets: the mean of those over the measured targets) extended to "
                     f"{CHAT_MATCH_DRAFTS} positions with the decay; solved by brentq on [0, 1], xtol 1e-10"),
            "by_target": {t: _chat_factor(chat_base_rates(shipped, key, t), ratio) for t in sorted(m["targets"])},
            "mean_of_targets": _chat_factor(chat_base_rates(shipped, key, None), ratio),
        }
    return doc


def build() -> dict:
    seed = pd.read_csv(SEED_CSV)
    labels = set(seed["method"].unique())
    unknown = labels - set(METHOD_KEYS)
    if unknown:
        raise SystemExit(f"seed CSV has method labels without a key: {sorted(unknown)}")
    seed["S"] = seed["per_position_acceptance"].map(lambda s: np.array([float(x) for x in str(s).split()]))

    methods: dict = {}
    fit_pooled, fit_byn, fit_loo = [], [], []
    for label, gm in seed.groupby("method", sort=True):
        key = METHOD_KEYS[label]
        # --- decay: fitted on next-N extrapolation -------------------------------------------
        pairs = []
        for _, g in gm.groupby(["target", "dataset"]):
            g = g.sort_values("num_speculative_tokens")
            for i in range(len(g) - 1):
                pairs.append((_cond(g.iloc[i]["S"]), int(g.iloc[i + 1]["num_speculative_tokens"]),
                              float(g.iloc[i + 1]["mean_accepted_length"])))

        def sse(d, pairs=pairs):
            return sum((_tau(_extend(a, n, d), n) - t) ** 2 for a, n, t in pairs)

        res = minimize_scalar(sse, bounds=(0.5, 1.0), method="bounded", options={"xatol": 1e-6})
        delta = round(float(res.x), 4)
        ext_err = [_tau(_extend(a, n, delta), n) - t for a, n, t in pairs]

        targets: dict = {}
        m_pooled, m_byn, m_loo = [], [], []
        for (target, dataset), g in gm.groupby(["target", "dataset"], sort=True):
            g = g.sort_values("num_speculative_tokens")
            K = int(g["num_speculative_tokens"].max())
            rows = {int(r.num_speculative_tokens): _cond(r.S) for r in g.itertuples()}
            pooled = np.array([np.mean([a[j] for n, a in rows.items() if n > j]) for j in range(K)])
            pooled = np.array(_r4(pooled))
            rows4 = {n: np.array(_r4(a)) for n, a in rows.items()}
            e_pooled, e_byn = [], []
            for r in g.itertuples():
                n = int(r.num_speculative_tokens)
                e_pooled.append(_tau(pooled, n) - r.mean_accepted_length)
                e_byn.append(_tau(rows4[n], n) - r.mean_accepted_length)
            # leave-one-N-out: predict an interior row from its neighbours with the by-N rule
            ns = sorted(rows4)
            e_loo = []
            for i in range(1, len(ns) - 1):
                others = {n: a for n, a in rows4.items() if n != ns[i]}
                mal = float(g.loc[g["num_speculative_tokens"] == ns[i], "mean_accepted_length"].iloc[0])
                e_loo.append(_tau(_interp(others, ns[i], delta), ns[i]) - mal)
            m_pooled += e_pooled
            m_byn += e_byn
            m_loo += e_loo
            targets.setdefault(target, {})[dataset] = {
                "rates": pooled.tolist(),
                "by_n": {n: rows4[n].tolist() for n in ns},
                "fit_pooled_max_abs_err": round(float(np.max(np.abs(e_pooled))), 4),
            }
        fit_pooled += m_pooled
        fit_byn += m_byn
        fit_loo += m_loo
        methods[key] = {
            "seed_label": label,
            "decay": {
                "value": delta, "basis": "fitted",
                "rule": ("a_{K+m} = a_K * value^m beyond the last measured position K; value minimises the "
                         "squared error of each seed row's mean_accepted_length predicted from the next-smaller "
                         "N row of the same target x dataset extended this way"),
                "fit": _stats(ext_err),
            },
            "fit": {"pooled": _stats(m_pooled), "by_n": _stats(m_byn),
                    **({"by_n_leave_one_n_out": _stats(m_loo)} if m_loo else {})},
            "targets": targets,
        }

    # --- chat ratios --------------------------------------------------------------------------
    def s3_ratio(key):
        vals = {t: round(d["MT-Bench"] / ((d["GSM8K"] + d["MATH"]) / 2), 4) for t, d in _S3_TABLE[key].items()}
        return round(float(np.mean(list(vals.values()))), 4), vals

    chat = {}
    for key in ("eagle3", "dflash", "dspark"):
        v, per = s3_ratio(key)
        chat[key] = {"value": v, "per_target": per, "source": _S3,
                     "basis": ("literature: MT-Bench tau / mean(GSM8K, MATH) tau, same drafter and target, "
                               "averaged over the two targets; applied to the seed profiles as an assumption "
                               "(different targets, T=1)")}
    per = {t: round(d["MT-Bench"] / ((d["GSM8K"] + d["MATH500"]) / 2), 4) for t, d in _MTP_ROCM.items()}
    chat["mtp"] = {"value": round(float(np.mean(list(per.values()))), 4), "per_target": per,
                   "source": _ROCM_DFLASH,
                   "basis": ("literature: MT-Bench tau / mean(gsm8k, math500) tau for native MTP at k=7 on two "
                             "Qwen3.5 targets; applied to the seed profiles as an assumption")}
    g_ratio = _S3_TABLE["eagle3"]["Gemma4-12B"]
    chat["gemma4_mtp"] = {
        "value": round(g_ratio["MT-Bench"] / ((g_ratio["GSM8K"] + g_ratio["MATH"]) / 2), 4),
        "source": _S3 + " (EAGLE-3 on Gemma4-12B row)",
        "basis": ("assumed: no chat measurement of Gemma 4 MTP; uses the ratio of the other autoregressive "
                  "drafter measured on a Gemma 4 target (EAGLE-3 on Gemma4-12B)")}
    for key in chat:
        methods[key]["chat_tau_ratio"] = chat[key]

    # --- literature profiles ------------------------------------------------------------------
    for key, per_w in LITERATURE.items():
        lit = {}
        for workload, entry in per_w.items():
            rates, rmse = _fit_two_param(entry["k"], entry["tau"])
            lit[workload] = {"rates": rates, "fit_rmse_tau": rmse,
                             "data": {"k": entry["k"], "tau": entry["tau"]},
                             "source": entry["source"], "basis": entry["basis"]}
        methods[key] = {
            "seed_label": None,
            "decay": {"value": 1.0, "basis": "assumed",
                      "rule": "the two-parameter fit already has a flat tail; continued unchanged"},
            "literature": lit,
        }

    return {
        "schema": 1,
        "generated_by": "scripts/fit_acceptance_profiles.py",
        "seed_source": SEED_SOURCE,
        "workload_types": dict(WORKLOAD_TYPES),
        "fit_summary": {
            "pooled": _stats(fit_pooled),
            "by_n": _stats(fit_byn),
            "by_n_leave_one_n_out": _stats(fit_loo),
        },
        "temperature": {
            "beta": 0.04, "basis": "assumed",
            "rule": "a_j(T) = a_j(0) * max(0, 1 - beta * T); profile rates are taken as T = 0 (argmax) values",
            "source": ("modelling notes section 1.7: beta 0.03-0.05 fitted to the Nebius MTP-DeepSeek-V3-0324 card "
                       "(tau 3.20 -> 3.09 and 4.83 -> 4.68 from T=0 to T=1, K=7) [S9]; the seed article does not "
                       "state its temperature (assumed 0)"),
        },
        "probabilistic_draft_factor": {
            "rule": ("draft_sampling 'probabilistic' at T > 0 multiplies every conditional rate by the factor "
                     "of the method (default 1.0)"),
            "dflash": {
                "value": 0.206, "basis": "assumed (derived)",
                "source": ("z-lab/dflash PR #169 (DFlash on MLX): tau 1.16 with independent per-position sampling "
                           "vs 2.96 with argmax drafts [S17]; under an i.i.d. model these tau need acceptance rates "
                           "0.138 vs 0.677 at N = 7 (ratio 0.204) and 0.138 vs 0.663 at N = 15 (ratio 0.208); "
                           "0.206 is the mean ratio")},
            "dspark": {
                "value": 1.0, "basis": "literature",
                "source": ("InferenceX golden AL distribution kimik3_dspark_probabilistic_sample_method_"
                           "block_rejection_sample_method.yaml vs argmax (acceptance.csv): tau 3.00 vs 2.87 at "
                           "k=3 - DSpark's Markov head keeps probabilistic drafting from collapsing")},
            "default": {
                "value": 1.0, "basis": "assumed",
                "source": ("autoregressive drafters condition each draft on the previous one; standard rejection "
                           "sampling with sampled drafts is lossless (Leviathan et al. 2023 [S1])")},
        },
        "methods": methods,
    }


# ------------------------------------------------------------------------------------------------
# YAML writer: block style for mappings, flow style for number lists, a provenance header
# ------------------------------------------------------------------------------------------------

HEADER = """\
# Acceptance profiles for capacity.spec.acceptance (speculative decoding), GENERATED - do not edit by hand.
# Regenerate with:  python scripts/fit_acceptance_profiles.py
#
# Provenance
# * methods.<m>.targets.<hf id>.<dataset>: from capacity/data/measurements/seed_spec_decode.csv, the vLLM blog
#   2026-08-23 "Exploring Speculative Decoding in vLLM on AMD GPUs" (AMD and Embedded LLM), appendix panels,
#   https://vllm.ai/blog/2026-08-23-speculative-decoding-amd-gpus (vLLM 0.23.1rc1, ROCm 7.2, MI300X; MiniMax on
#   MI355X). Temperature, load and output lengths are not reported by the article (rates are taken as T = 0).
#   - by_n.<N>: conditional rates a_j = S_j / S_{j-1} of the row measured with N drafts (S = the row's marginal
#     per_position_acceptance). Used by default: for a requested N the row of that N; between two measured N a
#     linear interpolation in N (the shorter row extended with the decay); below the smallest measured N the
#     smallest row truncated; above the largest the largest row extended with the decay.
#   - rates: the pooled profile, for each position j the arithmetic mean over the rows with N >= j of the
#     conditional rate at j (one chain for all N; profile_rates() without num_spec returns it).
#   - Acceptance falls slightly as N grows in every panel (requests that accept well finish in fewer steps, so
#     large-N averages weight hard requests more; parallel drafters also degrade). The pooled chain cannot follow
#     that; its errors are in fit.pooled.
# * methods.<m>.decay: fitted per method family (see rule); never above 1, so an extended rate never exceeds the
#   last measured one.
# * methods.<m>.chat_tau_ratio: the seed article has no chat rows; chat = the target's math profile with every
#   conditional rate multiplied by one factor c chosen so that tau(7 drafts) = ratio x math tau(7) (assumption;
#   the ratio's source is on each entry).
# * methods.<m>.chat_factor: that factor c, solved by the script (brentq) for each measured target and for the mean
#   over the measured targets (an unmeasured target), so the simulator reads it instead of solving.
# * methods.draft_model / methods.ngram: no seed rows; literature tau(k) curves (source on each entry) fitted
#   with a two-parameter chain (a_1, then a constant rate).
# * temperature, probabilistic_draft_factor: assumed values with their sources.
# * Workload types: GSM8K and MATH500 -> math, HumanEval and MBPP -> code (workload_types). A target without
#   measurements gets the arithmetic mean (position by position) of the method's profiles across the measured
#   targets.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _repr_list(dumper, data):
    flow = all(isinstance(x, (int, float)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _repr_list)


def render(doc: dict) -> str:
    buf = io.StringIO()
    yaml.dump(doc, buf, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return HEADER + buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the shipped YAML is out of date")
    args = ap.parse_args(argv)
    text = render(add_chat_factors(build()))
    if args.check:
        current = OUT_YAML.read_text() if OUT_YAML.exists() else ""
        if current != text:
            print(f"{OUT_YAML} is out of date; run scripts/fit_acceptance_profiles.py", file=sys.stderr)
            return 1
        return 0
    OUT_YAML.write_text(text)
    doc = yaml.safe_load(text)
    fs = doc["fit_summary"]
    print(f"wrote {OUT_YAML}")
    for k, v in fs.items():
        print(f"  {k}: {v}")
    for m, e in doc["methods"].items():
        if "fit" in e:
            print(f"  {m}: decay {e['decay']['value']} (next-N extrapolation {e['decay']['fit']}), "
                  f"pooled {e['fit']['pooled']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
