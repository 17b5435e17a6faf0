"""Acceptance models (capacity.spec.acceptance) against independent truth.

Truth used here: the closed forms of the truncated geometric (Leviathan et al. 2023), the chain
identity E[tau] = 1 + sum S_j, and the seed article's published per-position acceptance and mean
accepted length (capacity/data/measurements/seed_spec_decode.csv, which satisfy that identity within
their 0.01 rounding), plus hand-walked traces and published literature tau(k) values.

Stated tolerances for the fitted profiles (checked below against every seed row):
* by-N profile (the default): |E[tau] - mean_accepted_length| <= 0.02 for every row;
* pooled chain (one chain for all N): <= 0.20 for the autoregressive drafters (mtp, gemma4_mtp, eagle3),
  <= 0.80 for the parallel drafters (dflash, dspark), median <= 0.06 over all rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capacity.spec.acceptance import (
    AcceptanceModel, ChainAcceptance, HeterogeneousAcceptance, HistogramAcceptance, IIDAcceptance,
    ProfileAcceptance, TraceAcceptance, acceptance_from_config, load_profiles, profile_rates, validate_rates,
)
from capacity.errors import CapacityError
from capacity.paths import data_dir

ROOT = Path(__file__).resolve().parent.parent
SEED = data_dir() / "measurements" / "seed_spec_decode.csv"
LABEL_TO_KEY = {"Native MTP": "mtp", "Gemma 4 MTP": "gemma4_mtp", "EAGLE-3": "eagle3", "DFlash": "dflash",
                "DSpark": "dspark"}


@pytest.fixture(scope="module")
def seed() -> pd.DataFrame:
    d = pd.read_csv(SEED)
    d["S"] = d["per_position_acceptance"].map(lambda s: [float(x) for x in s.split()])
    return d


def _pmf_from_survival(S: np.ndarray) -> np.ndarray:
    """P(A = j), j = 0..N, from S_1..S_N (P(A >= 0) = 1)."""
    s = np.concatenate([[1.0], S, [0.0]])
    return s[:-1] - s[1:]


def _mean_se(pmf: np.ndarray, n: int) -> tuple[float, float]:
    j = np.arange(len(pmf))
    mean = float((j * pmf).sum())
    var = float((j**2 * pmf).sum()) - mean**2
    return mean + 1.0, float(np.sqrt(var / n))


# --------------------------------------------------------------------------------------------------
# M0: i.i.d.
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha,N", [(0.7, 1), (0.7, 3), (0.85, 7), (0.5, 15)])
def test_iid_matches_leviathan_closed_form(alpha: float, N: int) -> None:
    m = IIDAcceptance(alpha)
    closed = (1 - alpha ** (N + 1)) / (1 - alpha)
    assert m.expected_tokens(N) == pytest.approx(closed, rel=1e-12)
    # truncated geometric: P(A=j) = alpha^j (1-alpha) for j < N, P(A=N) = alpha^N
    pmf = np.array([alpha**j * (1 - alpha) for j in range(N)] + [alpha**N])
    n = 200_000
    mean_tau, se = _mean_se(pmf, n)
    assert mean_tau == pytest.approx(closed, rel=1e-12)
    a = m.sample(np.arange(n), np.full(n, N), np.random.default_rng(1))
    assert a.min() >= 0 and a.max() <= N
    assert abs(a.mean() + 1 - closed) < 4 * se
    # the whole distribution, not only the mean
    freq = np.bincount(a, minlength=N + 1) / n
    assert np.all(np.abs(freq - pmf) < 4 * np.sqrt(pmf * (1 - pmf) / n) + 1e-12)


def test_iid_edges() -> None:
    rng = np.random.default_rng(0)
    assert (IIDAcceptance(1.0).sample(np.arange(50), np.full(50, 4), rng) == 4).all()
    assert (IIDAcceptance(0.0).sample(np.arange(50), np.full(50, 4), rng) == 0).all()
    assert IIDAcceptance(1.0).expected_tokens(4) == 5.0
    a = IIDAcceptance(0.9).sample(np.arange(6), np.array([0, 1, 2, 0, 5, 3]), rng)
    assert a[0] == 0 and a[3] == 0
    assert (a <= np.array([0, 1, 2, 0, 5, 3])).all()
    with pytest.raises(CapacityError):
        IIDAcceptance(1.5)


def test_iid_sample_steps_independent_and_same_stream() -> None:
    m = IIDAcceptance(0.75)
    ids = np.arange(4000)
    steps = m.sample_steps(ids, 4, 30, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    repeated = np.stack([m.sample(ids, np.full(len(ids), 4), rng) for _ in range(30)])
    np.testing.assert_array_equal(steps, repeated)
    # per-step independence: lag-1 correlation within a request ~ 0
    x, y = steps[:-1].ravel().astype(float), steps[1:].ravel().astype(float)
    r = np.corrcoef(x, y)[0, 1]
    assert abs(r) < 4 / np.sqrt(len(x))


def test_skip_steps_advances_the_stream_as_sample_steps() -> None:
    """The engine samples a run's steps in two parts and skips the second when it is not needed: the
    draws after it must be the ones a whole-run sample would leave."""
    m = IIDAcceptance(0.6)
    ids = np.arange(7)
    whole, split = np.random.default_rng(3), np.random.default_rng(3)
    all_steps = m.sample_steps(ids, 3, 40, whole)
    np.testing.assert_array_equal(m.sample_steps(ids, 3, 15, split), all_steps[:15])
    m.skip_steps(ids, 3, 25, split)
    assert whole.bit_generator.state == split.bit_generator.state
    np.testing.assert_array_equal(m.sample_steps(ids, 3, 5, split), m.sample_steps(ids, 3, 5, whole))


# --------------------------------------------------------------------------------------------------
# M1: chain, seed rows, profiles
# --------------------------------------------------------------------------------------------------

def test_chain_reproduces_every_seed_row_from_its_own_rates(seed: pd.DataFrame) -> None:
    for r in seed.itertuples():
        N = int(r.num_speculative_tokens)
        assert len(r.S) == N
        m = ChainAcceptance(validate_rates(r.S, "marginal"))
        np.testing.assert_allclose(m.survival(N), r.S, atol=1e-12)
        assert abs(m.expected_tokens(N) - r.mean_accepted_length) <= 0.02, (r.target, r.method, r.dataset, N)


def test_chain_sampling_mean_within_se() -> None:
    rates = [0.9, 0.8, 0.85, 0.7, 0.75]
    m = ChainAcceptance(rates)
    S = np.cumprod(rates)
    n = 200_000
    mean_tau, se = _mean_se(_pmf_from_survival(S), n)
    assert m.expected_tokens(5) == pytest.approx(1 + S.sum(), rel=1e-12)
    a = m.sample(np.arange(n), np.full(n, 5), np.random.default_rng(3))
    assert abs(a.mean() + 1 - mean_tau) < 4 * se
    # with 3 drafts the same chain is truncated
    a3 = m.sample(np.arange(n), np.full(n, 3), np.random.default_rng(4))
    m3, se3 = _mean_se(_pmf_from_survival(S[:3]), n)
    assert abs(a3.mean() + 1 - m3) < 4 * se3


def test_chain_extension_uses_decay_never_above_last_rate() -> None:
    m = ChainAcceptance([0.9, 0.8], decay=0.9)
    S = m.survival(5)
    a = S / np.concatenate([[1.0], S[:-1]])
    np.testing.assert_allclose(a, [0.9, 0.8, 0.72, 0.648, 0.5832])
    assert (a[2:] <= 0.8).all()
    with pytest.raises(CapacityError):
        ChainAcceptance([0.9], decay=1.1)


def test_by_n_profile_reproduces_every_seed_row(seed: pd.DataFrame) -> None:
    for r in seed.itertuples():
        N = int(r.num_speculative_tokens)
        m = acceptance_from_config({"model": "profile", "dataset": r.dataset}, method=LABEL_TO_KEY[r.method],
                                   target=r.target)
        assert abs(m.expected_tokens(N) - r.mean_accepted_length) <= 0.02, (r.target, r.method, r.dataset, N)


def test_pooled_profile_within_stated_tolerance(seed: pd.DataFrame) -> None:
    errs = []
    for r in seed.itertuples():
        N, key = int(r.num_speculative_tokens), LABEL_TO_KEY[r.method]
        rates, prov = profile_rates(key, r.target, r.dataset)
        assert "pooled" in prov and r.target in prov
        err = abs(1 + np.cumprod(rates[:N]).sum() - r.mean_accepted_length)
        tol = 0.80 if key in ("dflash", "dspark") else 0.20
        assert err <= tol, (r.target, r.method, r.dataset, N, err)
        errs.append(err)
    assert np.median(errs) <= 0.06


def test_pooled_rule_is_mean_of_conditional_rates_over_rows(seed: pd.DataFrame) -> None:
    g = seed[(seed.method == "EAGLE-3") & (seed.target == "Qwen/Qwen3-8B") & (seed.dataset == "MBPP")]
    rows = [np.array(S) / np.concatenate([[1.0], S[:-1]]) for S in g.S]
    K = max(len(a) for a in rows)
    expected = [np.mean([a[j] for a in rows if len(a) > j]) for j in range(K)]
    rates, _ = profile_rates("eagle3", "Qwen/Qwen3-8B", "MBPP")
    np.testing.assert_allclose(rates, expected, atol=1e-4)


def test_profile_extension_beyond_measured_n(seed: pd.DataFrame) -> None:
    g = seed[(seed.method == "EAGLE-3") & (seed.target == "moonshotai/Kimi-K2.5") & (seed.dataset == "GSM8K")]
    K = int(g.num_speculative_tokens.max())
    last = np.array(g.loc[g.num_speculative_tokens.idxmax(), "S"])
    last_rates = last / np.concatenate([[1.0], last[:-1]])
    rates, prov = profile_rates("eagle3", "moonshotai/Kimi-K2.5", "GSM8K", num_spec=K + 4)
    np.testing.assert_allclose(rates[:K], last_rates, atol=1e-4)
    assert (rates[K:] <= rates[K - 1] + 1e-12).all() and (np.diff(rates[K - 1:]) <= 1e-12).all()
    assert "extended" in prov and "decay" in prov
    decay = load_profiles()["methods"]["eagle3"]["decay"]["value"]
    assert 0 < decay <= 1
    np.testing.assert_allclose(rates[K:], rates[K - 1] * decay ** np.arange(1, 5))


def test_profile_interpolates_between_measured_n() -> None:
    lo, _ = profile_rates("dflash", "Qwen/Qwen3-8B", "GSM8K", num_spec=3)
    hi, _ = profile_rates("dflash", "Qwen/Qwen3-8B", "GSM8K", num_spec=7)
    mid, prov = profile_rates("dflash", "Qwen/Qwen3-8B", "GSM8K", num_spec=5)
    assert "interpolated" in prov
    np.testing.assert_allclose(mid[:3], 0.5 * lo + 0.5 * hi[:3])


def test_workload_types_unmeasured_targets_and_chat() -> None:
    gsm, _ = profile_rates("mtp", "Qwen/Qwen3.5-27B", "GSM8K")
    m500, _ = profile_rates("mtp", "Qwen/Qwen3.5-27B", "MATH500")
    math_rates, prov = profile_rates("mtp", "Qwen/Qwen3.5-27B", "math")
    np.testing.assert_allclose(math_rates, (gsm + m500) / 2)
    # unmeasured target: arithmetic mean over the measured targets (same length here: all measured to 7 or 5)
    targets = sorted(load_profiles()["methods"]["mtp"]["targets"])
    avg, prov = profile_rates("mtp", "Qwen/Qwen3.6-35B-A3B", "code", num_spec=5)
    parts = [profile_rates("mtp", t, "code", num_spec=5)[0] for t in targets]
    np.testing.assert_allclose(avg, np.mean(parts, axis=0))
    assert "not measured" in prov
    # chat: E[tau] with 7 drafts = ratio x math E[tau] (pooled chains)
    ratio = load_profiles()["methods"]["eagle3"]["chat_tau_ratio"]["value"]
    kw = {"method": "eagle3", "target": "Qwen/Qwen3-8B"}
    chat = acceptance_from_config({"model": "profile", "dataset": "chat", "by_n": False}, **kw)
    math_m = acceptance_from_config({"model": "profile", "dataset": "math", "by_n": False}, **kw)
    assert chat.expected_tokens(7) == pytest.approx(ratio * math_m.expected_tokens(7), rel=1e-6)
    # the default (cfg None) is the chat profile; a mapping without `model` is a profile
    default = acceptance_from_config(None, **kw)
    assert isinstance(default, ProfileAcceptance) and default.workload == "chat"
    implicit = acceptance_from_config({"dataset": "gsm8k"}, **kw)
    assert isinstance(implicit, ProfileAcceptance) and implicit.workload == "GSM8K"


def test_literature_fallbacks_reproduce_published_tau() -> None:
    # Qwen3-1.7B -> Qwen3-32B (vLLM), tau for k = 1..8 (modelling notes 1.5 (iii), [S12])
    published = [1.80, 2.40, 2.87, 3.28, 3.53, 3.70, 3.90, 4.04]
    m = acceptance_from_config({"model": "profile", "dataset": "chat"}, method="draft_model", target=None)
    for k, tau in enumerate(published, start=1):
        assert abs(m.expected_tokens(k) - tau) <= 0.05
    # SpecDecode-Bench n-gram, InstructCoder (code) and GSM8K (math), k = 1/3/5/7
    for ds, taus in (("code", [1.51, 2.03, 2.29, 2.45]), ("math", [1.11, 1.16, 1.18, 1.18])):
        m = acceptance_from_config({"model": "profile", "dataset": ds}, method="ngram", target="any/model")
        for k, tau in zip((1, 3, 5, 7), taus):
            assert abs(m.expected_tokens(k) - tau) <= 0.05
    _, prov = profile_rates("ngram", None, "HumanEval")
    assert "literature" in prov and "SpecDecode-Bench" in prov


def _chain_tau(rates: list[float]) -> float:
    """1 + sum_j prod_{i<=j} a_i, in plain Python."""
    tau, s = 1.0, 1.0
    for a in rates:
        s *= a
        tau += s
    return tau


def _math_chain_7(targets: dict, hf_id: str, decay: float) -> list[float]:
    """A target's math chain for 7 drafts from the YAML's pooled rates, computed here: each of its GSM8K and
    MATH500 chains extended to 7 positions (a_{K+m} = a_K decay^m), then averaged position by position."""
    chains = []
    for d in ("GSM8K", "MATH500"):
        if d in targets[hf_id]:
            r = list(targets[hf_id][d]["rates"])[:7]
            r += [r[-1] * decay ** m for m in range(1, 7 - len(r) + 1)]
            chains.append(r)
    return [sum(col) / len(col) for col in zip(*chains)]


def test_stored_chat_factors_solve_their_equation() -> None:
    """Every stored chat factor c (per measured target, and for the mean over the targets) solves
    tau(7 drafts of c * math rates) = chat_tau_ratio x tau(7 drafts of math rates), computed here from the
    YAML's pooled rates without the runtime's profile code; and the runtime's chat profile uses it."""
    checked = 0
    for key, m in load_profiles()["methods"].items():
        if "chat_tau_ratio" not in m:
            assert "chat_factor" not in m
            continue
        ratio, decay, targets = m["chat_tau_ratio"]["value"], m["decay"]["value"], m["targets"]
        table = m["chat_factor"]
        assert sorted(table["by_target"]) == sorted(targets)
        per_target = {t: _math_chain_7(targets, t, decay) for t in targets}
        mean = [sum(col) / len(col) for col in zip(*(per_target[t] for t in sorted(targets)))]
        cases = [(t, table["by_target"][t], per_target[t]) for t in targets] + [(None, table["mean_of_targets"], mean)]
        for hf_id, c, rates in cases:
            assert 0.0 < c <= 1.0
            want = ratio * _chain_tau(rates)
            assert _chain_tau([c * a for a in rates]) == pytest.approx(want, rel=1e-8, abs=0), (key, hf_id)
            # the runtime's chat profile is the math profile times this c
            for target in ([hf_id] if hf_id else [None, "not/measured-model"]):
                chat, _ = profile_rates(key, target, "chat")
                base, _ = profile_rates(key, target, "math")
                np.testing.assert_array_equal(chat, base * c)
            checked += 1
    assert checked >= 15


def test_a_simulation_imports_no_scipy() -> None:
    """The default scenario (chat profile, Gemma 4 MTP) simulates without importing scipy: the chat factor
    is stored data, not solved at start-up."""
    code = ("import sys\nfrom capacity.inputs import scenario\nfrom capacity.sim import simulate\n"
            "simulate.run(scenario.load(None, ['traffic.num_requests=20']))\n"
            "print(sorted(m for m in sys.modules if m == 'scipy' or m.startswith('scipy.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_shipped_yaml_is_what_the_script_generates() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_acceptance_profiles.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --------------------------------------------------------------------------------------------------
# M4: histogram
# --------------------------------------------------------------------------------------------------

def test_histogram_reproduces_probs_and_truncates() -> None:
    probs = np.array([0.284, 0.234, 0.167, 0.109, 0.206])  # P(tau = 1..5), measured with K = 4
    m = HistogramAcceptance(probs)
    n = 200_000
    a = m.sample(np.arange(n), np.full(n, 4), np.random.default_rng(5))
    freq = np.bincount(a + 1, minlength=6)[1:] / n
    assert np.all(np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / n))
    assert m.expected_tokens(4) == pytest.approx(float((np.arange(1, 6) * probs).sum()))
    # two drafts: A = min(A, 2)
    a2 = m.sample(np.arange(n), np.full(n, 2), np.random.default_rng(6))
    p2 = np.array([probs[0], probs[1], probs[2:].sum()])
    f2 = np.bincount(a2, minlength=3) / n
    assert np.all(np.abs(f2 - p2) < 4 * np.sqrt(p2 * (1 - p2) / n))
    # more drafts than measured never help
    assert m.expected_tokens(8) == pytest.approx(m.expected_tokens(4))
    with pytest.raises(CapacityError):
        HistogramAcceptance([0.5, 0.2])


# --------------------------------------------------------------------------------------------------
# M2: heterogeneity and correlation
# --------------------------------------------------------------------------------------------------

def _request_matrix(model: AcceptanceModel, R: int, T: int, N: int, seed: int) -> np.ndarray:
    return model.sample_steps(np.arange(R), N, T, np.random.default_rng(seed)).astype(float)  # (T, R)


def test_heterogeneous_keeps_population_mean_and_spreads_requests() -> None:
    base = ChainAcceptance([0.85, 0.8, 0.78, 0.75])
    R, T, N = 4000, 20, 4
    het = HeterogeneousAcceptance(base, concentration=4.0)
    x = _request_matrix(het, R, T, N, 11)
    per_request = x.mean(axis=0)
    se = per_request.std(ddof=1) / np.sqrt(R)
    assert abs(per_request.mean() + 1 - base.expected_tokens(N)) < 4 * se
    assert het.expected_tokens(N) == base.expected_tokens(N)
    plain = _request_matrix(base, R, T, N, 11).mean(axis=0)
    assert per_request.var() > 2.0 * plain.var()
    # intraclass correlation of A (one-way ANOVA estimator) = 1 / (1 + concentration) = 0.2
    msb = T * per_request.var(ddof=1)
    msw = ((x - per_request) ** 2).sum() / (R * (T - 1))
    icc = (msb - msw) / (msb + (T - 1) * msw)
    assert icc == pytest.approx(0.2, abs=0.02)


def _lag1(x: np.ndarray) -> float:
    return float(np.corrcoef(x[:-1].ravel(), x[1:].ravel())[0, 1])


@pytest.mark.parametrize("concentration,correlation,N", [(None, 0.3, 3), (10.0, 0.4, 3), (None, 0.75, 1)])
def test_correlation_gives_configured_lag1(concentration, correlation, N) -> None:
    base = ChainAcceptance([0.8, 0.75, 0.7])
    het = HeterogeneousAcceptance(base, concentration=concentration, correlation=correlation)
    x = _request_matrix(het, 3000, 40, N, 12)
    assert _lag1(x) == pytest.approx(correlation, abs=0.03)
    assert x.mean() + 1 == pytest.approx(base.expected_tokens(N), abs=0.03)


def test_heterogeneous_sample_steps_matches_repeated_sample() -> None:
    base = IIDAcceptance(0.8)
    R, T, N = 3000, 12, 3
    a = HeterogeneousAcceptance(base, concentration=5.0, correlation=0.35)
    b = HeterogeneousAcceptance(base, concentration=5.0, correlation=0.35)
    xs = a.sample_steps(np.arange(R), N, T, np.random.default_rng(21)).astype(float)
    rng = np.random.default_rng(22)
    xr = np.stack([b.sample(np.arange(R), np.full(R, N), rng) for _ in range(T)]).astype(float)
    se = np.sqrt(xs.var() / R * (1 + T * 0.35)) / np.sqrt(T) * 2
    assert abs(xs.mean() - xr.mean()) < 4 * se
    assert _lag1(xs) == pytest.approx(_lag1(xr), abs=0.04)
    assert xs.mean(axis=0).var() == pytest.approx(xr.mean(axis=0).var(), rel=0.15)
    # state carries over from sample_steps into sample (same request, continuing AR state)
    nxt = a.sample(np.arange(R), np.full(R, N), np.random.default_rng(23)).astype(float)
    assert np.corrcoef(xs[-1], nxt)[0, 1] == pytest.approx(0.35, abs=0.06)


def test_heterogeneous_errors() -> None:
    with pytest.raises(CapacityError, match="below"):
        HeterogeneousAcceptance(IIDAcceptance(0.8), concentration=4.0, correlation=0.1)
    with pytest.raises(CapacityError):
        HeterogeneousAcceptance(TraceAcceptance([[1, 2]]), concentration=4.0)
    with pytest.raises(CapacityError):
        HeterogeneousAcceptance(IIDAcceptance(0.8), concentration=-1.0)
    with pytest.raises(CapacityError):
        acceptance_from_config({"model": "heterogeneous", "base": {"model": "trace", "path": "x.csv"}},
                               method="eagle3", target=None)


# --------------------------------------------------------------------------------------------------
# M3: trace replay
# --------------------------------------------------------------------------------------------------

def test_trace_replay_walks_hand_made_trace() -> None:
    traces = [[3, 1, 2, 5, 1], [1, 4]]
    # request 0 (trace 0), n = 2: p=0 acc 3 -> emit 3 (A=2), p=3 acc 5 -> emit 3 (A=2), p=6 -> 6 mod 5 = 1
    # acc 1 -> emit 1 (A=0), p=7 -> 2 acc 2 -> emit 2 (A=1), p=9 -> 4 acc 1 -> A=0, p=10 -> 0 acc 3 -> A=2
    # request 1 (trace 1), n = 2: p=0 acc 1 -> A=0, p=1 acc 4 -> emit 3 A=2, p=4 -> 0 acc 1 -> A=0, p=5 -> 1
    # acc 4 -> A=2 ...
    # request 2 replays trace 0 (2 mod 2)
    m = TraceAcceptance(traces)
    got = np.stack([m.sample(np.array([0, 1, 2]), np.array([2, 2, 2]), None) for _ in range(6)])
    np.testing.assert_array_equal(got[:, 0], [2, 2, 0, 1, 0, 2])
    np.testing.assert_array_equal(got[:, 1], [0, 2, 0, 2, 0, 2])
    np.testing.assert_array_equal(got[:, 2], [2, 2, 0, 1, 0, 2])
    np.testing.assert_array_equal(m.positions(np.array([0, 1])), [3 + 3 + 1 + 2 + 1 + 3, 1 + 3 + 1 + 3 + 1 + 3])
    # more drafts: request 5 (trace 1) with n = 7 emits the whole acc_len; n = 0 emits 1
    np.testing.assert_array_equal(m.sample(np.array([5, 4]), np.array([7, 0]), None), [0, 0])
    np.testing.assert_array_equal(m.sample(np.array([5, 4]), np.array([7, 0]), None), [3, 0])
    # sample_steps = repeated sample (deterministic replay)
    a, b = TraceAcceptance(traces), TraceAcceptance(traces)
    steps = a.sample_steps(np.array([0, 1, 3]), 3, 7, None)
    rep = np.stack([b.sample(np.array([0, 1, 3]), np.array([3, 3, 3]), None) for _ in range(7)])
    np.testing.assert_array_equal(steps, rep)
    # population survival: share of all recorded positions with acc_len >= j + 1
    flat = np.array([3, 1, 2, 5, 1, 1, 4])
    np.testing.assert_allclose(m.survival(3), [(flat >= 2).mean(), (flat >= 3).mean(), (flat >= 4).mean()])


def test_trace_files(tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("request_id,acc_len\n10,3 1 2 5 1\n11,1 4\n")
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(json.dumps({"request_id": 10, "acc_len": [3, 1, 2, 5, 1]}) + "\n"
                     + json.dumps({"request_id": 11, "acc_len": "1 4"}) + "\n")
    for path in (csv_path, jsonl):
        m = acceptance_from_config({"model": "trace", "path": str(path)}, method="ngram", target=None)
        np.testing.assert_array_equal(m.sample_steps(np.array([0, 1]), 2, 3, None), [[2, 0], [2, 2], [0, 0]])
    bad = tmp_path / "bad.csv"
    bad.write_text("request_id,acc_len\n0,3 0 2\n")
    with pytest.raises(CapacityError):
        TraceAcceptance(bad)
    with pytest.raises(CapacityError, match="not found"):
        TraceAcceptance(tmp_path / "missing.csv")


# --------------------------------------------------------------------------------------------------
# Validation, configuration, determinism
# --------------------------------------------------------------------------------------------------

def test_validate_rates() -> None:
    np.testing.assert_allclose(validate_rates([0.8, 0.6], "marginal"), [0.8, 0.75])
    np.testing.assert_allclose(validate_rates([0.8, 0.6], "conditional"), [0.8, 0.6])
    with pytest.raises(CapacityError) as e:
        validate_rates([0.9, 1.2], "conditional")
    assert "1.2" in str(e.value) and "outside [0, 1]" in str(e.value)
    with pytest.raises(CapacityError) as e:
        validate_rates([0.9, 0.7, 0.8], "marginal")
    assert str(e.value) == ("marginal acceptance must not increase: S_3=0.8 > S_2=0.7; fix the list or use "
                            "basis: conditional")
    with pytest.raises(CapacityError):
        validate_rates([0.9], "cumulative")
    with pytest.raises(CapacityError):
        validate_rates([], "conditional")


def test_config_errors_are_one_line() -> None:
    cases = [
        ({"model": "magic"}, "eagle3"),
        ({"model": "iid"}, "eagle3"),
        ({"model": "iid", "alpha": 0.7, "alpah": 1}, "eagle3"),
        ({"model": "profile", "dataset": "poetry"}, "eagle3"),
        ({"model": "iid", "alpha": 0.7}, "medusa"),
        ({"model": "iid", "alpha": 0.7, "temperature": -1}, "eagle3"),
        ({"model": "iid", "alpha": 0.7, "draft_sampling": "greedy"}, "eagle3"),
        ({"model": "chain", "rates": [0.9, 0.7, 0.8], "basis": "marginal"}, "eagle3"),
        ("iid", "eagle3"),
    ]
    for cfg, method in cases:
        with pytest.raises(CapacityError) as e:
            acceptance_from_config(cfg, method=method, target=None)
        assert "\n" not in str(e.value) and str(e.value)
    with pytest.raises(CapacityError, match="unknown acceptance model 'magic'"):
        acceptance_from_config({"model": "magic"}, method="eagle3", target=None)


def test_config_forms_and_temperature() -> None:
    kw = {"method": "eagle3", "target": None}
    assert isinstance(acceptance_from_config({"model": "iid", "alpha": 0.7}, **kw), IIDAcceptance)
    chain = acceptance_from_config({"model": "chain", "rates": [0.8, 0.6], "basis": "marginal"}, **kw)
    np.testing.assert_allclose(chain.survival(2), [0.8, 0.6])
    assert isinstance(acceptance_from_config({"model": "histogram", "probs": [0.5, 0.5]}, **kw), HistogramAcceptance)
    het = acceptance_from_config({"model": "heterogeneous", "base": {"model": "iid", "alpha": 0.7},
                                  "concentration": 20, "correlation": 0.3}, **kw)
    assert isinstance(het, HeterogeneousAcceptance)
    # a_j(T) = a_j(0) (1 - 0.04 T)
    beta = load_profiles()["temperature"]["beta"]
    assert beta == 0.04
    hot = acceptance_from_config({"model": "iid", "alpha": 0.8}, **kw, temperature=1.0)
    np.testing.assert_allclose(hot.survival(3), (0.8 * 0.96) ** np.arange(1, 4))
    hot_chain = acceptance_from_config({"model": "chain", "rates": [0.9, 0.8], "temperature": 0.5}, **kw)
    np.testing.assert_allclose(hot_chain.survival(2), np.cumprod(np.array([0.9, 0.8]) * 0.98))
    # probabilistic drafting collapses a parallel DFlash drafter at T > 0, not at T = 0, not an AR drafter
    f = load_profiles()["probabilistic_draft_factor"]["dflash"]["value"]
    base = acceptance_from_config({"model": "iid", "alpha": 0.8}, method="dflash", target=None, temperature=1.0)
    prob = acceptance_from_config({"model": "iid", "alpha": 0.8}, method="dflash", target=None, temperature=1.0,
                                  draft_sampling="probabilistic")
    assert prob.alpha == pytest.approx(base.alpha * f)
    cold = acceptance_from_config({"model": "iid", "alpha": 0.8}, method="dflash", target=None,
                                  draft_sampling="probabilistic")
    assert cold.alpha == pytest.approx(0.8)
    ar = acceptance_from_config({"model": "iid", "alpha": 0.8}, method="eagle3", target=None, temperature=1.0,
                                draft_sampling="probabilistic")
    assert ar.alpha == pytest.approx(base.alpha)


@pytest.mark.parametrize("cfg", [
    {"model": "iid", "alpha": 0.7},
    {"model": "chain", "rates": [0.9, 0.8, 0.7]},
    {"model": "profile", "dataset": "GSM8K"},
    {"model": "histogram", "probs": [0.3, 0.3, 0.2, 0.2]},
    {"model": "heterogeneous", "base": {"model": "profile", "dataset": "code"}, "concentration": 5,
     "correlation": 0.4},
])
def test_deterministic_per_seed(cfg: dict) -> None:
    ids, spec = np.arange(500), np.tile(np.array([0, 1, 2, 3, 5]), 100)

    def run(seed: int) -> np.ndarray:
        m = acceptance_from_config(cfg, method="eagle3", target="Qwen/Qwen3-8B")
        rng = np.random.default_rng(seed)
        out = [m.sample(ids, spec, rng) for _ in range(3)] + list(m.sample_steps(ids[:50], 3, 4, rng))
        return np.concatenate(out)

    a, b, c = run(42), run(42), run(43)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    first = a[:500]
    assert (first[spec == 0] == 0).all() and (first <= spec).all() and (first >= 0).all()


def test_rate_scale_multiplies_every_conditional_rate() -> None:
    """The what-if "acceptance drops by 20 %": every conditional rate x 0.8, so under i.i.d. alpha the
    expected tokens per step are the closed form at 0.8 alpha, and a profile's rates are its own x 0.8."""
    iid = acceptance_from_config({"model": "iid", "alpha": 0.75, "rate_scale": 0.8}, method="eagle3", target=None)
    a = 0.75 * 0.8
    assert iid.expected_tokens(4) == pytest.approx((1 - a ** 5) / (1 - a))
    base = acceptance_from_config({"dataset": "gsm8k"}, method="dflash", target="Qwen/Qwen3-8B")
    low = acceptance_from_config({"dataset": "gsm8k", "rate_scale": 0.8}, method="dflash", target="Qwen/Qwen3-8B")
    assert low.rates(7) == pytest.approx(np.minimum(base.rates(7) * 0.8, 1.0))
    capped = acceptance_from_config({"model": "iid", "alpha": 0.9, "rate_scale": 1.5}, method="eagle3", target=None)
    assert capped.expected_tokens(3) == pytest.approx(4.0)          # rates stay within [0, 1]
    with pytest.raises(CapacityError, match="rate_scale"):
        acceptance_from_config({"model": "iid", "alpha": 0.7, "rate_scale": -0.1}, method="eagle3", target=None)
