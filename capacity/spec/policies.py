"""Speculation policies: how many tokens to draft this step, given the load.

Each policy answers `num_spec_tokens(batch_size, mean_context) -> int`:

* `static` — always N (vLLM's `num_speculative_tokens`).
* `off_above` — N while at most `max_batch_size` requests run, 0 above ("use N = 3 up to 40
  concurrent users, off above"); vLLM's batch-size schedule `num_speculative_tokens_per_batch_size`
  (vllm/config/speculative.py) expresses the same thing as (start, end, N) ranges.
* `goodput` — the N in 0..N_max that maximises expected generated tokens per second of the step,
  G(N) = E[τ(N)]·B / (T_target(B, N) + T_draft(B, N)), with E[τ(N)] = 1 + Σ_{j≤N} P(A ≥ j) from the
  acceptance model and both times from the roofline at the current batch and mean context
  (SmartSpec/TurboSpec goodput, modelling_notes §2.4 [S31][S32]). The choice is cached per
  (batch bucket, context bucket): batches up to `exact_batch_below` are exact, larger ones and
  contexts fall into geometric buckets of ratio `batch_bucket_ratio` / `context_bucket_ratio`
  (assumed defaults, overridable; 1 = no bucketing) and are priced at the bucket's geometric middle.

`policy_from_config(cfg, N, ...)` builds one from a scenario's `speculative.policy` mapping:
{kind: static} (default), {kind: off_above, max_batch_size: 40}, {kind: goodput, max_n: 7}.
`break_even` says up to which batch size a given N pays (what `capacity plan` prints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from capacity.cost.interface import StepCost
from capacity.cost.step_cost import StepFeatures
from capacity.errors import CapacityError

POLICY_KINDS = ("static", "off_above", "goodput")

# Bucketing of the goodput policy's cache (assumed: fine enough that the argmax rarely differs from
# the exact one, coarse enough that a run prices only a few hundred buckets).
DEFAULT_BATCH_BUCKET_RATIO = 1.125
DEFAULT_CONTEXT_BUCKET_RATIO = 1.25
DEFAULT_EXACT_BATCH_BELOW = 16


class SpeculationPolicy(Protocol):
    max_num_spec_tokens: int

    def num_spec_tokens(self, batch_size: int, mean_context: float) -> int:
        """Draft tokens per decoding request for a step with this many running requests."""


class _Acceptance(Protocol):
    def expected_tokens(self, n: int) -> float:
        """E[τ] = 1 + Σ_{j≤n} P(A ≥ j): tokens emitted per verification step with n drafts."""


@dataclass(frozen=True)
class StaticPolicy:
    """Always the configured N."""

    num_speculative_tokens: int

    @property
    def max_num_spec_tokens(self) -> int:
        return self.num_speculative_tokens

    def num_spec_tokens(self, batch_size: int, mean_context: float = 0.0) -> int:
        return self.num_speculative_tokens

    def describe(self) -> str:
        return f"static N={self.num_speculative_tokens}"


@dataclass(frozen=True)
class OffAbovePolicy:
    """N up to `max_batch_size` running requests, 0 above."""

    num_speculative_tokens: int
    max_batch_size: int

    @property
    def max_num_spec_tokens(self) -> int:
        return self.num_speculative_tokens

    def num_spec_tokens(self, batch_size: int, mean_context: float = 0.0) -> int:
        return self.num_speculative_tokens if batch_size <= self.max_batch_size else 0

    def describe(self) -> str:
        return f"N={self.num_speculative_tokens} up to {self.max_batch_size} running requests, off above"


def _bucket(x: float, ratio: float) -> tuple[int, float]:
    """(bucket index, representative value) of x > 0 on a geometric grid of `ratio`."""
    k = math.floor(math.log(x) / math.log(ratio) + 1e-12)
    return k, ratio ** (k + 0.5)


class GoodputPolicy:
    """The N in 0..max_n maximising E[τ(N)]·B / step_time(B, mean_context, N) (ties: smaller N)."""

    def __init__(self, max_n: int, expected_tokens: Callable[[int], float],
                 step_time_s: Callable[[int, float, int], float], *,
                 batch_bucket_ratio: float = DEFAULT_BATCH_BUCKET_RATIO,
                 context_bucket_ratio: float = DEFAULT_CONTEXT_BUCKET_RATIO,
                 exact_batch_below: int = DEFAULT_EXACT_BATCH_BELOW):
        if max_n < 0:
            raise CapacityError(f"goodput policy max_n is {max_n}; use a number >= 0")
        for key, r in (("batch_bucket_ratio", batch_bucket_ratio), ("context_bucket_ratio", context_bucket_ratio)):
            if not r >= 1.0:
                raise CapacityError(f"goodput policy {key} is {r}; use a ratio >= 1 (1 = exact)")
        self.max_n = int(max_n)
        self.expected_tokens = expected_tokens
        self.step_time_s = step_time_s
        self.batch_bucket_ratio = float(batch_bucket_ratio)
        self.context_bucket_ratio = float(context_bucket_ratio)
        self.exact_batch_below = int(exact_batch_below)
        self._tau = [1.0] + [float(expected_tokens(n)) for n in range(1, self.max_n + 1)]
        self._cache: dict[tuple[int, int], int] = {}

    @property
    def max_num_spec_tokens(self) -> int:
        return self.max_n

    def _batch_key(self, b: int) -> tuple[int, int]:
        if b <= self.exact_batch_below or self.batch_bucket_ratio == 1.0:
            return b, b
        k, rep = _bucket(float(b), self.batch_bucket_ratio)
        return self.exact_batch_below + 1 + k, max(int(round(rep)), 1)

    def _context_key(self, c: float) -> tuple[int, float]:
        if c <= 1.0:
            return -1, max(c, 0.0)
        if self.context_bucket_ratio == 1.0:
            return int(round(c)), float(round(c))
        return _bucket(c, self.context_bucket_ratio)

    def goodput(self, batch_size: int, mean_context: float, n: int) -> float:
        """Expected generated tokens per second of a decode step with n drafts per request."""
        return self._tau[n] * batch_size / self.step_time_s(batch_size, mean_context, n)

    def best(self, batch_size: int, mean_context: float) -> int:
        """The argmax over 0..max_n at exactly this batch and context (no cache)."""
        if batch_size <= 0 or self.max_n == 0:
            return 0
        g = [self.goodput(batch_size, mean_context, n) for n in range(self.max_n + 1)]
        return int(np.argmax(g))                      # first maximum: the smaller N on ties

    def num_spec_tokens(self, batch_size: int, mean_context: float = 0.0) -> int:
        if batch_size <= 0:
            return 0
        bk, b_rep = self._batch_key(int(batch_size))
        ck, c_rep = self._context_key(float(mean_context))
        key = (bk, ck)
        n = self._cache.get(key)
        if n is None:
            n = self._cache[key] = self.best(b_rep, c_rep)
        return n

    def describe(self) -> str:
        return f"goodput-optimal N in 0..{self.max_n} per (batch, context) bucket"


def decode_step_time(target_cost: StepCost, draft_cost: Any | None) -> Callable[[int, float, int], float]:
    """Time of a decode step of B requests at mean context c verifying n drafts each: the target
    forward over B·(n + 1) tokens (context c + n + 1 at its end) with overheads, plus the drafter
    (`draft_cost.time_s`, any object with that method) for the same step. B may be an array of batch
    sizes (one time each, priced in one vectorised call)."""
    model = target_cost.model

    def step(batch: int | np.ndarray, context: float, n: int) -> float | np.ndarray:
        q = n + 1
        c = max(float(context), 0.0) + q
        b = np.asarray(batch, dtype=float) if isinstance(batch, np.ndarray) else float(batch)
        f = StepFeatures(num_tokens=b * q, num_seqs=b, num_sampled=b * q,
                         attn_flops=b * float(model.attention_flops(q, c)),
                         kv_read_bytes=b * float(model.kv_read_bytes(c)),
                         verify_seqs=b if n > 0 else 0.0 * b)
        t = sum(np.asarray(v, dtype=float) for v in target_cost.time_parts(f).values())
        if draft_cost is not None and n > 0:
            t = t + np.asarray(draft_cost.time_s(b, b * q, b * c, n), dtype=float)
        return float(t) if np.ndim(t) == 0 else t

    return step


_KEYS = {
    "static": {"kind"},
    "off_above": {"kind", "max_batch_size"},
    "goodput": {"kind", "max_n", "batch_bucket_ratio", "context_bucket_ratio", "exact_batch_below"},
}


def policy_from_config(cfg: Mapping[str, Any] | None, N: int, *, target_cost: StepCost | None = None,
                       draft_cost: Any | None = None, acceptance: _Acceptance | None = None,
                       step_time_s: Callable[[int, float, int], float] | None = None) -> SpeculationPolicy:
    """A policy from `speculative.policy` (None = static). goodput needs the acceptance model and
    either `step_time_s(batch, mean_context, n)` or `target_cost` (+ `draft_cost`)."""
    cfg = dict(cfg or {})
    kind = str(cfg.get("kind", "static")).strip().lower()
    if kind not in POLICY_KINDS:
        raise CapacityError(f"unknown speculation policy kind '{cfg.get('kind')}'; use one of: {', '.join(POLICY_KINDS)}")
    extra = set(cfg) - _KEYS[kind]
    if extra:
        raise CapacityError(f"speculative.policy ({kind}) has unknown key(s) {', '.join(sorted(extra))}; "
                            f"allowed: {', '.join(sorted(_KEYS[kind]))}")
    N = int(N)
    if N < 0:
        raise CapacityError(f"num_speculative_tokens is {N}; use 0 (off) or a positive number")
    if kind == "static":
        return StaticPolicy(N)
    if kind == "off_above":
        limit = cfg.get("max_batch_size")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise CapacityError("speculative.policy off_above needs max_batch_size: a whole number >= 0, "
                                "e.g. {kind: off_above, max_batch_size: 40}")
        return OffAbovePolicy(N, limit)
    max_n = cfg.get("max_n", N)
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 0:
        raise CapacityError(f"speculative.policy goodput max_n must be a whole number >= 0, got {max_n!r}")
    if acceptance is None:
        raise CapacityError("the goodput policy needs an acceptance model; set speculative.acceptance")
    if step_time_s is None:
        if target_cost is None:
            raise CapacityError("the goodput policy needs the target's step cost model to price steps")
        step_time_s = decode_step_time(target_cost, draft_cost)
    options = {k: cfg[k] for k in ("batch_bucket_ratio", "context_bucket_ratio", "exact_batch_below") if k in cfg}
    for k, v in options.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CapacityError(f"speculative.policy goodput {k} must be a number, got {v!r}")
    return GoodputPolicy(max_n, acceptance.expected_tokens, step_time_s, **options)


def break_even(step_time_s: Callable[[Any, float, int], Any], expected_tokens: Callable[[int], float],
               n: int, mean_context: float, max_batch: int, at_batch: int | None = None) -> dict[str, Any]:
    """Up to which batch size drafting `n` tokens per request pays, at one mean context.

    The expected speedup of one decode step of B requests is S(B) = τ(n) · T(B, 0) / T(B, n): τ(n)
    tokens per request from the acceptance model against the plain step's one, over the step times
    (`step_time_s(batch, mean_context, n)`, e.g. `decode_step_time`, called with an array of every
    batch size 1..max_batch at once). Speculation pays while S ≥ 1.
    Returns the largest B in 1..max_batch with S(B) ≥ 1 (`pays_up_to`; 0: not even at one request;
    max_batch: at every batch the engine allows), S at one request and at `at_batch`, and the
    goodput-best N in 0..n at `at_batch` (`policy`: the off_above policy that keeps those gains), and
    S on a geometric grid of batch sizes (`curve`). A decode-only view: prefill chunks sharing the step
    are left out."""
    n, max_batch = int(n), max(int(max_batch), 1)
    tau = [1.0] + [float(expected_tokens(k)) for k in range(1, n + 1)]

    def speedup(b, k: int = n):
        return tau[k] * np.asarray(step_time_s(b, mean_context, 0), dtype=float) \
            / np.asarray(step_time_s(b, mean_context, k), dtype=float)

    batches = np.arange(1, max_batch + 1)
    s_all = np.broadcast_to(speedup(batches), batches.shape)          # S(B) for every B, one call
    paying = np.flatnonzero(s_all >= 1.0)
    # the largest batch that pays; S(B) falls with B in practice, so this is the crossing
    limit = int(batches[paying[-1]]) if paying.size else 0
    out: dict[str, Any] = {"num_speculative_tokens": n, "mean_context_tokens": float(mean_context),
                           "max_batch": max_batch, "pays_up_to": limit, "speedup_at_1": float(s_all[0])}
    if at_batch is not None and at_batch >= 1:
        b = int(round(at_batch))
        out["at_batch"] = b
        out["speedup_at_batch"] = float(s_all[b - 1]) if b <= max_batch else float(speedup(b))
        goodput = [tau[k] / float(step_time_s(b, mean_context, k)) for k in range(n + 1)]
        out["best_n_at_batch"] = int(np.argmax(goodput))
    out["policy"] = ({"kind": "static"} if limit >= max_batch else {"kind": "off_above", "max_batch_size": limit})
    grid = sorted(set(np.round(np.geomspace(1, max_batch, 48)).astype(int).tolist()) | {limit, max_batch} - {0})
    out["curve"] = {"batch": grid, "speedup": [float(s_all[g - 1]) for g in grid]}   # the speedup-by-load figure
    return out
