"""How many drafted tokens survive verification: acceptance models behind one interface.

Conventions (as vLLM's spec-decode metrics and the seed article): a request that drafts N tokens in a
verification step gets A accepted drafts, 0 <= A <= N, accepted left to right, and emits tau = A + 1
tokens (the accepted drafts plus the target's own bonus/correction token). Marginal survival
S_j = P(A >= j); conditional rate a_j = S_j / S_{j-1} (S_0 = 1); E[tau] = 1 + sum_{j<=N} S_j.

Every model implements `AcceptanceModel`:

* ``survival(n)``: S_1..S_n, the population average with n drafts;
* ``expected_tokens(n)``: 1 + sum S_j;
* ``sample(ids, num_spec, rng)``: accepted drafts per request for ONE verification step (``ids`` are the
  engine's request ids, stable over a request's life; per-request state is keyed on them);
* ``sample_steps(ids, num_spec, num_steps, rng)``: a (num_steps, len(ids)) array for consecutive steps of
  the same requests, distributed exactly as num_steps calls of ``sample`` (state advances in order);
* ``supports_runs``: True for the models without per-request state (iid, chain, profile, histogram),
  which also have ``skip_steps``, so the engine may fast-forward runs of decode steps.

Sampling uses one uniform (or one normal) per request per step and the inverse CDF,
A = #{j <= n : U < S_j}, which has exactly P(A >= j) = S_j - the same law as walking the chain
"accept position j with probability a_j, stop at the first rejection" (modelling notes 1.3), with fewer
random numbers. For the stateless models ``sample_steps`` draws the same stream as repeated ``sample``
calls, so both give identical results for one seed.

Models (modelling notes section 1.4):

* M0 `IIDAcceptance(alpha)`: Leviathan et al. 2023: S_j = alpha^j, A = min(Geom0(1 - alpha), N),
  E[tau] = (1 - alpha^(N+1)) / (1 - alpha).
* M1 `ChainAcceptance(rates, decay)`: per-position conditional rates a_1..a_K; for j > K
  a_j = a_K * decay^(j-K) (decay <= 1: never above the last rate).
* M1 per seed profile `ProfileAcceptance`: a chain whose rates may depend on N (see "Profiles").
* M2 `HeterogeneousAcceptance(base, concentration, correlation)`: request-level spread and
  step-to-step correlation on top of a stateless base model, keeping the base's per-step law of A
  exactly (see its docstring for the parametrisation and why it is not a clipped Beta scale).
* M3 `TraceAcceptance(path | traces)`: replay of per-request ``acc_len`` lists (SpecDecode-Bench style).
* M4 `HistogramAcceptance(probs)`: P(tau = t), t = 1..K+1, measured with K drafts; fewer drafts truncate
  (A = min(A, n)); more drafts than K never help (S_j = 0 for j > K).

Profiles (data in ``capacity/data/acceptance_profiles.yaml``, fitted by
``scripts/fit_acceptance_profiles.py`` from the seed article's per-position acceptance; provenance at the
top of the YAML). `profile_rates(method, target, workload, num_spec)` applies these rules and returns
the rates with a provenance string:

* Measured method x target x dataset: the article measured each N separately and the rates fall slightly
  as N grows, so the default (``by_n``) uses the row of the requested N (it reproduces every row's mean
  accepted length within the article's 0.01 rounding); between two measured N it interpolates linearly in
  N (the shorter row extended with the decay); below the smallest measured N it truncates the smallest
  row; above the largest it extends the largest row with the method's decay. Leave-one-N-out, the
  interpolation predicts interior rows' mean accepted length with median |error| 0.02 overall (max 0.07
  for mtp/gemma4_mtp/eagle3, whose N step is 1; max 0.32 for DFlash and 0.48 for DSpark, measured only at
  N = 3, 7, 11, 15).
  Without ``num_spec`` (or with ``by_n: false``) the pooled chain is used: for each position j the
  arithmetic mean over the rows with N >= j of the conditional rate at j; it reproduces the rows' mean
  accepted length with median |error| 0.05, max 0.79 (DFlash/DSpark at N = 15; <= 0.17 for the
  autoregressive drafters) - see ``fit_summary`` in the YAML.
* N beyond the last measured position K: a_{K+m} = a_K * delta^m, delta fitted per method family
  (YAML ``methods.<m>.decay``, 0.92-0.96), 1.0 (assumed) for the literature fallbacks.
* Workload types: GSM8K and MATH500 -> ``math``; HumanEval and MBPP -> ``code``. A type is the arithmetic
  mean (position by position) of its datasets' profiles.
* ``chat`` has no seed rows: the math profile with every conditional rate multiplied by one factor c such
  that E[tau] with 7 drafts is ``chat_tau_ratio`` x the math E[tau] (ratios 0.55-0.73 per method from the
  DSpark paper's MT-Bench vs math columns and the ROCm DFlash blog's MTP rows; an ASSUMPTION that they carry
  over to these targets). c is solved once by ``scripts/fit_acceptance_profiles.py`` (brentq on the rates
  `chat_base_rates` gives) and stored per method and target in the YAML (``methods.<m>.chat_factor``), so a
  simulation does not import scipy for it.
* Target without measurements for the method (or ``None``): arithmetic mean, position by position, of the
  method's profiles for the same workload across the measured targets.
* Methods without seed rows (``draft_model``, ``ngram``): literature tau(k) curves fitted with a
  two-parameter chain (sources in the YAML): Qwen3-1.7B -> Qwen3-32B for draft_model (every workload,
  assumed), SpecDecode-Bench n-gram GSM8K (math; chat assumed alike) and InstructCoder (code).

Temperature (`acceptance_from_config`): rates given in a config or a profile are taken as T = 0 (argmax)
values; at temperature T every conditional rate is multiplied by max(0, 1 - beta*T), beta = 0.04
(assumed, modelling notes 1.7). ``draft_sampling: probabilistic`` at T > 0 multiplies them further by a
per-method factor: 0.206 for DFlash (assumed, derived from the DFlash MLX collapse tau 2.96 -> 1.16,
z-lab/dflash PR #169), 1.0 for DSpark (InferenceX: probabilistic DSpark does not collapse) and the
autoregressive drafters. Traces are replayed as recorded (temperature is not applied to them).
"""

from __future__ import annotations

import copy
import csv
import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import yaml

from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.spec.methods import canonical_name

DATASETS: tuple[str, ...] = ("GSM8K", "MATH500", "HumanEval", "MBPP")
WORKLOAD_TYPES: tuple[str, ...] = ("math", "code", "chat")
MODELS: tuple[str, ...] = ("iid", "chain", "profile", "heterogeneous", "histogram", "trace")

_WORKLOAD_ALIASES: dict[str, str] = {
    "gsm8k": "GSM8K", "math500": "MATH500", "math-500": "MATH500", "humaneval": "HumanEval", "mbpp": "MBPP",
    "math": "math", "code": "code", "coding": "code", "chat": "chat", "mt-bench": "chat", "mtbench": "chat",
    "sharegpt": "chat",
}
# E[tau] is matched at this many drafts when deriving chat from math (the DSpark paper's Table 1 setting).
_CHAT_MATCH_DRAFTS = 7
_PROFILE_FILE = "acceptance_profiles.yaml"


# --------------------------------------------------------------------------------------------------
# Interface
# --------------------------------------------------------------------------------------------------

@runtime_checkable
class AcceptanceModel(Protocol):
    supports_runs: bool
    """True when sampling keeps no per-request state: ``skip_steps(ids, num_spec, num_steps, rng)``
    then advances `rng` as ``sample_steps`` would, and the engine may fast-forward decode runs."""

    def survival(self, n: int) -> np.ndarray:
        """S_1..S_n = P(A >= j) with n drafts (population average)."""

    def expected_tokens(self, n: int) -> float:
        """E[tau] = 1 + sum_j S_j with n drafts."""

    def sample(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts per request for one verification step (0 where num_spec is 0)."""

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int,
                     rng: np.random.Generator) -> np.ndarray:
        """(num_steps, len(ids)) accepted drafts for consecutive steps of the same requests."""


def _ids_spec(ids: np.ndarray, num_spec: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    if type(ids) is np.ndarray and type(num_spec) is np.ndarray and ids.ndim == 1 and ids.dtype == np.int64 \
            and num_spec.dtype == np.int64 and num_spec.shape == ids.shape:
        return ids, num_spec                                         # the engine's (as below, without copies)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    spec = np.asarray(num_spec, dtype=np.int64)
    return ids, (spec if spec.shape == ids.shape else np.broadcast_to(spec, ids.shape))


def _count_below(thresholds_desc: np.ndarray, values: np.ndarray) -> np.ndarray:
    """#{j : values < thresholds[j]} for a non-increasing threshold vector (vectorised over values)."""
    if len(thresholds_desc) == 0:
        return np.zeros(values.shape, dtype=np.int64)
    return np.searchsorted(-thresholds_desc, -values, side="left").astype(np.int64)


def _extend(rates: np.ndarray, n: int, decay: float) -> np.ndarray:
    """Rates for positions 1..n: the given ones, then the last one times decay^m."""
    rates = np.asarray(rates, dtype=float)
    if n <= len(rates):
        return rates[:n].copy()
    if len(rates) == 0:
        raise CapacityError("an acceptance chain needs at least one rate; give `rates: [a_1, ...]`")
    return np.concatenate([rates, rates[-1] * decay ** np.arange(1, n - len(rates) + 1)])


class _Stateless:
    """Shared sampling for models defined by their survival curve alone (no per-request state)."""

    supports_runs = True

    def __init__(self) -> None:
        self._cache: dict[int, np.ndarray] = {}
        self._neg_cache: dict[int, np.ndarray] = {}

    def _survival(self, n: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _surv(self, n: int) -> np.ndarray:
        s = self._cache.get(n)
        if s is None:
            if n < 0:
                raise ValueError(f"number of drafts must be >= 0, got {n}")
            s = np.minimum.accumulate(np.clip(np.asarray(self._survival(int(n)), dtype=float), 0.0, 1.0)) \
                if n > 0 else np.zeros(0)
            s.setflags(write=False)
            self._cache[n] = s
        return s

    def survival(self, n: int) -> np.ndarray:
        return self._surv(int(n)).copy()

    def expected_tokens(self, n: int) -> float:
        return 1.0 + float(self._surv(int(n)).sum())

    def _accept_all(self, u: np.ndarray, n: int) -> np.ndarray:
        """Accepted drafts when every request drafts n (the engine's usual step): _count_below with
        the negated thresholds kept."""
        if n <= 0:
            return np.zeros(u.shape, dtype=np.int64)
        neg = self._neg_cache.get(n)
        if neg is None:
            neg = self._neg_cache[n] = -self._surv(int(n))
        if len(neg) == 0:
            return np.zeros(u.shape, dtype=np.int64)
        return neg.searchsorted(-u, side="left").astype(np.int64, copy=False)   # np.searchsorted without its wrapper

    def _accept(self, u: np.ndarray, spec: np.ndarray) -> np.ndarray:
        """u has shape (..., len(spec)); column i uses spec[i] drafts."""
        values = set(spec.tolist())
        if len(values) == 1:
            return self._accept_all(u, values.pop())
        out = np.zeros(u.shape, dtype=np.int64)
        for n in sorted(values):
            if n <= 0:
                continue
            cols = spec == n
            out[..., cols] = _count_below(self._surv(int(n)), u[..., cols])
        return out

    def sample(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        ids, spec = _ids_spec(ids, num_spec)
        return self._accept(rng.random(len(ids)), spec)

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int,
                     rng: np.random.Generator) -> np.ndarray:
        if isinstance(num_spec, (int, np.integer)):
            return self._accept_all(rng.random((int(num_steps), len(ids))), int(num_spec))
        ids, spec = _ids_spec(ids, num_spec)
        return self._accept(rng.random((int(num_steps), len(ids))), spec)

    def skip_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> None:
        """Advance `rng` as `sample_steps` with these arguments would, without the samples (they are
        drawn and dropped: one uniform per step and request)."""
        rng.random((int(num_steps), len(ids)))


# --------------------------------------------------------------------------------------------------
# M0, M1, M4
# --------------------------------------------------------------------------------------------------

def _number(value: Any, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise CapacityError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(x):
        raise CapacityError(f"{what} must be a finite number, got {value!r}")
    return x


class IIDAcceptance(_Stateless):
    """M0 (Leviathan et al. 2023): every position accepted with probability alpha, stop at the first
    rejection; S_j = alpha^j, E[tau] = (1 - alpha^(N+1)) / (1 - alpha)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = _number(alpha, "acceptance alpha")
        if not 0.0 <= self.alpha <= 1.0:
            raise CapacityError(f"acceptance alpha {self.alpha:g} is outside [0, 1]; give a probability")

    def _survival(self, n: int) -> np.ndarray:
        return self.alpha ** np.arange(1, n + 1, dtype=float)


def iid_alpha_for_length(mean_accepted_length: float, n: int) -> float:
    """The i.i.d. rate alpha whose mean accepted length (1 - alpha^(N+1)) / (1 - alpha) at N drafts is
    `mean_accepted_length` (tokens per verification step, the target's own token included)."""
    length = _number(mean_accepted_length, "mean accepted length")
    if n < 1 or not 1.0 <= length <= n + 1:
        raise CapacityError(f"mean accepted length {length:g} is impossible with N = {n}: it lies in [1, N + 1] "
                            "(it counts the target's own token)")
    if length >= n + 1 - 1e-12:
        return 1.0
    from scipy.optimize import brentq   # imported when first needed: scipy takes about a second to import

    return float(brentq(lambda a: 1.0 + float(np.sum(a ** np.arange(1, n + 1))) - length, 0.0, 1.0, xtol=1e-12))


class ChainAcceptance(_Stateless):
    """M1: conditional rates a_1..a_K; position j > K uses a_K * decay^(j-K) (decay in (0, 1])."""

    def __init__(self, conditional_rates: Sequence[float] | np.ndarray, decay: float = 1.0):
        super().__init__()
        self.rates = validate_rates(conditional_rates, "conditional")
        self.decay = _number(decay, "acceptance decay")
        if not 0.0 < self.decay <= 1.0:
            raise CapacityError(f"acceptance decay {self.decay:g} is outside (0, 1]; an extended rate must not "
                                "exceed the last measured one")

    def _survival(self, n: int) -> np.ndarray:
        return np.cumprod(_extend(self.rates, n, self.decay))


class HistogramAcceptance(_Stateless):
    """M4: probs[t-1] = P(tau = t), t = 1..K+1, measured with K drafts. With n < K drafts A = min(A, n);
    with n > K drafts A stays <= K (S_j = 0 for j > K). Probabilities summing to within 0.01 of 1 are
    renormalised (rounding in published histograms); a larger gap is an error."""

    def __init__(self, probs: Sequence[float] | np.ndarray):
        super().__init__()
        if isinstance(probs, (str, bytes)) or not isinstance(probs, (Sequence, np.ndarray)) or len(probs) < 1:
            raise CapacityError("histogram acceptance needs `probs: [P(tau=1), P(tau=2), ...]`, a non-empty list")
        p = np.array([_number(x, "histogram probability") for x in probs], dtype=float)
        if (p < 0).any():
            raise CapacityError(f"histogram probability {p[p < 0][0]:g} is negative; give P(tau = t) >= 0")
        total = float(p.sum())
        if abs(total - 1.0) > 0.01:
            raise CapacityError(f"histogram probabilities sum to {total:g}, not 1; give P(tau = t) for t = 1..K+1")
        self.probs = p / total
        # S_j = P(tau >= j + 1), j = 1..K
        self._tail = np.clip(np.cumsum(self.probs[::-1])[::-1][1:], 0.0, 1.0)

    @classmethod
    def from_survival(cls, survival: np.ndarray) -> "HistogramAcceptance":
        s = np.concatenate([[1.0], np.asarray(survival, dtype=float), [0.0]])
        return cls(np.maximum(s[:-1] - s[1:], 0.0))

    def scaled(self, factor: float) -> "HistogramAcceptance":
        """Every conditional rate times `factor` (S_j -> S_j * factor^j)."""
        if factor == 1.0:
            return self
        k = len(self._tail)
        return HistogramAcceptance.from_survival(self._tail * factor ** np.arange(1, k + 1))

    def _survival(self, n: int) -> np.ndarray:
        k = len(self._tail)
        return self._tail[:n] if n <= k else np.concatenate([self._tail, np.zeros(n - k)])


# --------------------------------------------------------------------------------------------------
# M2: heterogeneity and correlation
# --------------------------------------------------------------------------------------------------

_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(96)


def _latent_thresholds(surv: np.ndarray) -> np.ndarray:
    """c_j = Phi^-1(S_j): A >= j  <=>  X < c_j for a standard normal X."""
    from scipy.special import ndtri   # imported when first needed: scipy takes about a second to import

    with np.errstate(divide="ignore"):
        return ndtri(np.clip(surv, 0.0, 1.0))


def _lag_cov(c: np.ndarray, s: np.ndarray, r: float) -> float:
    """Cov(A, A') when the latent normals X, X' behind A and A' have correlation r (0 <= r <= 1).

    Cov = sum_ij [Phi2(c_i, c_j; r) - S_i S_j] = sum_ij int_0^r phi2(c_i, c_j; t) dt (Plackett's identity),
    integrated over t = sin(theta) with Gauss-Legendre nodes; at r = 1 it is Var(A) exactly.
    """
    fin = np.isfinite(c)
    c, s = c[fin], s[fin]
    if len(c) == 0 or r <= 0.0:
        return 0.0
    if r >= 1.0:
        return float((np.minimum.outer(s, s) - np.outer(s, s)).sum())
    top = math.asin(r)
    theta = 0.5 * top * (_GL_NODES + 1.0)
    w = 0.5 * top * _GL_WEIGHTS
    sin, cos = np.sin(theta), np.cos(theta)
    h, k = c[:, None, None], c[None, :, None]
    # (h^2 - 2hk sin + k^2) / (2 cos^2) = (h-k)^2 / (2 cos^2) + hk / (1 + sin), written without cancellation
    expo = -((h - k) ** 2) / (2.0 * cos**2) - h * k / (1.0 + sin)
    return float((np.exp(expo) * w).sum() / (2.0 * math.pi))


def _latent_corr_for(c: np.ndarray, s: np.ndarray, target: float) -> float:
    """The latent correlation r that gives Corr(A, A') = target (0 if A is degenerate)."""
    var = _lag_cov(c, s, 1.0)
    if var <= 1e-15 or target <= 0.0:
        return 0.0
    if target >= 1.0:
        return 1.0
    from scipy.optimize import brentq   # imported when first needed: scipy takes about a second to import

    return float(brentq(lambda r: _lag_cov(c, s, r) / var - target, 0.0, 1.0, xtol=1e-10))


class HeterogeneousAcceptance:
    """M2: per-request spread and step-to-step correlation over a stateless base model.

    Parametrisation (probit-shift / Gaussian copula). Each step of request r with n drafts draws a
    standard normal X and accepts A = #{j <= n : X < c_j}, c_j = Phi^-1(S_j) of the BASE model, so every
    step's A has exactly the base law (the population E[tau] is the base's for every n; tolerance = Monte
    Carlo error only). X = sqrt(rho) Z_r + sqrt(1 - rho) Y_{r,t}:

    * Z_r ~ N(0, 1), drawn once per request: request r's own survival curve is
      S_{r,j} = Phi((c_j - sqrt(rho) Z_r) / sqrt(1 - rho)), the base curve shifted on the probit scale
      (easy requests accept more at every position, and each request's curve is a valid non-increasing
      chain - no clipping). ``concentration`` kappa sets the between-request share of Var(A), the intraclass
      correlation, to 1 / (1 + kappa), the ICC of a beta-binomial with concentration kappa; rho is solved
      per n so that the ICC of A (not of the latent) hits that value. None = no spread.
    * Y_{r,t}: a stationary Gaussian AR(1) over the request's steps, Y_t = psi Y_{t-1} + sqrt(1-psi^2) eps_t.
      psi is solved per n so that the lag-1 autocorrelation of A between consecutive steps of one request
      is ``correlation`` (it includes the request-level part, like the "lag-1 corr of tau" of the
      SpecDecode-Bench traces, 0.09-0.38 for EAGLE; so it must be >= 1/(1+kappa)). None = no correlation
      beyond the request level.

    Why not a clipped Beta scale a_{r,j} = clip(s_r a_j): E[s^j] != 1 for j > 1, so the population curve
    drifts with N and needs an N-dependent correction, and clipping distorts high-acceptance profiles. Why
    not a 2-state easy/hard Markov regime for the correlation: a symmetric 2-state regime (acceptance
    probability p_easy or p_hard, each half the time, mean S_1) reaches at most a lag-1 correlation of
    (1 - S_1) / S_1 at N = 1 (p_easy = 1; 0.25 for S_1 = 0.8), below the measured n-gram values (0.75),
    and its reach depends on N; the AR(1) latent reaches any value in [ICC, 1) and keeps the per-step law
    exact. The lag-1 correlation is exact for consecutive steps with the
    same n; the ICC holds for every n.
    """

    supports_runs = False   # per-request latent state (Z_r, the AR(1) Y)

    def __init__(self, base: AcceptanceModel, concentration: float | None = None,
                 correlation: float | None = None):
        if not base.supports_runs:
            raise CapacityError("heterogeneous acceptance needs a base of model iid, chain, profile or histogram "
                                f"(got {type(base).__name__}); set `base: {{model: profile, ...}}`")
        self.base = base
        self.concentration = None if concentration is None else _number(concentration, "acceptance concentration")
        if self.concentration is not None and self.concentration <= 0:
            raise CapacityError(f"acceptance concentration {self.concentration:g} must be > 0 (larger = less spread "
                                "between requests); omit it for no spread")
        self.icc = 0.0 if self.concentration is None else 1.0 / (1.0 + self.concentration)
        self.correlation = None if correlation is None else _number(correlation, "acceptance correlation")
        if self.correlation is not None:
            if not 0.0 <= self.correlation < 1.0:
                raise CapacityError(f"acceptance correlation {self.correlation:g} is outside [0, 1); give the lag-1 "
                                    "autocorrelation of accepted tokens between consecutive steps")
            if self.correlation < self.icc - 1e-12:
                raise CapacityError(f"acceptance correlation {self.correlation:g} is below 1/(1+concentration) = "
                                    f"{self.icc:.3g}, the correlation the request-level spread alone gives; raise "
                                    "correlation or concentration")
        self._params: dict[int, tuple[np.ndarray, float, float]] = {}
        self._z = np.zeros(0)
        self._y = np.zeros(0)
        self._seen = np.zeros(0, dtype=bool)

    # -- population quantities are the base's --------------------------------------------------
    def survival(self, n: int) -> np.ndarray:
        return self.base.survival(n)

    def expected_tokens(self, n: int) -> float:
        return self.base.expected_tokens(n)

    def params(self, n: int) -> tuple[np.ndarray, float, float]:
        """(thresholds c_1..c_n, rho, psi) used with n drafts."""
        p = self._params.get(n)
        if p is None:
            s = self.base.survival(int(n))
            c = _latent_thresholds(s)
            rho = _latent_corr_for(c, s, self.icc) if self.icc > 0 else 0.0
            psi = 0.0
            if self.correlation is not None and rho < 1.0:
                r1 = max(_latent_corr_for(c, s, self.correlation), rho)
                psi = min((r1 - rho) / (1.0 - rho), 1.0 - 1e-12)
            p = (c, rho, psi)
            self._params[n] = p
        return p

    def _start(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        if len(ids) == 0:
            return
        top = int(ids.max()) + 1
        if top > len(self._seen):
            size = max(top, 2 * len(self._seen), 64)
            self._z = np.concatenate([self._z, np.zeros(size - len(self._z))])
            self._y = np.concatenate([self._y, np.zeros(size - len(self._y))])
            self._seen = np.concatenate([self._seen, np.zeros(size - len(self._seen), dtype=bool)])
        new = ids[~self._seen[ids]]
        if len(new):
            new = np.unique(new)
            if self.icc > 0:
                self._z[new] = rng.standard_normal(len(new))
            if self.correlation is not None:
                self._y[new] = rng.standard_normal(len(new))  # stationary start of the AR(1)
            self._seen[new] = True

    def _per_request(self, spec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rho = np.zeros(len(spec))
        psi = np.zeros(len(spec))
        for n in np.unique(spec):
            if n > 0:
                _, r, p = self.params(int(n))
                rho[spec == n], psi[spec == n] = r, p
        return rho, psi

    def _accept(self, x: np.ndarray, spec: np.ndarray) -> np.ndarray:
        out = np.zeros(x.shape, dtype=np.int64)
        for n in np.unique(spec):
            if n > 0:
                cols = spec == n
                out[..., cols] = _count_below(self.params(int(n))[0], x[..., cols])
        return out

    def sample(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        ids, spec = _ids_spec(ids, num_spec)
        self._start(ids, rng)
        eps = rng.standard_normal(len(ids))
        rho, psi = self._per_request(spec)
        y = psi * self._y[ids] + np.sqrt(1.0 - psi**2) * eps if self.correlation is not None else eps
        if self.correlation is not None:
            self._y[ids] = y
        x = np.sqrt(rho) * self._z[ids] + np.sqrt(1.0 - rho) * y
        return self._accept(x, spec)

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int,
                     rng: np.random.Generator) -> np.ndarray:
        ids, spec = _ids_spec(ids, num_spec)
        self._start(ids, rng)
        eps = rng.standard_normal((int(num_steps), len(ids)))
        rho, psi = self._per_request(spec)
        if self.correlation is not None and num_steps > 0:
            y = np.empty_like(eps)
            prev = self._y[ids]
            scale = np.sqrt(1.0 - psi**2)
            for t in range(int(num_steps)):  # vectorised over requests; the AR(1) is sequential in t
                prev = psi * prev + scale * eps[t]
                y[t] = prev
            self._y[ids] = prev
        else:
            y = eps
        x = np.sqrt(rho) * self._z[ids] + np.sqrt(1.0 - rho) * y
        return self._accept(x, spec)


# --------------------------------------------------------------------------------------------------
# M3: trace replay
# --------------------------------------------------------------------------------------------------

class TraceAcceptance:
    """M3: replay recorded per-request acceptance (SpecDecode-Bench simulator style).

    A trace is a list ``acc_len[p]`` = tokens the request would emit (accepted drafts + bonus, >= 1) if a
    verification step started at its output position p with unlimited drafts. A step with n drafts emits
    min(acc_len[p], n + 1) tokens, so A = that - 1, and the request's position advances by A + 1 (tracked
    here: every ``sample`` call is one step of each listed request; a call with num_spec 0 emits 1 token).
    Positions past the end of a trace wrap around (p mod len). Request id i replays trace i mod (number of
    traces), in file order. No random numbers are used.

    File formats (one request per record, ``request_id`` is informational):
      CSV   header ``request_id,acc_len``; acc_len space-separated integers, e.g. ``7,3 1 2 5``
      JSONL ``{"request_id": 7, "acc_len": [3, 1, 2, 5]}`` (a space-separated string is accepted too)
    `survival(n)` is the average over every recorded position of every trace (equal weight).
    """

    supports_runs = False   # per-request positions in the traces

    def __init__(self, source: str | Path | Sequence[Sequence[int]]):
        if isinstance(source, (str, Path)):
            traces = _read_traces(Path(source))
            where = str(source)
        else:
            traces = [list(t) for t in source]
            where = "the given traces"
        if not traces:
            raise CapacityError(f"acceptance trace {where} has no requests; give at least one acc_len list")
        arrays = []
        for i, t in enumerate(traces):
            try:
                a = np.array([int(v) for v in t], dtype=np.int64)
            except (TypeError, ValueError):
                raise CapacityError(f"acceptance trace {where}: request {i} has a non-integer acc_len; give "
                                    "whole numbers >= 1") from None
            if len(a) == 0 or (a < 1).any():
                raise CapacityError(f"acceptance trace {where}: request {i} has an empty acc_len or a value < 1; "
                                    "every step emits at least 1 token")
            arrays.append(a)
        self.traces = arrays
        self._len = np.array([len(a) for a in arrays], dtype=np.int64)
        self._off = np.concatenate([[0], np.cumsum(self._len)[:-1]]).astype(np.int64)
        self._flat = np.concatenate(arrays)
        self._pos = np.zeros(0, dtype=np.int64)

    def survival(self, n: int) -> np.ndarray:
        return np.array([(self._flat >= j + 1).mean() for j in range(1, int(n) + 1)], dtype=float)

    def expected_tokens(self, n: int) -> float:
        return 1.0 + float(self.survival(n).sum())

    def positions(self, ids: np.ndarray) -> np.ndarray:
        """Output positions reached so far by these requests (tokens emitted in sampled steps)."""
        ids = np.asarray(ids, dtype=np.int64)
        self._grow(ids)
        return self._pos[ids].copy()

    def _grow(self, ids: np.ndarray) -> None:
        if len(ids) and int(ids.max()) >= len(self._pos):
            size = max(int(ids.max()) + 1, 2 * len(self._pos), 64)
            self._pos = np.concatenate([self._pos, np.zeros(size - len(self._pos), dtype=np.int64)])

    def _step(self, ids: np.ndarray, spec: np.ndarray) -> np.ndarray:
        tr = ids % len(self.traces)
        acc_len = self._flat[self._off[tr] + self._pos[ids] % self._len[tr]]
        emitted = np.minimum(acc_len, np.maximum(spec, 0) + 1)
        self._pos[ids] += emitted
        return emitted - 1

    def sample(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        ids, spec = _ids_spec(ids, num_spec)
        self._grow(ids)
        return self._step(ids, spec)

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int,
                     rng: np.random.Generator | None = None) -> np.ndarray:
        ids, spec = _ids_spec(ids, num_spec)
        self._grow(ids)
        out = np.zeros((int(num_steps), len(ids)), dtype=np.int64)
        for t in range(int(num_steps)):  # positions depend on the previous step; vectorised over requests
            out[t] = self._step(ids, spec)
        return out


def _read_traces(path: Path) -> list[list[int]]:
    if not path.is_file():
        raise CapacityError(f"acceptance trace file {path} not found; give the path of a CSV or JSONL trace")

    def parse(value: Any, where: str) -> list[int]:
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list):
            raise CapacityError(f"{where}: acc_len must be a list or a space-separated string of integers")
        try:
            return [int(v) for v in value]
        except (TypeError, ValueError):
            raise CapacityError(f"{where}: acc_len has a non-integer value; give whole numbers >= 1") from None

    traces: list[list[int]] = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for i, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise CapacityError(f"{path} line {i} is not JSON; write one {{\"request_id\", \"acc_len\"}} "
                                    "object per line") from None
            if not isinstance(rec, dict) or "acc_len" not in rec:
                raise CapacityError(f"{path} line {i} has no acc_len; write {{\"request_id\": 0, \"acc_len\": [..]}}")
            traces.append(parse(rec["acc_len"], f"{path} line {i}"))
    else:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or "acc_len" not in reader.fieldnames:
                raise CapacityError(f"{path} needs a header with an acc_len column (request_id,acc_len)")
            for i, row in enumerate(reader, start=2):
                traces.append(parse(row["acc_len"] or "", f"{path} line {i}"))
    return traces


# --------------------------------------------------------------------------------------------------
# Rates and profiles
# --------------------------------------------------------------------------------------------------

def validate_rates(rates: Sequence[float] | np.ndarray, basis: str = "conditional") -> np.ndarray:
    """Conditional rates a_1..a_K from `rates` given as conditional a_j or marginal S_j (`basis`)."""
    if basis not in ("conditional", "marginal"):
        raise CapacityError(f"acceptance basis {basis!r} is unknown; use basis: conditional or basis: marginal")
    if isinstance(rates, (str, bytes)) or not isinstance(rates, (Sequence, np.ndarray)) or len(rates) == 0:
        raise CapacityError("acceptance rates must be a non-empty list of probabilities, e.g. rates: [0.8, 0.7]")
    r = np.array([_number(x, "acceptance rate") for x in rates], dtype=float)
    bad = np.flatnonzero((r < 0) | (r > 1))
    if len(bad):
        j = int(bad[0])
        raise CapacityError(f"acceptance rate {r[j]:g} at position {j + 1} is outside [0, 1]; "
                            "give probabilities between 0 and 1")
    if basis == "conditional":
        return r
    up = np.flatnonzero(np.diff(r) > 1e-12)
    if len(up):
        j = int(up[0]) + 2
        raise CapacityError(f"marginal acceptance must not increase: S_{j}={r[j - 1]:g} > S_{j - 1}={r[j - 2]:g}; "
                            "fix the list or use basis: conditional")
    prev = np.concatenate([[1.0], r[:-1]])
    return np.divide(r, prev, out=np.zeros_like(r), where=prev > 0)


@lru_cache(maxsize=1)
def _profiles() -> dict:
    path = data_dir() / _PROFILE_FILE
    with path.open() as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_profiles() -> dict:
    """The acceptance-profile data (``capacity/data/acceptance_profiles.yaml``), a fresh copy."""
    return copy.deepcopy(_profiles())


def _method_key(method: str) -> str:
    return canonical_name(method)


def _workload(workload: str | None) -> str:
    if workload is None:
        return "chat"
    w = _WORKLOAD_ALIASES.get(str(workload).strip().lower())
    if w is None:
        raise CapacityError(f"unknown acceptance dataset {workload!r}; use one of "
                            f"{', '.join(DATASETS + WORKLOAD_TYPES)}")
    return w


def _tau(rates: np.ndarray, n: int) -> float:
    return 1.0 + float(np.cumprod(np.asarray(rates, dtype=float)[:n]).sum())


class _Source:
    """A profile: pooled chain + by-N rates, with a provenance description."""

    description: str
    decay: float

    def pooled(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def at(self, n: int) -> tuple[np.ndarray, str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def pooled_extended(self, n: int) -> np.ndarray:
        return _extend(self.pooled(), n, self.decay)


class _Measured(_Source):
    def __init__(self, method: str, target: str, dataset: str, entry: dict, decay: float):
        self.description = f"seed profile {method} on {target}, {dataset}"
        self.decay = decay
        self._rates = np.array(entry["rates"], dtype=float)
        self._rows = {int(n): np.array(a, dtype=float) for n, a in entry["by_n"].items()}

    def pooled(self) -> np.ndarray:
        return self._rates.copy()

    def at(self, n: int) -> tuple[np.ndarray, str]:
        rows, ns = self._rows, sorted(self._rows)
        if n in rows:
            return rows[n][:n].copy(), f"measured N={n} row"
        if n < ns[0]:
            return rows[ns[0]][:n].copy(), f"first {n} rates of the measured N={ns[0]} row"
        if n > ns[-1]:
            return (_extend(rows[ns[-1]], n, self.decay),
                    f"measured N={ns[-1]} row extended with decay {self.decay:g} per position")
        lo = max(k for k in ns if k < n)
        hi = min(k for k in ns if k > n)
        w = (n - lo) / (hi - lo)
        rates = (1 - w) * _extend(rows[lo], n, self.decay) + w * rows[hi][:n]
        return rates, f"interpolated between the measured N={lo} and N={hi} rows"


class _Mean(_Source):
    def __init__(self, parts: list[_Source], description: str):
        self.parts = parts
        self.description = description
        self.decay = float(np.mean([p.decay for p in parts]))

    def pooled(self) -> np.ndarray:
        k = max(len(p.pooled()) for p in self.parts)
        return np.mean([p.pooled_extended(k) for p in self.parts], axis=0)

    def at(self, n: int) -> tuple[np.ndarray, str]:
        got = [p.at(n) for p in self.parts]
        notes = list(dict.fromkeys(note for _, note in got))
        return np.mean([r for r, _ in got], axis=0), "each part: " + " / ".join(notes)


class _Scaled(_Source):
    def __init__(self, part: _Source, factor: float, description: str):
        self.part, self.factor, self.description, self.decay = part, factor, description, part.decay

    def pooled(self) -> np.ndarray:
        return self.part.pooled() * self.factor

    def at(self, n: int) -> tuple[np.ndarray, str]:
        rates, note = self.part.at(n)
        return rates * self.factor, note


class _Literature(_Source):
    def __init__(self, rates: list[float], decay: float, description: str):
        self._rates, self.decay, self.description = np.array(rates, dtype=float), decay, description

    def pooled(self) -> np.ndarray:
        return self._rates.copy()

    def at(self, n: int) -> tuple[np.ndarray, str]:
        k = len(self._rates)
        return _extend(self._rates, n, self.decay), ("literature chain" if n <= k else
                                                     f"literature chain extended past {k} with decay {self.decay:g}")


def _chat_factor(m: dict, key: str, hf_id: str | None) -> float:
    """The stored chat factor c of method entry `m` for target `hf_id` (None: the mean over the measured
    targets): E[tau] with 7 drafts of c * the math rates = ``chat_tau_ratio`` x that of the math rates
    (`chat_base_rates`). Solved by scripts/fit_acceptance_profiles.py (brentq) and stored in the YAML, so
    that no simulation imports scipy for it."""
    table = m.get("chat_factor")
    c = None if table is None else (table["mean_of_targets"] if hf_id is None else table["by_target"].get(hf_id))
    if c is None:  # pragma: no cover - the script writes every measured target
        raise CapacityError(f"no stored chat factor for {key} on {hf_id or 'the mean of the targets'}; "
                            "regenerate acceptance_profiles.yaml with scripts/fit_acceptance_profiles.py")
    return float(c)


def _match_target(entry: dict, target: str | None) -> str | None:
    if target is None:
        return None
    t = str(target).strip().lower()
    for hf_id in entry:
        if hf_id.lower() == t or hf_id.split("/")[-1].lower() == t.split("/")[-1]:
            return hf_id
    return None


def _base_source(prof: dict, key: str, target: str | None, w: str) -> tuple[_Source, str | None]:
    """The measured-method profile of workload `w` (chat: its math base) and the matched target id (None:
    the mean over the measured targets)."""
    m = prof["methods"][key]
    targets: dict = m["targets"]
    decay = float(m["decay"]["value"])

    def measured(hf_id: str, dataset: str) -> _Source:
        return _Measured(key, hf_id, dataset, targets[hf_id][dataset], decay)

    def typed(hf_id: str, t: str) -> _Source:
        ds = [d for d in DATASETS if prof["workload_types"][d] == t and d in targets[hf_id]]
        return _Mean([measured(hf_id, d) for d in ds], f"{key} on {hf_id}, {t} = mean of {' and '.join(ds)}")

    def for_target(hf_id: str, w: str) -> _Source:
        if w in DATASETS and w in targets[hf_id]:
            return measured(hf_id, w)
        return typed(hf_id, prof["workload_types"].get(w, w))

    base_w = "math" if w == "chat" else w
    hf = _match_target(targets, target)
    if hf is not None:
        return for_target(hf, base_w), hf
    names = sorted(targets)
    parts = [for_target(t, base_w) for t in names]
    why = "no target given" if target is None else f"{target} not measured for {key}"
    return _Mean(parts, f"{key} {base_w}: arithmetic mean over the measured targets {', '.join(names)} ({why})"), None


def chat_base_rates(prof: dict, method: str, target: str | None) -> np.ndarray:
    """The rates the chat factor scales: the math profile's pooled chain of `method` on `target` (None or
    unmeasured: the mean over the measured targets), extended to 7 drafts, from the profile data `prof`
    (scripts/fit_acceptance_profiles.py solves the factor on these)."""
    src, _ = _base_source(prof, _method_key(method), target, "chat")
    return src.pooled_extended(_CHAT_MATCH_DRAFTS)


def _profile_source(method: str, target: str | None, workload: str) -> _Source:
    key = _method_key(method)
    prof = _profiles()
    m = prof["methods"].get(key)
    if m is None:  # pragma: no cover - the YAML covers every method
        raise CapacityError(f"no acceptance profile for method {key}; regenerate acceptance_profiles.yaml")
    w = _workload(workload)
    wtype = prof["workload_types"].get(w, w)
    decay = float(m["decay"]["value"])

    if "literature" in m:
        lit = m["literature"].get(wtype) or m["literature"].get("all")
        return _Literature(lit["rates"], decay, f"literature fallback for {key} ({wtype}; no seed measurement): "
                                                f"{lit['source']}; {lit['basis']}")

    src, hf = _base_source(prof, key, target, w)
    if w != "chat":
        return src
    chat = m["chat_tau_ratio"]
    c = _chat_factor(m, key, hf)
    return _Scaled(src, c, f"chat derived from [{src.description}]: every rate x {c:.4f} so that E[tau] with 7 drafts "
                           f"is {chat['value']} x math (assumed; ratio from {chat['source']})")


def profile_rates(method: str, target: str | None, workload: str,
                  num_spec: int | None = None) -> tuple[np.ndarray, str]:
    """Conditional rates and a provenance string.

    Without `num_spec`: the pooled chain a_1..a_K (K = the longest measured N). With `num_spec` = n: the
    n rates the by-N rule gives for n drafts (see the module docstring).
    """
    src = _profile_source(method, target, workload)
    if num_spec is None:
        return src.pooled(), f"{src.description}; pooled chain (per position, mean over the rows with N >= j)"
    n = int(num_spec)
    if n < 0:
        raise CapacityError(f"num_speculative_tokens {n} must be >= 0")
    rates, note = src.at(n)
    return rates, f"{src.description}; {note}"


class ProfileAcceptance(_Stateless):
    """M1 from a profile: by default the rates depend on N (the row measured with the requested N,
    `profile_rates(..., num_spec=n)`); with ``by_n=False`` one pooled chain for every N. `factor`
    multiplies every conditional rate (temperature / draft sampling)."""

    def __init__(self, method: str, target: str | None, workload: str | None, *, by_n: bool = True,
                 factor: float = 1.0):
        super().__init__()
        self.method = _method_key(method)
        self.workload = _workload(workload)
        self._src = _profile_source(self.method, target, self.workload)
        self.by_n = bool(by_n)
        self.factor = float(factor)
        self.provenance = self._src.description + (
            "; by-N rates" if self.by_n else "; pooled chain") + (
            f"; rates x {self.factor:.4g} (temperature / draft sampling)" if self.factor != 1.0 else "")

    def rates(self, n: int) -> np.ndarray:
        """Conditional rates a_1..a_n used with n drafts."""
        r = self._src.at(n)[0] if self.by_n else self._src.pooled_extended(n)
        return np.clip(r * self.factor, 0.0, 1.0)

    def _survival(self, n: int) -> np.ndarray:
        return np.cumprod(self.rates(n))


# --------------------------------------------------------------------------------------------------
# From a scenario's `speculative.acceptance` mapping
# --------------------------------------------------------------------------------------------------

_COMMON_KEYS = ("model", "temperature", "draft_sampling", "rate_scale")
_MODEL_KEYS: dict[str, tuple[str, ...]] = {
    "iid": ("alpha",),
    "chain": ("rates", "basis", "decay"),
    "profile": ("dataset", "target", "by_n"),
    "heterogeneous": ("base", "concentration", "correlation"),
    "histogram": ("probs",),
    "trace": ("path",),
}


def rate_factor(method: str, temperature: float = 0.0, draft_sampling: str = "argmax") -> float:
    """Multiplier on every conditional rate for a sampling temperature and draft-sampling mode."""
    key = _method_key(method)
    t = _number(temperature, "temperature")
    if t < 0:
        raise CapacityError(f"temperature {t:g} must be >= 0")
    if draft_sampling not in ("argmax", "probabilistic"):
        raise CapacityError(f"draft_sampling {draft_sampling!r} is unknown; use argmax or probabilistic")
    prof = _profiles()
    f = max(0.0, 1.0 - float(prof["temperature"]["beta"]) * t)
    if draft_sampling == "probabilistic" and t > 0:
        table = prof["probabilistic_draft_factor"]
        f *= float((table.get(key) or table["default"])["value"])
    return f


def acceptance_from_config(cfg: Mapping[str, Any] | None, *, method: str, target: str | None,
                           dataset: str | None = None, temperature: float = 0.0,
                           draft_sampling: str = "argmax", rate_scale: float = 1.0) -> AcceptanceModel:
    """Build the acceptance model a scenario's ``speculative.acceptance`` mapping describes.

    Forms: ``{model: iid, alpha}``, ``{model: chain, rates, basis: conditional|marginal, decay}``,
    ``{model: profile, dataset, target, by_n}`` (the default when `cfg` is None, with `dataset` or
    "chat"), ``{model: heterogeneous, base: {...}, concentration, correlation}``,
    ``{model: histogram, probs}``, ``{model: trace, path}``; each may add ``temperature`` and
    ``draft_sampling`` (which override the arguments), and ``rate_scale``, a what-if multiplier on every
    conditional rate ("acceptance drops by 20 %": 0.8; rates stay within [0, 1]; not applied to traces).
    A mapping without ``model`` is a profile (e.g. ``{dataset: gsm8k}``). Rates are T = 0 values (see
    module docstring).
    """
    key = _method_key(method)
    if cfg is None:
        cfg = {"model": "profile"}
    if not isinstance(cfg, Mapping):
        raise CapacityError("speculative.acceptance must be a mapping such as {model: profile, dataset: chat}")
    model = cfg.get("model", "profile")
    if model not in _MODEL_KEYS:
        raise CapacityError(f"unknown acceptance model {model!r}; use one of {', '.join(MODELS)}")
    allowed = _COMMON_KEYS + _MODEL_KEYS[model]
    extra = [k for k in cfg if k not in allowed]
    if extra:
        raise CapacityError(f"unknown key {extra[0]!r} in speculative.acceptance (model {model}); "
                            f"allowed: {', '.join(allowed)}")
    t = cfg.get("temperature", temperature)
    ds = cfg.get("draft_sampling", draft_sampling)
    scale = _number(cfg.get("rate_scale", rate_scale), "rate_scale")
    if not scale >= 0:
        raise CapacityError(f"speculative.acceptance.rate_scale is {scale:g}; use a multiplier >= 0 "
                            "(e.g. 0.8 for acceptance 20 % lower)")
    factor = rate_factor(key, t, ds) * scale

    def need(name: str) -> Any:
        if name not in cfg:
            raise CapacityError(f"acceptance model {model} needs `{name}`")
        return cfg[name]

    if model == "iid":
        alpha = IIDAcceptance(need("alpha")).alpha
        return IIDAcceptance(min(alpha * factor, 1.0))
    if model == "chain":
        rates = validate_rates(need("rates"), cfg.get("basis", "conditional"))
        decay = cfg.get("decay", _profiles()["methods"][key]["decay"]["value"])
        return ChainAcceptance(np.minimum(rates * factor, 1.0), decay=decay)
    if model == "profile":
        by_n = cfg.get("by_n", True)
        if not isinstance(by_n, bool):
            raise CapacityError(f"acceptance by_n must be true or false, got {by_n!r}")
        return ProfileAcceptance(key, cfg.get("target", target), cfg.get("dataset", dataset), by_n=by_n,
                                 factor=factor)
    if model == "histogram":
        return HistogramAcceptance(need("probs")).scaled(factor)
    if model == "trace":
        return TraceAcceptance(need("path"))
    base_cfg = need("base")
    if not isinstance(base_cfg, Mapping) or base_cfg.get("model") in ("heterogeneous", "trace"):
        raise CapacityError("heterogeneous acceptance needs `base: {model: iid|chain|profile|histogram, ...}`")
    base = acceptance_from_config(base_cfg, method=key, target=target, dataset=dataset, temperature=t,
                                  draft_sampling=ds, rate_scale=scale)
    return HeterogeneousAcceptance(base, cfg.get("concentration"), cfg.get("correlation"))


__all__ = [
    "AcceptanceModel", "IIDAcceptance", "iid_alpha_for_length", "ChainAcceptance", "ProfileAcceptance", "HeterogeneousAcceptance",
    "HistogramAcceptance", "TraceAcceptance", "acceptance_from_config", "load_profiles", "profile_rates",
    "validate_rates", "rate_factor", "chat_base_rates", "DATASETS", "WORKLOAD_TYPES", "MODELS",
]
