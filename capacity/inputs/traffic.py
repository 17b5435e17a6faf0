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
* `trace` replays a request log: arrival, input and output tokens from the file.

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
adding a request class does not change the arrival times of a given seed.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

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
    "RequestClass",
    "PoissonArrivals",
    "GammaArrivals",
    "ClosedLoop",
    "TraceArrivals",
    "Arrival",
    "TrafficConfig",
    "RequestStream",
    "build_requests",
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


class RequestClass(_Strict):
    """One kind of request: a share of the traffic (`weight`) and its length distributions."""

    name: str = Field(min_length=1)
    weight: float = Field(1.0, gt=0, allow_inf_nan=False, description="relative share of requests")
    input_tokens: LengthDist
    output_tokens: LengthDist


# --------------------------------------------------------------------------------------------
# Arrival processes
# --------------------------------------------------------------------------------------------


class PoissonArrivals(_Strict):
    """Exponential inter-arrival gaps with mean 1/rate_rps (= `gamma` with burstiness 1, drawn
    identically). `rate_rps: .inf` sends every request at t = 0, as vLLM's `--request-rate inf`."""

    process: Literal["poisson"] = "poisson"
    rate_rps: float = Field(gt=0, description="requests per second; .inf = all at t=0")
    vllm_rescale: bool = Field(
        True, description="as vllm bench serve: scale cumulative arrival times so the last of "
                          "num_requests lands at num_requests/rate_rps (only when num_requests is set)")


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


Arrival = Annotated[
    Union[PoissonArrivals, GammaArrivals, ClosedLoop, TraceArrivals],
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
        if self.num_requests is None and self.duration_s is None:
            raise ValueError(f"'{arrival.process}' arrivals need num_requests or duration_s to know "
                             f"when to stop; set at least one")
        if math.isinf(arrival.rate_rps) and self.num_requests is None:
            raise ValueError("rate_rps .inf sends every request at t=0, so it needs num_requests")
        return self


# --------------------------------------------------------------------------------------------
# The request stream
# --------------------------------------------------------------------------------------------


@dataclass
class RequestStream:
    """Requests as a struct of arrays, sorted by arrival for open loop and trace replay.

    arrival_s: float64 seconds; all NaN for a closed loop (the engine stamps them at dispatch).
    prompt_tokens, output_tokens: int64 >= 1. class_index: int64 into class_names.
    concurrency: the closed-loop cap, None for open loop / trace.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    class_index: np.ndarray
    class_names: list[str]
    concurrency: int | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for field in ("prompt_tokens", "output_tokens", "class_index"):
            if len(getattr(self, field)) != n:
                raise ValueError(f"RequestStream.{field} has {len(getattr(self, field))} entries, "
                                 f"arrival_s has {n}")

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
    return " | ".join(f.describe() for f in _FORMATS)


def shipped_traces() -> list[str]:
    """Names of the traces shipped in `capacity/data/traces/` (usable without a path)."""
    folder = data_dir() / "traces"
    return sorted(p.stem for p in folder.glob("*.csv")) if folder.is_dir() else []


def resolve_trace(name_or_path: str) -> Path:
    """A shipped trace name ("azure2023_conv", with or without ".csv") or a path to a file.

    Relative paths are taken from the current working directory. A missing file raises
    CapacityError.
    """
    path = Path(os.path.expanduser(name_or_path))
    if path.is_file():
        return path.resolve()
    if path.parent == Path("."):
        stem = path.name[:-4] if path.name.endswith(".csv") else path.name
        shipped = data_dir() / "traces" / f"{stem}.csv"
        if shipped.is_file():
            return shipped
    names = ", ".join(shipped_traces()) or "none"
    raise CapacityError(f"trace {name_or_path}: no such file; give a path to a CSV trace or a shipped "
                        f"trace name ({names})")


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


@functools.lru_cache(maxsize=16)
def _load(path_str: str, mtime_ns: int, size: int, need_time: bool) -> dict[str, np.ndarray]:
    """Parse a trace once per (file, version). Arrays are read-only; callers copy."""
    import pandas as pd

    path = Path(path_str)
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

    `path` is a CSV path or a shipped trace name ("azure2023_conv", "azure2023_code"). The format
    is recognised by its header:

    * Azure LLM inference trace 2023: TIMESTAMP (date-time), ContextTokens, GeneratedTokens
    * Vidur processed traces: arrived_at (s), num_prefill_tokens, num_decode_tokens
    * Mooncake (CSV form): timestamp_ms (ms), input_length, output_length
    * generic: arrival_s (s), input_tokens, output_tokens
    * BurstGPT: Timestamp (s), Request tokens, Response tokens

    Rows with 0 input tokens or 0 output tokens are dropped (e.g. BurstGPT's failed requests).
    Rows are sorted by time (stable), and arrival_s is seconds since the first remaining request,
    so arrival_s[0] == 0. Missing columns, non-numeric values or negative token counts raise
    CapacityError.
    """
    import pandas as pd

    data = _cached(path, need_time=True)
    return pd.DataFrame({k: np.array(v) for k, v in data.items()})


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
    keep = t >= arrival.start_s
    t = (t[keep] - arrival.start_s) / arrival.time_scale
    prompt = data["input_tokens"][keep]
    output = data["output_tokens"][keep]
    if cfg.duration_s is not None:
        inside = t < cfg.duration_s
        t, prompt, output = t[inside], prompt[inside], output[inside]
    caps = [c for c in (arrival.max_requests, cfg.num_requests) if c is not None]
    if caps:
        n = min(caps)
        t, prompt, output = t[:n], prompt[:n], output[:n]
    if len(t) == 0:
        raise CapacityError(f"trace {arrival.path}: no requests at or after start_s={arrival.start_s:g} s"
                            f"{'' if cfg.duration_s is None else f' within duration_s={cfg.duration_s:g} s'}"
                            f"; lower start_s or lengthen duration_s")
    if cfg.classes:
        class_index = _class_mix(cfg.classes, len(t), rng.spawn(1)[0])
        names = [c.name for c in cfg.classes]
    else:
        class_index = np.zeros(len(t), dtype=np.int64)
        names = [Path(arrival.path).stem]
    return RequestStream(arrival_s=np.array(t, dtype=np.float64), prompt_tokens=np.array(prompt, dtype=np.int64),
                         output_tokens=np.array(output, dtype=np.int64), class_index=class_index,
                         class_names=names, concurrency=None)


def build_requests(cfg: TrafficConfig, rng: np.random.Generator) -> RequestStream:
    """Generate (or replay) the requests of `cfg`, deterministically for a given `rng` state.

    Open loop: arrival times as `vllm bench serve` (see the module docstring), each request's
    class drawn by weight, its lengths from that class's distributions. Closed loop: lengths and
    classes as above, arrival_s all NaN, `concurrency` set. Trace: see `TraceArrivals`.
    """
    arrival = cfg.arrival
    if isinstance(arrival, TraceArrivals):
        return _replay(cfg, arrival, rng)
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
