"""Traffic: request classes, length distributions, arrival processes and trace replay.

`build_requests(cfg, rng)` turns a validated `TrafficConfig` into a `RequestStream` (a struct of
arrays: arrival time, prompt tokens, output tokens, class) that the engine replays.

Arrival processes follow `vllm bench serve`, so a simulated run can be compared like for like
with a benchmark run:

* `poisson` / `gamma` (open loop). vLLM's `get_request` (repo `vllm-project/vllm`, path
  `vllm/benchmarks/serve.py`, read at commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1) draws each
  inter-arrival gap as `np.random.gamma(shape=burstiness, scale=1/(request_rate*burstiness))`
  (burstiness 1 = exponential gaps = Poisson; burstiness = inf gives the constant gap
  `1/request_rate`; request_rate = inf gives delay 0 for every request, i.e. all are sent at
  t = 0). The gaps are summed, *starting with the first gap*, so the first request is sent after
  one gap, not at 0. Then, when no ramp-up is set and the last cumulative delay is non-zero, every
  cumulative delay is multiplied by `normalize_factor = (N/request_rate) / delay_ts[-1]` so the
  last request lands exactly at `N/request_rate` ("If we simply accumulate the random delta values
  from the gamma distribution, their sum would have 1-2% gap from target_total_delay_s ... close
  the gap for stabilizing the throughput data from different random seeds"). Here the rescale is
  on by default (`vllm_rescale: true`) and applies only when `num_requests` fixes N; scaling does
  not change the coefficient of variation of the gaps (still 1/sqrt(burstiness)).
* `closed_loop` is `vllm bench serve --max-concurrency C` with the default `--request-rate inf`:
  all N requests are released at t = 0 and an `asyncio.Semaphore(C)` lets C be in flight, so a
  new request is sent as soon as one finishes (same file, `benchmark()`: `semaphore =
  asyncio.Semaphore(max_concurrency)`). Arrival times are left NaN; the engine stamps them at
  dispatch. (vLLM also allows a finite rate *and* a concurrency cap together; that combination is
  not modelled here.)
* `trace` replays a request log: arrival, input and output tokens from the file. A Mooncake
  JSONL trace (`hash_ids` per request) also gives each request's prefix-block identities
  (`TraceBlockKeys`).
* `sessions` is multi-turn chat: conversations start as a gamma/Poisson process (the gaps drawn
  as above, without vLLM's rescale), and each turn after the first is sent `think_s` seconds
  after the previous turn's last output token, so its arrival time is left NaN for the engine to
  stamp. Turn k's prompt is the class's system prompt, every earlier user message and answer,
  and the new user message; its blocks carry identities (`SessionKeys`) that the next turn's
  prompt repeats, as vLLM's prefix cache sees them.

Prefix-block identities (`PrefixKeys.block_keys(request, block_size)`): one non-negative int per
leading full block of `block_size` tokens of a request's token sequence that has an identity;
equal keys mean the same tokens from the start of the sequence to the end of that block, as
vLLM's chained block hashes (repo `vllm-project/vllm`, `vllm/v1/core/kv_cache_utils.py`,
`hash_block_tokens`: a block's hash covers its parent block's hash and its own tokens). Blocks past
the returned list are unique to the request.

Length distributions: `range_ratio` is vLLM's `--random-range-ratio`. In the current
`RandomDataset.get_sampling_params` (repo `vllm-project/vllm`, path
`vllm/benchmarks/datasets/random.py`, commit 237145ea190a901f93c570f157091fe43835bc63; identical
lines in the older single-file `vllm/benchmarks/datasets.py`) the bounds are
`low = floor(L*(1-r))`, `high = ceil(L*(1+r))` ("Bounds use floor for low and ceil for high"),
the output low is raised to at least 1, `r` must be in [0, 1), and lengths are drawn with
`rng.integers(low, high + 1)`, i.e. integers uniform on the closed range [low, high]. vLLM first
subtracts the tokenizer's special-token count from the *input* length (`real_input_len =
input_len - num_special_tokens_to_add()`); there is no tokenizer here, so `mean` is taken as the
token count the engine sees (set it to `input_len - num_special` to copy a vLLM run exactly).

All randomness comes from the `numpy.random.Generator` passed in: the same generator state gives
the same arrays. Three child generators are spawned from it (arrivals, class mix, lengths), so
adding a request class does not change the arrival times of a given seed. Sessions spawn five
(session starts, class mix, turns, lengths, think times).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, Sequence, Union, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.util.text import quote

if TYPE_CHECKING:
    import pandas as pd

# pandas (~0.3 s to import) is imported inside the functions that read a trace file or build a
# DataFrame, not here: validating a scenario and drawing synthetic traffic do not need it.

__all__ = [
    "FixedLength",
    "UniformLength",
    "RangeRatioLength",
    "LognormalLength",
    "EmpiricalLength",
    "LengthDist",
    "FixedSeconds",
    "ExponentialSeconds",
    "LognormalSeconds",
    "SecondsDist",
    "RequestClass",
    "PoissonArrivals",
    "GammaArrivals",
    "ClosedLoop",
    "TraceArrivals",
    "RateProfile",
    "SessionArrivals",
    "Arrival",
    "TrafficConfig",
    "PrefixKeys",
    "SessionKeys",
    "TraceBlockKeys",
    "RequestStream",
    "build_requests",
    "expected_requests_per_session",
    "mean_length",
    "sample_seconds",
    "read_trace",
    "resolve_trace",
    "shipped_traces",
    "sample_lengths",
    "range_ratio_bounds",
]

# assumed: a guard against a typo such as duration_s: 1e9 filling memory (~40 bytes a request).
MAX_REQUESTS = 50_000_000
MAX_TRACE_TOKENS = 10**9   # a token count above this in a trace is a broken row (and would overflow int64 arithmetic)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Length distributions
# --------------------------------------------------------------------------------------------


class FixedLength(_Strict):
    """Every request has exactly `value` tokens."""

    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="tokens")


class UniformLength(_Strict):
    """Integers uniform on the closed range [low, high]."""

    dist: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, description="tokens, inclusive")
    high: int = Field(ge=1, description="tokens, inclusive; >= low")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise ValueError(f"uniform length needs high >= low, got low={self.low}, high={self.high}")
        return self


class RangeRatioLength(_Strict):
    """`vllm bench serve --random-input-len/--random-output-len L --random-range-ratio r`.

    Integers uniform on [max(1, floor(L*(1-r))), max(1, ceil(L*(1+r)))], computed in float64 as
    vLLM does (so L=100, r=0.1 gives [90, 111]: 100*1.1 is 110.00000000000001 in binary floating
    point, and vLLM's ceil gives 111). vLLM raises the output lower bound to 1; here the same floor
    of 1 applies to input lengths too (vLLM would refuse such an input length instead).
    """

    dist: Literal["range_ratio"] = "range_ratio"
    mean: int = Field(ge=1, description="tokens (vLLM's --random-input-len / --random-output-len)")
    range_ratio: float = Field(ge=0.0, lt=1.0, description="vLLM --random-range-ratio, in [0, 1)")


class LognormalLength(_Strict):
    """exp(Normal(ln median, sigma)), rounded to the nearest integer, clipped to [min, max]."""

    dist: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, allow_inf_nan=False, description="tokens")
    sigma: float = Field(gt=0, allow_inf_nan=False, description="standard deviation of ln(tokens)")
    min: int = Field(1, ge=1, description="tokens, inclusive")
    max: int | None = Field(None, ge=1, description="tokens, inclusive; None = no upper clip")

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"lognormal length needs max >= min, got min={self.min}, max={self.max}")
        return self


class EmpiricalLength(_Strict):
    """Draws with replacement from one token column of a trace file.

    `trace` is a shipped trace name (see `shipped_traces()`, e.g. "azure2023_conv") or a path to a
    CSV in one of the formats `read_trace` knows; files with token columns but no timestamps
    (e.g. Vidur/Sarathi `num_prefill_tokens,num_decode_tokens` length files) are accepted here.
    Rows with 0 input or 0 output tokens are dropped first, as in `read_trace`.
    """

    dist: Literal["empirical"] = "empirical"
    trace: str = Field(min_length=1, description="shipped trace name or CSV path")
    column: Literal["input", "output"]


LengthDist = Annotated[
    Union[FixedLength, UniformLength, RangeRatioLength, LognormalLength, EmpiricalLength],
    Field(discriminator="dist"),
]


_LengthForms = Union[FixedLength, UniformLength, RangeRatioLength, LognormalLength, EmpiricalLength]


# --------------------------------------------------------------------------------------------
# Think-time distributions (seconds, for sessions)
# --------------------------------------------------------------------------------------------


class FixedSeconds(_Strict):
    """Every gap is exactly `value` seconds (0 = the next turn is sent as soon as the answer ends)."""

    dist: Literal["fixed"] = "fixed"
    value: float = Field(ge=0, allow_inf_nan=False, description="seconds", json_schema_extra={"unit": "s"})


class ExponentialSeconds(_Strict):
    """Exponential gaps with mean `mean` seconds."""

    dist: Literal["exponential"] = "exponential"
    mean: float = Field(gt=0, allow_inf_nan=False, description="mean seconds", json_schema_extra={"unit": "s"})


class LognormalSeconds(_Strict):
    """exp(Normal(ln median, sigma)) seconds, clipped to at most `max` (no rounding)."""

    dist: Literal["lognormal"] = "lognormal"
    median: float = Field(gt=0, allow_inf_nan=False, description="median seconds", json_schema_extra={"unit": "s"})
    sigma: float = Field(gt=0, allow_inf_nan=False, description="standard deviation of ln(seconds)")
    max: float | None = Field(None, gt=0, allow_inf_nan=False, description="upper clip in seconds; null = none",
                              json_schema_extra={"unit": "s"})


_SecondsForms = Union[FixedSeconds, ExponentialSeconds, LognormalSeconds]
SecondsDist = Annotated[_SecondsForms, Field(discriminator="dist")]

# RequestClass keys that only `sessions` reads, and their defaults (left out of a dump at their default,
# so the scenario a poisson/gamma/closed-loop/trace run writes is the same as before sessions existed).
_SESSION_CLASS_KEYS: dict[str, Any] = {"system_prompt_tokens": 0, "turns": None, "think_time_s": None}


class RequestClass(_Strict):
    """One kind of request: a share of the traffic (`weight`) and its length distributions.

    For `sessions` a class is a kind of conversation: `input_tokens` is each user message's length,
    `output_tokens` each answer's, and `system_prompt_tokens`, `turns` and `think_time_s` (only
    accepted there) give the shared system prompt, the turns per conversation and the gap between
    an answer and the next user message.
    """

    name: str = Field(min_length=1)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="relative share of requests "
                                                                       "(of conversations for sessions)")
    input_tokens: LengthDist
    output_tokens: LengthDist
    system_prompt_tokens: int = Field(0, ge=0, le=MAX_TRACE_TOKENS,
                                      description="sessions only: tokens of the system prompt every conversation "
                                                  "of this class starts with (shared, so cacheable across conversations)")
    turns: _LengthForms | None = Field(None, discriminator="dist",
                                       description="sessions only (required there): turns (requests) per "
                                                   "conversation, an integer length distribution")
    think_time_s: _SecondsForms | None = Field(
        None, discriminator="dist", description="sessions only: seconds from an answer's last token to the next "
                                                "user message being sent; null = 0 s")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for key, default in _SESSION_CLASS_KEYS.items():
            if key in data and data[key] == default:
                del data[key]
        return data

    def session_keys_set(self) -> list[str]:
        """The session-only keys this class sets to something other than their default."""
        return [k for k, default in _SESSION_CLASS_KEYS.items() if getattr(self, k) != default]


# --------------------------------------------------------------------------------------------
# Arrival processes
# --------------------------------------------------------------------------------------------


class RateProfile(_Strict):
    """Load that varies over the day: during the i-th `step_s` seconds the rate is the process's rate
    times `multipliers[i]`, and the pattern repeats every len(multipliers) x step_s seconds (24
    hourly values make a day). Arrivals are drawn at the constant rate on an operational clock and
    mapped to real time through the cumulative multiplier (the time-rescaling theorem: exact for
    Poisson arrivals; gamma gaps keep their shape within a step). The multipliers are yours to set:
    `assumed` unless you measured them (e.g. requests per hour from your own logs)."""

    step_s: float = Field(3600.0, gt=0, allow_inf_nan=False, description="length of one step of the profile",
                          json_schema_extra={"unit": "s"})
    multipliers: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        min_length=1, max_length=100_000, description="the rate's multiplier in each step (> 0), repeating")

    @property
    def period_s(self) -> float:
        return self.step_s * len(self.multipliers)

    def _knots(self) -> tuple[np.ndarray, np.ndarray]:
        m = np.asarray(self.multipliers, dtype=float)
        return np.arange(len(m) + 1) * self.step_s, np.concatenate([[0.0], np.cumsum(m * self.step_s)])

    def operational(self, t: np.ndarray | float) -> np.ndarray:
        """The cumulative multiplier Λ(t) = ∫0^t m(s) ds: real seconds to operational seconds."""
        knots_t, knots_l = self._knots()
        k, r = np.divmod(np.asarray(t, dtype=float), self.period_s)
        return k * knots_l[-1] + np.interp(r, knots_t, knots_l)

    def real(self, op: np.ndarray) -> np.ndarray:
        """Λ's inverse: operational seconds back to real seconds."""
        knots_t, knots_l = self._knots()
        k, r = np.divmod(np.asarray(op, dtype=float), knots_l[-1])
        return k * self.period_s + np.interp(r, knots_l, knots_t)


class PoissonArrivals(_Strict):
    """Exponential inter-arrival gaps with mean 1/rate_rps (= `gamma` with burstiness 1, drawn
    identically). `rate_rps: .inf` sends every request at t = 0, as vLLM's `--request-rate inf`."""

    process: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0, description="requests per second; .inf = all at t=0")
    vllm_rescale: bool = Field(
        True, description="as vllm bench serve: scale cumulative arrival times so the last of "
                          "num_requests lands at num_requests/rate_rps (only when num_requests is set)")
    rate_profile: RateProfile | None = Field(None, description="time-varying load: rate_rps x the profile's "
                                                               "multiplier of the moment (a day of hourly values)")


class GammaArrivals(_Strict):
    """vLLM `--burstiness`: gaps ~ Gamma(shape=burstiness, scale=1/(rate_rps*burstiness)).

    Mean gap 1/rate_rps, coefficient of variation 1/sqrt(burstiness): < 1 is burstier than Poisson,
    > 1 more regular, .inf gives constant gaps 1/rate_rps.
    """

    process: Literal["gamma"] = "gamma"
    rate_rps: float = Field(gt=0, description="requests per second; .inf = all at t=0")
    burstiness: float = Field(gt=0, description="gamma shape; 1 = Poisson, .inf = constant gaps")
    vllm_rescale: bool = Field(
        True, description="as vllm bench serve: scale cumulative arrival times so the last of "
                          "num_requests lands at num_requests/rate_rps (only when num_requests is set)")
    rate_profile: RateProfile | None = Field(None, description="time-varying load: rate_rps x the profile's "
                                                               "multiplier of the moment (a day of hourly values)")


class ClosedLoop(_Strict):
    """`vllm bench serve --max-concurrency C` with `--request-rate inf`: C requests in flight, a
    new one sent as soon as one finishes. Arrival times are set by the engine at dispatch."""

    process: Literal["closed_loop"] = "closed_loop"
    concurrency: int = Field(ge=1, description="requests in flight")


class TraceArrivals(_Strict):
    """Replay a request log: arrival time, input and output tokens per row.

    Rows with arrival (seconds since the trace's first request) >= `start_s` are kept and shifted
    by `start_s`, then divided by `time_scale` (2 = twice as fast, twice the rate). The
    TrafficConfig's `duration_s` then cuts the *replayed* (scaled) clock, and at most
    `max_requests` (and `num_requests`) rows are taken. See `read_trace` for formats.
    """

    process: Literal["trace"] = "trace"
    path: str = Field(min_length=1, description="shipped trace name (e.g. azure2023_conv) or CSV path")
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False, description="speed-up factor")
    start_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="seconds into the trace")
    max_requests: int | None = Field(None, ge=1)


class SessionArrivals(_Strict):
    """Multi-turn conversations: sessions start with gaps ~ Gamma(shape=burstiness,
    scale=1/(rate_sessions_per_s*burstiness)) (burstiness 1 = Poisson; drawn as `gamma`, without vLLM's
    rescale); each session's turns follow one another, the next sent `think_time_s` after the previous
    answer's last token (a closed loop per session). Each class needs `turns`.
    """

    process: Literal["sessions"] = "sessions"
    rate_sessions_per_s: float = Field(gt=0, allow_inf_nan=False, description="new conversations per second",
                                       json_schema_extra={"unit": "sessions/s"})
    burstiness: float = Field(1.0, gt=0, description="gamma shape of the gaps between session starts; 1 = Poisson, "
                                                     ".inf = constant gaps")
    num_sessions: int | None = Field(None, ge=1, description="conversations to start; null = as many as start "
                                                             "within traffic.duration_s")
    rate_profile: RateProfile | None = Field(None, description="time-varying load: rate_sessions_per_s x the "
                                                               "profile's multiplier of the moment")


Arrival = Annotated[
    Union[PoissonArrivals, GammaArrivals, ClosedLoop, TraceArrivals, SessionArrivals],
    Field(discriminator="process"),
]


class TrafficConfig(_Strict):
    """What arrives: an arrival process, request classes, and when to stop.

    * Open loop (`poisson`, `gamma`): generation stops after `num_requests` or at `duration_s`
      (seconds of arrivals), whichever comes first; at least one is required. With
      `rate_rps: .inf`, `num_requests` is required.
    * `closed_loop`: `num_requests` is required; `duration_s` is not accepted.
    * `trace`: the whole file, or the window set by `start_s`/`time_scale`/`duration_s`, capped
      by `max_requests`/`num_requests`. Lengths always come from the file. `classes` may be empty;
      if given, each replayed request is labelled with a class drawn by `weight` (their length
      distributions are not used), otherwise every request is in one class named after the file.
    * `sessions`: `arrival.num_sessions` or `duration_s` (seconds of session starts) is required;
      both may be given (whichever stops first). `num_requests`, if given, caps the total number of
      turns: turns are kept session by session in start order, each session's turns in order, up to
      `num_requests`, so the dropped turns are the last turns of the latest sessions (the last
      session kept may be cut short; a later turn is never kept without its earlier turns). Every
      class needs `turns`.
    """

    arrival: Arrival
    classes: list[RequestClass] = Field(default_factory=list)
    num_requests: int | None = Field(None, ge=1)
    duration_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="seconds of arrivals")

    @model_validator(mode="after")
    def _consistent(self) -> TrafficConfig:
        arrival = self.arrival
        names = [c.name for c in self.classes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"request class names must be unique; repeated: {', '.join(duplicates)}")
        if not isinstance(arrival, SessionArrivals):
            for c in self.classes:
                keys = c.session_keys_set()
                if keys:
                    raise ValueError(f"class '{quote(c.name, 60)}': {', '.join(keys)} only apply to arrival process "
                                     f"'sessions' (this traffic is '{arrival.process}'); remove "
                                     f"{'it' if len(keys) == 1 else 'them'} or use process: sessions")
        if isinstance(arrival, TraceArrivals):
            return self
        if not self.classes:
            raise ValueError(
                f"classes is empty; give at least one request class (name, input_tokens, "
                f"output_tokens) for arrival process '{arrival.process}' (only 'trace' may omit them)")
        if isinstance(arrival, ClosedLoop):
            if self.num_requests is None:
                raise ValueError("closed_loop needs num_requests (how many requests to send)")
            if self.duration_s is not None:
                raise ValueError("closed_loop takes num_requests, not duration_s (the engine sets "
                                 "arrival times); remove duration_s")
            return self
        if isinstance(arrival, SessionArrivals):
            missing = [c.name for c in self.classes if c.turns is None]
            if missing:
                raise ValueError(f"class '{quote(missing[0], 60)}' has no turns; arrival process 'sessions' needs "
                                 f"turns per conversation in every class, e.g. turns: {{dist: fixed, value: 3}}")
            if arrival.num_sessions is None and self.duration_s is None:
                raise ValueError("'sessions' arrivals need arrival.num_sessions or duration_s (seconds of session "
                                 "starts) to know when to stop; set at least one")
            return self
        if self.num_requests is None and self.duration_s is None:
            raise ValueError(f"'{arrival.process}' arrivals need num_requests or duration_s to know "
                             f"when to stop; set at least one")
        if math.isinf(arrival.rate_rps) and arrival.rate_profile is not None:
            raise ValueError("rate_rps .inf sends every request at t=0, so a rate_profile has nothing to shape; "
                             "give a finite rate_rps or remove rate_profile")
        if math.isinf(arrival.rate_rps) and self.num_requests is None:
            raise ValueError("rate_rps .inf sends every request at t=0, so it needs num_requests")
        return self


# --------------------------------------------------------------------------------------------
# The request stream
# --------------------------------------------------------------------------------------------


@runtime_checkable
class PrefixKeys(Protocol):
    """The identities of a request's KV-cache blocks, for prefix caching.

    `block_keys(request, block_size)` gives one non-negative int per leading full block of
    `block_size` tokens of request `request`'s token sequence (prompt, then output) that has an
    identity. Equal keys mean identical tokens from the start of the sequence to the end of that
    block (chained, as vLLM's `hash_block_tokens`: a block's hash covers its parent's hash and its
    own tokens). Blocks beyond the list returned are unique to the request. Pure: the same answer
    every call.
    """

    def block_keys(self, request: int, block_size: int) -> list[int]: ...


_KEY_SHIFT = 32      # SessionKeys: (stream id << 32) | block index


class SessionKeys:
    """Block identities of synthetic multi-turn sessions.

    A session's token stream is its class's system prompt, then user_1, answer_1, user_2, answer_2,
    ...; turn k's prompt is the system prompt, every earlier message and answer, and user_k, and its
    answer follows, so every block of turn k (answer included: vLLM caches generated tokens' full
    blocks too) reappears at the same position in turn k+1's prompt. Request r has
    floor((prompt_tokens[r] + output_tokens[r]) / block_size) keys. Block j's key is
    `(stream << 32) | j`: stream = the class index when the block lies wholly inside the class's
    system prompt ((j+1) * block_size <= system_prompt_tokens; the same for every session of the
    class), otherwise C + the session index (C = number of classes). Keys never collide.
    """

    def __init__(self, session: np.ndarray, class_index: np.ndarray, prompt_tokens: np.ndarray,
                 output_tokens: np.ndarray, system_prompt_tokens: Sequence[int]) -> None:
        n = len(session)
        if not (len(class_index) == len(prompt_tokens) == len(output_tokens) == n):
            raise ValueError("SessionKeys: session, class_index, prompt_tokens and output_tokens differ in length")
        self._session = [int(v) for v in np.asarray(session, dtype=np.int64).tolist()]
        self._class = [int(v) for v in np.asarray(class_index, dtype=np.int64).tolist()]
        total = np.asarray(prompt_tokens, dtype=np.int64) + np.asarray(output_tokens, dtype=np.int64)
        self._tokens = [int(v) for v in total.tolist()]
        self._system = [int(v) for v in system_prompt_tokens]
        self._num_classes = len(self._system)
        if n and (min(self._session) < 0 or min(self._class) < 0 or max(self._class) >= self._num_classes):
            raise ValueError("SessionKeys: a session index is negative or a class index has no system prompt length")

    def __len__(self) -> int:
        return len(self._session)

    def block_keys(self, request: int, block_size: int) -> list[int]:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        n = self._tokens[request] // block_size
        if n >= 1 << _KEY_SHIFT:
            raise ValueError(f"request {request}: {n} blocks do not fit the {_KEY_SHIFT}-bit block index")
        shared = min(n, self._system[self._class[request]] // block_size)
        class_base = self._class[request] << _KEY_SHIFT
        session_base = (self._num_classes + self._session[request]) << _KEY_SHIFT
        return list(range(class_base, class_base + shared)) + list(range(session_base + shared, session_base + n))


class TraceBlockKeys:
    """Block identities from a Mooncake-style trace's `hash_ids`.

    `hash_ids[r]` are the ids of request r's consecutive `hash_block_tokens`-token prompt blocks
    (chained: equal ids mean the same prompt prefix to that block's end; the last block may be
    partial), `input_tokens[r]` its prompt length. Engine block j (tokens [j*bs, (j+1)*bs)) ends
    inside trace block c = ((j+1)*bs - 1) // hash_block_tokens; its key is
    hash_ids[c] * (hash_block_tokens + 1) + ((j+1)*bs - c*hash_block_tokens): the trace block
    holding the engine block's end and the offset of that end, i.e. the content up to it. Keys are
    given for every full engine block with (j+1)*bs <= input_tokens[r] and c < len(hash_ids[r]);
    output blocks have none. This holds whether or not bs divides hash_block_tokens.
    """

    def __init__(self, hash_ids: Sequence[Sequence[int]] | tuple[np.ndarray, np.ndarray],
                 input_tokens: Sequence[int] | np.ndarray, hash_block_tokens: int = 512) -> None:
        """`hash_ids`: a list of id lists, or (flat int64 ids, int64 offsets of length n + 1)."""
        if hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {hash_block_tokens}")
        if isinstance(hash_ids, tuple) and len(hash_ids) == 2 and isinstance(hash_ids[0], np.ndarray):
            flat, offsets = (np.asarray(a, dtype=np.int64) for a in hash_ids)
        else:
            lists = [list(map(int, ids)) for ids in hash_ids]
            offsets = np.zeros(len(lists) + 1, dtype=np.int64)
            offsets[1:] = np.cumsum([len(ids) for ids in lists])
            flat = np.fromiter((i for ids in lists for i in ids), dtype=np.int64, count=int(offsets[-1]))
        if len(offsets) != len(input_tokens) + 1:
            raise ValueError(f"TraceBlockKeys: {len(offsets) - 1} hash_id lists for {len(input_tokens)} requests")
        if len(flat) and flat.min() < 0:
            raise ValueError("TraceBlockKeys: hash_ids must be non-negative")
        self._flat = flat
        self._offsets = offsets
        self._input = np.asarray(input_tokens, dtype=np.int64)
        self.hash_block_tokens = int(hash_block_tokens)

    def __len__(self) -> int:
        return len(self._input)

    def hash_ids(self, request: int) -> np.ndarray:
        """Request `request`'s trace block ids (read-only view)."""
        view = self._flat[self._offsets[request]:self._offsets[request + 1]]
        view.flags.writeable = False
        return view

    def block_keys(self, request: int, block_size: int) -> list[int]:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        h = self.hash_block_tokens
        ids = self._flat[self._offsets[request]:self._offsets[request + 1]]
        # full engine blocks of the prompt whose end lies inside a trace block that has an id
        n = min(int(self._input[request]), len(ids) * h) // block_size
        if n == 0:
            return []
        ends = np.arange(1, n + 1, dtype=np.int64) * block_size
        chunk = (ends - 1) // h
        return (ids[chunk] * (h + 1) + (ends - chunk * h)).tolist()

    def subset(self, rows: np.ndarray) -> TraceBlockKeys:
        """The keys of requests `rows` (indices into this one), renumbered 0..len(rows)-1."""
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self._offsets[rows + 1] - self._offsets[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum(lengths)
        if len(rows):
            flat = np.concatenate([self._flat[self._offsets[r]:self._offsets[r + 1]] for r in rows.tolist()])
        else:
            flat = np.zeros(0, dtype=np.int64)
        return TraceBlockKeys((flat, offsets), self._input[rows], self.hash_block_tokens)


@dataclass
class RequestStream:
    """Requests as a struct of arrays, sorted by arrival for open loop and trace replay.

    arrival_s: float64 seconds; all NaN for a closed loop (the engine stamps them at dispatch).
    prompt_tokens, output_tokens: int64 >= 1. class_index: int64 into class_names.
    concurrency: the closed-loop cap, None for open loop / trace / sessions.
    prefix_keys: the requests' block identities (`PrefixKeys`), None when they have none (every
    block unique): set for sessions (`SessionKeys`) and for traces with hash_ids (`TraceBlockKeys`).
    session, follows, think_s (sessions only, else None): per request, the conversation it belongs to
    (int64, -1 = none); the index of the request whose completion it waits for, the previous turn of
    its session (int64, -1 for a first turn); the seconds between that turn's last output token and
    this request being sent (float64, 0.0 for first turns). For a session stream arrival_s holds the
    send time of each first turn (non-decreasing over the first turns in index order, which come
    first) and NaN for later turns: the engine stamps them at the previous turn's finish + think_s.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    class_index: np.ndarray
    class_names: list[str]
    concurrency: int | None = None
    prefix_keys: PrefixKeys | None = None
    session: np.ndarray | None = None
    follows: np.ndarray | None = None
    think_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for field in ("prompt_tokens", "output_tokens", "class_index", "session", "follows", "think_s"):
            if getattr(self, field) is None:
                continue
            if len(getattr(self, field)) != n:
                raise ValueError(f"RequestStream.{field} has {len(getattr(self, field))} entries, "
                                 f"arrival_s has {n}")
        if self.prefix_keys is not None and hasattr(self.prefix_keys, "__len__") and len(self.prefix_keys) != n:
            raise ValueError(f"RequestStream.prefix_keys covers {len(self.prefix_keys)} requests, arrival_s has {n}")

    def __len__(self) -> int:
        return int(len(self.arrival_s))

    def to_frame(self) -> pd.DataFrame:
        """One row per request: arrival_s, prompt_tokens, output_tokens, class_index, class_name."""
        import pandas as pd

        names = np.asarray(self.class_names, dtype=object)
        return pd.DataFrame({
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "class_index": self.class_index,
            "class_name": names[self.class_index] if len(names) else np.full(len(self), "", dtype=object),
        })


# --------------------------------------------------------------------------------------------
# Traces
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TraceFormat:
    name: str
    time_col: str
    time_unit: Literal["datetime", "s", "ms"]
    input_col: str
    output_col: str

    @property
    def columns(self) -> tuple[str, str, str]:
        return (self.time_col, self.input_col, self.output_col)

    def describe(self) -> str:
        return f"{','.join(self.columns)} ({self.name})"


_FORMATS: tuple[_TraceFormat, ...] = (
    # Azure LLM inference trace 2023 (Splitwise); see capacity/data/traces/README.md.
    _TraceFormat("Azure 2023", "TIMESTAMP", "datetime", "ContextTokens", "GeneratedTokens"),
    # microsoft/vidur data/processed_traces/*.csv: arrived_at is seconds since the first request.
    _TraceFormat("Vidur", "arrived_at", "s", "num_prefill_tokens", "num_decode_tokens"),
    # kvcache-ai/Mooncake FAST25-release traces, as CSV: timestamp in ms since trace start.
    _TraceFormat("Mooncake CSV", "timestamp_ms", "ms", "input_length", "output_length"),
    # This project's generic format.
    _TraceFormat("generic", "arrival_s", "s", "input_tokens", "output_tokens"),
    # HPMLL/BurstGPT: Timestamp in seconds; failed requests have 0 response tokens.
    _TraceFormat("BurstGPT", "Timestamp", "s", "Request tokens", "Response tokens"),
)


def _expected_formats() -> str:
    return " | ".join(f.describe() for f in _FORMATS) + f" | {_JSONL_DESCRIPTION}"


# Mooncake's JSONL traces (kvcache-ai/Mooncake FAST25-release/traces/*.jsonl), one request a line:
# {"timestamp": ms since trace start, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}.
_JSONL_SUFFIXES = (".jsonl.gz", ".jsonl")
_JSONL_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
_JSONL_DESCRIPTION = "JSON lines timestamp (ms), input_length, output_length, hash_ids (Mooncake)"
MOONCAKE_HASH_BLOCK_TOKENS = 512    # Mooncake FAST25-release/README: each hash id is a 512-token block
_TRACE_SUFFIXES = (".csv",) + _JSONL_SUFFIXES


def _trace_stem(name: str) -> str:
    """A trace file's name without its format suffix (".csv", ".jsonl", ".jsonl.gz")."""
    for suffix in _TRACE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def shipped_traces() -> list[str]:
    """Names of the traces shipped in `capacity/data/traces/` (usable without a path)."""
    folder = data_dir() / "traces"
    if not folder.is_dir():
        return []
    return sorted({_trace_stem(p.name) for p in folder.iterdir()
                   if p.is_file() and p.name.endswith(_TRACE_SUFFIXES)})


def resolve_trace(name_or_path: str) -> Path:
    """A shipped trace name ("azure2023_conv", "mooncake_conversation", with or without its suffix)
    or a path to a file.

    Relative paths are taken from the current working directory. A missing file raises
    CapacityError.
    """
    path = Path(os.path.expanduser(name_or_path))
    if path.is_file():
        return path.resolve()
    if path.parent == Path("."):
        stem = _trace_stem(path.name)
        for suffix in _TRACE_SUFFIXES:
            shipped = data_dir() / "traces" / f"{stem}{suffix}"
            if shipped.is_file():
                return shipped
    names = ", ".join(shipped_traces()) or "none"
    raise CapacityError(f"trace {name_or_path}: no such file; give a path to a CSV or Mooncake JSONL trace or a "
                        f"shipped trace name ({names})")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _header(path: Path) -> list[str]:
    import pandas as pd

    try:
        return [str(c).strip() for c in pd.read_csv(path, nrows=0).columns]
    except pd.errors.EmptyDataError:
        raise CapacityError(f"trace {path}: the file is empty; give a CSV with a header row and one "
                            f"request per row") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as e:
        raise CapacityError(f"trace {path}: cannot read it as CSV ({_first_line(e)}); give a "
                            f"comma-separated file with a header row") from None


def _missing_columns_error(path: Path, header: list[str], needed: list[tuple[str, ...]]) -> CapacityError:
    # Report the missing columns of the format the header is closest to.
    best = max(needed, key=lambda cols: sum(c in header for c in cols))
    missing = [c for c in best if c not in header]
    return CapacityError(f"trace {path}: missing columns {', '.join(missing)}; expected one of: "
                         f"{_expected_formats()}")


def _token_column(raw: pd.Series, path: Path, column: str) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values) | (values < 0) | (values != np.floor(values)) | (values > MAX_TRACE_TOKENS)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise CapacityError(f"trace {path}: column {column} data row {row + 1} is '{quote(raw.iloc[row], 60)}', "
                            f"not a whole number of tokens from 0 to {MAX_TRACE_TOKENS:,}; fix or remove that row")
    return values.astype(np.int64)


def _time_column(raw: pd.Series, path: Path, fmt: _TraceFormat) -> np.ndarray:
    """Seconds since the earliest timestamp, float64."""
    import pandas as pd

    if fmt.time_unit == "datetime":
        try:
            stamps = pd.to_datetime(raw, format="ISO8601")
        except (ValueError, TypeError) as e:
            raise CapacityError(f"trace {path}: column {fmt.time_col} is not a date-time column "
                                f"({_first_line(e)}); use YYYY-MM-DD HH:MM:SS.fff values") from None
        if stamps.isna().any():
            row = int(np.flatnonzero(stamps.isna().to_numpy())[0])
            raise CapacityError(f"trace {path}: column {fmt.time_col} data row {row + 1} is empty; "
                                f"fix or remove that row")
        ns = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
        return (ns - ns.min()).astype(np.float64) / 1e9
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise CapacityError(f"trace {path}: column {fmt.time_col} data row {row + 1} is "
                            f"{raw.iloc[row]!r}, not a number; fix or remove that row")
    seconds = values / 1000.0 if fmt.time_unit == "ms" else values
    return seconds - seconds.min()


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith(_JSONL_SUFFIXES)


def _load_jsonl(path: Path) -> dict[str, np.ndarray]:
    """A Mooncake JSONL trace as arrays: arrival_s (timestamp ms / 1000, minus the earliest),
    input_tokens, output_tokens, hash_flat and hash_offsets (each row's hash_ids, in row order)."""
    import gzip
    import json

    opener = gzip.open if path.name.endswith(".gz") else open
    times: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    ids: list[int] = []
    lengths: list[int] = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise CapacityError(f"trace {path}: line {number} is not JSON ({_first_line(e)}); give one JSON "
                                        f"object per line") from None
                if not isinstance(row, dict) or any(k not in row for k in _JSONL_KEYS):
                    missing = [k for k in _JSONL_KEYS if not isinstance(row, dict) or k not in row]
                    raise CapacityError(f"trace {path}: line {number} lacks {', '.join(missing)}; each line needs "
                                        f"{', '.join(_JSONL_KEYS)}")
                t, a, b, h = (row[k] for k in _JSONL_KEYS)
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                    raise CapacityError(f"trace {path}: line {number} timestamp is '{quote(t, 60)}', not a number "
                                        f"of milliseconds; fix or remove that line")
                for key, value in (("input_length", a), ("output_length", b)):
                    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TRACE_TOKENS:
                        raise CapacityError(f"trace {path}: line {number} {key} is '{quote(value, 60)}', not a whole "
                                            f"number of tokens from 0 to {MAX_TRACE_TOKENS:,}; fix or remove that line")
                if not isinstance(h, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
                                                      for v in h):
                    raise CapacityError(f"trace {path}: line {number} hash_ids is '{quote(h, 60)}', not a list of "
                                        f"non-negative integer block ids; fix or remove that line")
                times.append(float(t))
                inp.append(a)
                out.append(b)
                ids.extend(h)
                lengths.append(len(h))
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise CapacityError(f"trace {path}: cannot read it ({_first_line(e)}); give a JSON-lines file, "
                            f"gzipped or not") from None
    if not times:
        raise CapacityError(f"trace {path}: the file has no requests; give one JSON object per line")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    seconds = np.array(times, dtype=np.float64) / 1000.0
    return {"arrival_s": seconds - seconds.min(), "input_tokens": np.array(inp, dtype=np.int64),
            "output_tokens": np.array(out, dtype=np.int64), "hash_flat": np.array(ids, dtype=np.int64),
            "hash_offsets": offsets}


def _select_rows(data: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The rows `rows` of a parsed trace (hash ids included)."""
    result = {k: v[rows] for k, v in data.items() if k not in ("hash_flat", "hash_offsets")}
    if "hash_flat" in data:
        keys = TraceBlockKeys((data["hash_flat"], data["hash_offsets"]), data["input_tokens"]).subset(rows)
        result["hash_flat"], result["hash_offsets"] = keys._flat, keys._offsets
    return result


@functools.lru_cache(maxsize=16)
def _load(path_str: str, mtime_ns: int, size: int, need_time: bool) -> dict[str, np.ndarray]:
    """Parse a trace once per (file, version). Arrays are read-only; callers copy."""
    path = Path(path_str)
    if _is_jsonl(path):
        data = _load_jsonl(path)
        keep = (data["input_tokens"] > 0) & (data["output_tokens"] > 0)
        if not keep.any():
            raise CapacityError(f"trace {path}: no rows with input and output tokens both > 0; give a "
                                f"trace with at least one complete request")
        rows = np.flatnonzero(keep)
        rows = rows[np.argsort(data["arrival_s"][rows], kind="stable")]
        result = _select_rows(data, rows)
        result["arrival_s"] = result["arrival_s"] - result["arrival_s"][0]
        if not need_time:
            result = {"input_tokens": result["input_tokens"], "output_tokens": result["output_tokens"]}
        for array in result.values():
            array.setflags(write=False)
        return result
    import pandas as pd

    header = _header(path)
    if need_time:
        fmt = next((f for f in _FORMATS if all(c in header for c in f.columns)), None)
        if fmt is None:
            raise _missing_columns_error(path, header, [f.columns for f in _FORMATS])
    else:
        fmt = next((f for f in _FORMATS if f.input_col in header and f.output_col in header), None)
        if fmt is None:
            raise _missing_columns_error(path, header, [(f.input_col, f.output_col) for f in _FORMATS])
    usecols = list(fmt.columns) if need_time else [fmt.input_col, fmt.output_col]
    try:
        frame = pd.read_csv(path, usecols=lambda c: str(c).strip() in usecols, dtype=str,
                            keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, ValueError) as e:
        raise CapacityError(f"trace {path}: cannot read it as CSV ({_first_line(e)}); give a "
                            f"comma-separated file with a header row") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    inp = _token_column(frame[fmt.input_col], path, fmt.input_col)
    out = _token_column(frame[fmt.output_col], path, fmt.output_col)
    keep = (inp > 0) & (out > 0)
    if not keep.any():
        raise CapacityError(f"trace {path}: no rows with input and output tokens both > 0; give a "
                            f"trace with at least one complete request")
    result = {"input_tokens": inp[keep], "output_tokens": out[keep]}
    if need_time:
        t = _time_column(frame[fmt.time_col], path, fmt)[keep]
        order = np.argsort(t, kind="stable")
        t = t[order]
        result = {"arrival_s": t - t[0], "input_tokens": result["input_tokens"][order],
                  "output_tokens": result["output_tokens"][order]}
    for array in result.values():
        array.setflags(write=False)
    return result


def _cached(name_or_path: str, need_time: bool) -> dict[str, np.ndarray]:
    path = resolve_trace(name_or_path)
    stat = path.stat()
    return _load(str(path), stat.st_mtime_ns, stat.st_size, need_time)


def read_trace(path: str) -> pd.DataFrame:
    """Read a request trace into columns arrival_s, input_tokens, output_tokens.

    `path` is a CSV or JSONL path or a shipped trace name ("azure2023_conv", "azure2023_code",
    "mooncake_conversation"). The format is recognised by its name (JSONL) or its header (CSV):

    * Azure LLM inference trace 2023: TIMESTAMP (date-time), ContextTokens, GeneratedTokens
    * Vidur processed traces: arrived_at (s), num_prefill_tokens, num_decode_tokens
    * Mooncake (CSV form): timestamp_ms (ms), input_length, output_length
    * generic: arrival_s (s), input_tokens, output_tokens
    * BurstGPT: Timestamp (s), Request tokens, Response tokens
    * Mooncake JSONL (`.jsonl` or `.jsonl.gz`, one JSON object a line): timestamp (ms), input_length,
      output_length, hash_ids (ids of the prompt's 512-token blocks; replay gives them to the
      engine as `TraceBlockKeys`, this frame leaves them out)

    Rows with 0 input tokens or 0 output tokens are dropped (e.g. BurstGPT's failed requests).
    Rows are sorted by time (stable), and arrival_s is seconds since the first remaining request,
    so arrival_s[0] == 0. Missing columns, non-numeric values or negative token counts raise
    CapacityError.
    """
    import pandas as pd

    data = _cached(path, need_time=True)
    return pd.DataFrame({k: np.array(data[k]) for k in ("arrival_s", "input_tokens", "output_tokens")})


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


def range_ratio_bounds(mean: int, range_ratio: float) -> tuple[int, int]:
    """vLLM RandomDataset bounds: (max(1, floor(mean*(1-r))), max(1, ceil(mean*(1+r)))), inclusive."""
    low = math.floor(mean * (1 - range_ratio))
    high = math.ceil(mean * (1 + range_ratio))
    return max(low, 1), max(high, 1)


def sample_lengths(dist: FixedLength | UniformLength | RangeRatioLength | LognormalLength | EmpiricalLength,
                   n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` token counts (int64 >= 1) from one length distribution."""
    if isinstance(dist, FixedLength):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.low, dist.high + 1, size=n, dtype=np.int64)
    if isinstance(dist, RangeRatioLength):
        low, high = range_ratio_bounds(dist.mean, dist.range_ratio)
        return rng.integers(low, high + 1, size=n, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        raw = rng.lognormal(mean=math.log(dist.median), sigma=dist.sigma, size=n)
        upper = float(dist.max) if dist.max is not None else 2.0**53
        return np.clip(np.rint(raw), dist.min, upper).astype(np.int64)
    if isinstance(dist, EmpiricalLength):
        values = _cached(dist.trace, need_time=False)[f"{dist.column}_tokens"]
        return values[rng.integers(0, len(values), size=n)].astype(np.int64)
    raise TypeError(f"unknown length distribution {type(dist).__name__}")


def _gaps(rate_rps: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if math.isinf(burstiness):
        return np.full(n, 1.0 / rate_rps)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate_rps * burstiness), size=n)


def open_loop_arrivals(arrival: PoissonArrivals | GammaArrivals, num_requests: int | None,
                        duration_s: float | None, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson or gamma process as `vllm bench serve` draws them: `num_requests`
    of them, or as many as fall within `duration_s`."""
    profile = getattr(arrival, "rate_profile", None)
    if profile is not None:                 # drawn on the operational clock, mapped back to real time
        flat = arrival.model_copy(update={"rate_profile": None})
        op = open_loop_arrivals(flat, num_requests, None if duration_s is None else float(profile.operational(duration_s)),
                                rng)
        return profile.real(op)
    rate = arrival.rate_rps
    burstiness = arrival.burstiness if isinstance(arrival, GammaArrivals) else 1.0
    if math.isinf(rate):  # vLLM: delay 0 for every request
        assert num_requests is not None  # enforced by TrafficConfig
        return np.zeros(num_requests)
    if num_requests is not None:
        if num_requests > MAX_REQUESTS:
            raise CapacityError(f"num_requests {num_requests} is above the limit of {MAX_REQUESTS}; "
                                f"lower it or use duration_s")
        t = np.cumsum(_gaps(rate, burstiness, num_requests, rng))
        if arrival.vllm_rescale and t[-1] != 0:
            t = t * ((num_requests / rate) / t[-1])
        return t[t < duration_s] if duration_s is not None else t
    assert duration_s is not None  # enforced by TrafficConfig
    expected = rate * duration_s
    if expected > MAX_REQUESTS:
        raise CapacityError(f"rate_rps x duration_s is {expected:.3g} requests, above the limit of "
                            f"{MAX_REQUESTS}; shorten duration_s or lower rate_rps")
    # Chunk sizes depend only on the config, so the draws are reproducible.
    chunk = int(expected + 6.0 * math.sqrt(expected / min(burstiness, 1.0)) + 16)
    parts: list[np.ndarray] = []
    last = 0.0
    while last < duration_s:
        t = last + np.cumsum(_gaps(rate, burstiness, chunk, rng))
        parts.append(t)
        last = float(t[-1])
        if sum(len(p) for p in parts) > MAX_REQUESTS:
            raise CapacityError(f"the arrivals in duration_s {duration_s:g} exceed {MAX_REQUESTS} "
                                f"requests; shorten duration_s or lower rate_rps")
    t = np.concatenate(parts)
    return t[t < duration_s]


def _class_mix(classes: list[RequestClass], n: int, rng: np.random.Generator) -> np.ndarray:
    if len(classes) == 1:
        return np.zeros(n, dtype=np.int64)
    weights = np.array([c.weight for c in classes], dtype=np.float64)
    return rng.choice(len(classes), size=n, p=weights / weights.sum()).astype(np.int64)


def _replay(cfg: TrafficConfig, arrival: TraceArrivals, rng: np.random.Generator) -> RequestStream:
    data = _cached(arrival.path, need_time=True)
    t = data["arrival_s"]
    rows = np.flatnonzero(t >= arrival.start_s)
    t = (t[rows] - arrival.start_s) / arrival.time_scale
    prompt = data["input_tokens"][rows]
    output = data["output_tokens"][rows]
    if cfg.duration_s is not None:
        inside = t < cfg.duration_s
        t, prompt, output, rows = t[inside], prompt[inside], output[inside], rows[inside]
    caps = [c for c in (arrival.max_requests, cfg.num_requests) if c is not None]
    if caps:
        n = min(caps)
        t, prompt, output, rows = t[:n], prompt[:n], output[:n], rows[:n]
    prefix_keys = None
    if "hash_flat" in data:
        prefix_keys = TraceBlockKeys((data["hash_flat"], data["hash_offsets"]), data["input_tokens"],
                                     MOONCAKE_HASH_BLOCK_TOKENS).subset(rows)
    if len(t) == 0:
        raise CapacityError(f"trace {arrival.path}: no requests at or after start_s={arrival.start_s:g} s"
                            f"{'' if cfg.duration_s is None else f' within duration_s={cfg.duration_s:g} s'}"
                            f"; lower start_s or lengthen duration_s")
    if cfg.classes:
        class_index = _class_mix(cfg.classes, len(t), rng.spawn(1)[0])
        names = [c.name for c in cfg.classes]
    else:
        class_index = np.zeros(len(t), dtype=np.int64)
        names = [_trace_stem(Path(arrival.path).name)]
    return RequestStream(arrival_s=np.array(t, dtype=np.float64), prompt_tokens=np.array(prompt, dtype=np.int64),
                         output_tokens=np.array(output, dtype=np.int64), class_index=class_index,
                         class_names=names, concurrency=None, prefix_keys=prefix_keys)


# --------------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------------


def sample_seconds(dist: FixedSeconds | ExponentialSeconds | LognormalSeconds, n: int,
                   rng: np.random.Generator) -> np.ndarray:
    """`n` durations in seconds (float64 >= 0) from one think-time distribution."""
    if isinstance(dist, FixedSeconds):
        return np.full(n, float(dist.value))
    if isinstance(dist, ExponentialSeconds):
        return rng.exponential(scale=dist.mean, size=n)
    if isinstance(dist, LognormalSeconds):
        raw = rng.lognormal(mean=math.log(dist.median), sigma=dist.sigma, size=n)
        return np.minimum(raw, dist.max) if dist.max is not None else raw
    raise TypeError(f"unknown think-time distribution {type(dist).__name__}")


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _lognormal_mean_min(mu: float, sigma: float, c: float) -> float:
    """E[min(X, c)] for X = exp(Normal(mu, sigma)), c > 0."""
    z = (math.log(c) - mu) / sigma
    return math.exp(mu + sigma * sigma / 2.0) * (1.0 - _normal_sf(z - sigma)) + c * _normal_sf(z)


_EXACT_TERMS = 100_000


def mean_length(dist: FixedLength | UniformLength | RangeRatioLength | LognormalLength | EmpiricalLength) -> float:
    """The mean of `sample_lengths(dist, ...)`, exactly where the distribution allows it.

    fixed, uniform and range_ratio: the mean of the (closed) integer range; empirical: the mean of the
    trace column (zero rows dropped, as drawn). lognormal: E[clip(rint(X), min, max)] =
    min + sum_{k=min}^{max-1} P(X >= k + 1/2), summed term by term for the first 100,000 integers and,
    beyond them (only a long upper tail), by the integral of P(X >= x), the midpoint rule, in closed form.
    """
    if isinstance(dist, FixedLength):
        return float(dist.value)
    if isinstance(dist, UniformLength):
        return (dist.low + dist.high) / 2.0
    if isinstance(dist, RangeRatioLength):
        low, high = range_ratio_bounds(dist.mean, dist.range_ratio)
        return (low + high) / 2.0
    if isinstance(dist, EmpiricalLength):
        return float(np.mean(_cached(dist.trace, need_time=False)[f"{dist.column}_tokens"]))
    if isinstance(dist, LognormalLength):
        mu, sigma = math.log(dist.median), dist.sigma
        upper = dist.max if dist.max is not None else math.inf
        exact_end = min(upper, dist.min + _EXACT_TERMS)            # k runs over [min, exact_end)
        total = float(dist.min)
        total += math.fsum(_normal_sf((math.log(k + 0.5) - mu) / sigma) for k in range(dist.min, int(exact_end)))
        if upper > exact_end:                                      # sum_{k=a}^{b-1} P(X >= k+1/2) ~ int_a^b P(X >= x) dx
            a = float(exact_end)
            high = math.exp(mu + sigma * sigma / 2.0) if math.isinf(upper) else _lognormal_mean_min(mu, sigma, upper)
            total += high - _lognormal_mean_min(mu, sigma, a)
        return total
    raise TypeError(f"unknown length distribution {type(dist).__name__}")


def expected_requests_per_session(cfg: TrafficConfig) -> float:
    """Mean requests (turns) per session of a `sessions` traffic: the weight-averaged mean of each class's
    `turns` distribution (`mean_length`: exact for fixed, uniform, range_ratio and empirical; lognormal
    from its parameters after the rounding and clipping `sample_lengths` applies). A request rate r
    corresponds to the session rate r / expected_requests_per_session(cfg). `num_requests` caps are
    not taken into account."""
    if not isinstance(cfg.arrival, SessionArrivals):
        raise CapacityError(f"expected_requests_per_session needs arrival process 'sessions', not "
                            f"'{cfg.arrival.process}'")
    weights = np.array([c.weight for c in cfg.classes], dtype=np.float64)
    means = np.array([mean_length(c.turns) for c in cfg.classes if c.turns is not None], dtype=np.float64)
    return float(np.dot(weights / weights.sum(), means))


def _session_starts(arrival: SessionArrivals, duration_s: float | None, rng: np.random.Generator) -> np.ndarray:
    rate, n = arrival.rate_sessions_per_s, arrival.num_sessions
    if n is not None and n > MAX_REQUESTS:
        raise CapacityError(f"num_sessions {n} is above the limit of {MAX_REQUESTS}; lower it")
    if n is None and duration_s is not None and rate * duration_s > MAX_REQUESTS:
        raise CapacityError(f"rate_sessions_per_s x duration_s is {rate * duration_s:.3g} sessions, above the limit "
                            f"of {MAX_REQUESTS}; shorten duration_s or lower rate_sessions_per_s")
    process = GammaArrivals(rate_rps=rate, burstiness=arrival.burstiness, vllm_rescale=False,
                            rate_profile=arrival.rate_profile)
    starts = open_loop_arrivals(process, n, duration_s, rng)
    if len(starts) == 0:
        raise CapacityError(f"no session starts within duration_s={duration_s:g} s at rate_sessions_per_s="
                            f"{rate:g}; lengthen duration_s or raise the rate")
    return starts


def _sessions(cfg: TrafficConfig, arrival: SessionArrivals, rng: np.random.Generator) -> RequestStream:
    start_rng, class_rng, turns_rng, length_rng, think_rng = rng.spawn(5)
    starts = _session_starts(arrival, cfg.duration_s, start_rng)
    num_sessions = len(starts)
    session_class = _class_mix(cfg.classes, num_sessions, class_rng)
    turns = np.empty(num_sessions, dtype=np.int64)
    for k, request_class in enumerate(cfg.classes):
        members = np.flatnonzero(session_class == k)
        assert request_class.turns is not None  # enforced by TrafficConfig
        turns[members] = sample_lengths(request_class.turns, len(members), turns_rng)
    # num_requests: keep turns session by session in start order up to the cap
    if cfg.num_requests is not None and int(turns.sum()) > cfg.num_requests:
        before = np.cumsum(turns) - turns
        turns = np.clip(cfg.num_requests - before, 0, turns)
        kept = turns > 0
        starts, session_class, turns = starts[kept], session_class[kept], turns[kept]
        num_sessions = len(starts)
    total = int(turns.sum())
    if total > MAX_REQUESTS:
        raise CapacityError(f"the sessions hold {total} turns, above the limit of {MAX_REQUESTS}; lower "
                            f"num_sessions, duration_s or the turns per session, or cap them with num_requests")
    # turn-level arrays in session-major order (session 0's turns, then session 1's, ...)
    session = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    first = np.zeros(num_sessions, dtype=np.int64)
    first[1:] = np.cumsum(turns)[:-1]
    turn = np.arange(total, dtype=np.int64) - np.repeat(first, turns)
    class_index = session_class[session]
    user = np.empty(total, dtype=np.int64)
    answer = np.empty(total, dtype=np.int64)
    think = np.zeros(total, dtype=np.float64)
    later = turn > 0
    for k, request_class in enumerate(cfg.classes):
        members = np.flatnonzero(class_index == k)
        user[members] = sample_lengths(request_class.input_tokens, len(members), length_rng)
        answer[members] = sample_lengths(request_class.output_tokens, len(members), length_rng)
        if request_class.think_time_s is not None:
            waits = np.flatnonzero(later & (class_index == k))
            think[waits] = sample_seconds(request_class.think_time_s, len(waits), think_rng)
    # turn k's prompt: system prompt + every earlier user message and answer of its session + user_k
    system = np.array([c.system_prompt_tokens for c in cfg.classes], dtype=np.int64)
    exchanged = np.cumsum(user + answer) - (user + answer)          # tokens before this turn, all sessions
    history = exchanged - np.repeat(exchanged[first], turns)
    prompt = system[class_index] + history + user
    follows = np.where(later, np.arange(total, dtype=np.int64) - 1, -1)
    # first turns first, in start order; then the later turns, session by session
    order = np.concatenate([first, np.flatnonzero(later)])
    position = np.empty(total, dtype=np.int64)
    position[order] = np.arange(total, dtype=np.int64)
    follows = np.where(follows >= 0, position[np.maximum(follows, 0)], -1)[order]
    session, class_index, prompt, answer, think = (a[order] for a in (session, class_index, prompt, answer, think))
    arrival_s = np.full(total, np.nan)
    arrival_s[:num_sessions] = starts
    keys = SessionKeys(session, class_index, prompt, answer, system.tolist())
    return RequestStream(arrival_s=arrival_s, prompt_tokens=prompt, output_tokens=answer, class_index=class_index,
                         class_names=[c.name for c in cfg.classes], concurrency=None, prefix_keys=keys,
                         session=session, follows=follows, think_s=think)


def build_requests(cfg: TrafficConfig, rng: np.random.Generator) -> RequestStream:
    """Generate (or replay) the requests of `cfg`, deterministically for a given `rng` state.

    Open loop: arrival times as `vllm bench serve` (see the module docstring), each request's
    class drawn by weight, its lengths from that class's distributions. Closed loop: lengths and
    classes as above, arrival_s all NaN, `concurrency` set. Trace: see `TraceArrivals`. Sessions: see
    `SessionArrivals` and `RequestStream` (session, follows, think_s, prefix_keys).
    """
    arrival = cfg.arrival
    if isinstance(arrival, TraceArrivals):
        return _replay(cfg, arrival, rng)
    if isinstance(arrival, SessionArrivals):
        return _sessions(cfg, arrival, rng)
    arrival_rng, class_rng, length_rng = rng.spawn(3)
    if isinstance(arrival, ClosedLoop):
        assert cfg.num_requests is not None  # enforced by TrafficConfig
        if cfg.num_requests > MAX_REQUESTS:
            raise CapacityError(f"num_requests {cfg.num_requests} is above the limit of {MAX_REQUESTS}; "
                                f"lower it")
        arrival_s = np.full(cfg.num_requests, np.nan)
        concurrency: int | None = arrival.concurrency
    else:
        arrival_s = open_loop_arrivals(arrival, cfg.num_requests, cfg.duration_s, arrival_rng)
        concurrency = None
    n = len(arrival_s)
    class_index = _class_mix(cfg.classes, n, class_rng)
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    for k, request_class in enumerate(cfg.classes):
        members = np.flatnonzero(class_index == k)
        prompt[members] = sample_lengths(request_class.input_tokens, len(members), length_rng)
        output[members] = sample_lengths(request_class.output_tokens, len(members), length_rng)
    return RequestStream(arrival_s=arrival_s.astype(np.float64), prompt_tokens=prompt, output_tokens=output,
                         class_index=class_index, class_names=[c.name for c in cfg.classes],
                         concurrency=concurrency)
