"""Serving metrics with `vllm bench serve` definitions, SLOs, goodput and stability detection.

Definitions follow vLLM's benchmark client, `vllm/benchmarks/serve.py` (`calculate_metrics`,
`BenchmarkMetrics`, `benchmark`, `parse_goodput`) and the streaming request functions in
`vllm/benchmarks/lib/endpoint_request_func.py` (repository vllm-project/vllm):

* TTFT = time of the first streamed chunk - time the request was sent.
* E2E latency ("e2el") = time of the last streamed chunk - time the request was sent.
* TPOT = (E2E - TTFT) / (output_len - 1), per request, only for requests with output_len > 1;
  the aggregate statistics are over those requests only.  For goodput a request with
  output_len <= 1 counts as TPOT = 0 (vLLM keeps a separate `all_tpots` list for that).
  TPOT is per *token*, so with speculative decoding it uses the token count, not the chunk count.
* ITL = every gap between consecutive streamed chunks, pooled over all requests.  A chunk carries
  several tokens under speculative decoding, so ITL (per chunk) != TPOT (per token).
* duration = wall time of the benchmark: vLLM starts the clock just before dispatching the first
  request and stops it when the last response has finished (`benchmark_duration`).  Here it is
  `RunInfo.end_s - RunInfo.start_s` (first arrival to last completion, or to the run horizon).
  vLLM's clock also includes the first sampled inter-arrival gap; that is one gap in N and is
  not modelled.
* request throughput = completed / duration; output throughput = sum of output tokens of
  completed requests / duration; total token throughput = (input + output tokens of completed
  requests) / duration.  Only completed ("successful") requests enter any statistic.
* goodput = completed requests meeting *every* SLO threshold, per request, / duration.  vLLM's
  test is `slo >= value` (inclusive), so a value equal to the threshold meets it.
* percentiles use `np.percentile` with numpy's default (linear) method; p50 equals vLLM's median.
* per request class (`per_class`, runs with more than one `traffic.classes` name): every statistic
  above except ITL, on that class's requests with the same definitions and the run's duration;
  a class-qualified SLO (`ttft[support]:p99<1s`) is judged on its class, and in goodput a request
  must meet the unqualified SLOs and those naming its own class (vLLM has no classes: with none
  qualified this is vLLM's goodput).

Deviations from vLLM, on purpose: an empty metric reports None (vLLM reports 0 via
`np.mean(x or 0)`, which reads as a perfect latency); the SLO language is richer than vLLM's
`--goodput ttft:MS tpot:MS e2el:MS` (it names a statistic, units and a tok/s-per-user bound);
`queue_delay` (first scheduled - arrival) is the server-side queue time, which the client
cannot see.

The metric definitions are summarised in the project's modelling notes, section 4.1.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Union

import numpy as np

from capacity.errors import CapacityError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "RunInfo",
    "Slo",
    "Columns",
    "columns",
    "parse_slos",
    "per_request_frame",
    "summarize",
    "assess_stability",
    "mean_in_system",
    "in_system_at",
    "SLO_EXAMPLE",
]

SLO_EXAMPLE = "ttft:p99<1s;tpot:p90<40ms;e2e:p50<20s;tok_s_per_user:p10>20"

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
RATE_METRICS = ("tok_s_per_user",)
_METRIC_ALIASES = {"e2el": "e2e"}
_TIME_UNITS_MS = {"s": 1000.0, "ms": 1.0, "us": 1e-3}
# Metrics that have a per-request value, so they take part in goodput (vLLM allows ttft, tpot,
# e2el; tok_s_per_user is 1000/TPOT per request).  ITL is a pooled per-chunk quantity with no
# per-request value in vLLM, so an ITL SLO is checked in aggregate only.
_PER_REQUEST_METRICS = ("ttft", "tpot", "e2e", "tok_s_per_user")

_REQUIRED_COLUMNS = (
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "num_preemptions",
)

class Columns:
    """Per-request records as named numpy columns of one length: the few DataFrame operations the
    metrics need (a column by name, the rows of a boolean mask, adding a column), so the simulate
    path does not import pandas (about a third of a cold start). Any frame or mapping of columns is
    read through `columns()`."""

    __slots__ = ("_data", "_n")

    def __init__(self, data: Mapping[str, Any], n: int | None = None) -> None:
        if n is None:
            n = len(next(iter(data.values()))) if data else 0
        self._n = n
        self._data = {k: v if isinstance(v, np.ndarray) and v.ndim == 1 and len(v) == n
                      else np.full(n, v, dtype=object) if np.ndim(v) == 0 else np.asarray(v)
                      for k, v in data.items()}

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __getitem__(self, key: "str | np.ndarray") -> Any:
        if isinstance(key, str):
            return self._data[key]
        rows = {k: v[key] for k, v in self._data.items()}
        return Columns(rows, len(next(iter(rows.values()))) if rows else 0)

    def __setitem__(self, name: str, values: np.ndarray) -> None:
        self._data[name] = np.asarray(values)

    @property
    def names(self) -> list[str]:
        return list(self._data)

    def copy(self) -> "Columns":
        return Columns(dict(self._data), self._n)

    def to_frame(self) -> "pd.DataFrame":
        import pandas as pd                     # only here: a frame is built on demand
        return pd.DataFrame(self._data)


Requests = Union[Columns, "pd.DataFrame", Mapping[str, Any]]


def columns(requests: Requests) -> Columns:
    """`requests` (Columns, a pandas DataFrame or a mapping of column name to values) as Columns."""
    if isinstance(requests, Columns):
        return requests
    if hasattr(requests, "columns") and hasattr(requests, "to_numpy"):       # a pandas DataFrame
        return Columns({str(c): requests[c].to_numpy() for c in requests.columns}, len(requests))
    return Columns(dict(requests))


# Stability thresholds (assumptions, see `assess_stability`).
MIN_GROWTH_REQUESTS = 5.0
GROWTH_FRACTION_OF_MEAN = 0.25
MIN_THROUGHPUT_FRACTION = 0.95
MAX_UNFINISHED_FRACTION = 0.01
_GROWTH_GRID_POINTS = 1024


@dataclass(frozen=True, eq=False)
class RunInfo:
    """What the simulator knows about a run besides the per-request records.

    start_s: first arrival; end_s: last completion, or the run horizon if requests were cut off.
    offered_rate_rps: the open-loop arrival rate (all replicas), None for a closed loop.
    arrival_window_end_s: time of the last arrival (open loop); None falls back to the last
    arrival in the requests frame.
    t_s, waiting, running, kv_used_fraction: engine samples (waiting/running request counts and
    the used fraction 0..1 of the KV cache) at times t_s; may be empty.
    """

    start_s: float
    end_s: float
    num_gpus: int
    offered_rate_rps: float | None = None
    arrival_window_end_s: float | None = None
    t_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    waiting: np.ndarray = field(default_factory=lambda: np.empty(0))
    running: np.ndarray = field(default_factory=lambda: np.empty(0))
    kv_used_fraction: np.ndarray = field(default_factory=lambda: np.empty(0))

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and math.isfinite(self.end_s)):
            raise CapacityError(f"run start_s={self.start_s} and end_s={self.end_s} must be finite numbers")
        if self.end_s <= self.start_s:
            raise CapacityError(
                f"run end_s={self.end_s} is not after start_s={self.start_s}; the run must last a positive time"
            )
        if int(self.num_gpus) < 1:
            raise CapacityError(f"run num_gpus={self.num_gpus} must be at least 1")
        if self.offered_rate_rps is not None and not self.offered_rate_rps > 0:
            raise CapacityError(
                f"offered_rate_rps={self.offered_rate_rps} must be positive, or None for a closed loop"
            )
        lengths = {len(np.asarray(a)) for a in (self.t_s, self.waiting, self.running, self.kv_used_fraction)}
        if len(lengths) != 1:
            raise CapacityError(
                "run time series t_s, waiting, running, kv_used_fraction must have the same length"
            )


@dataclass(frozen=True)
class Slo:
    """One service-level objective.

    metric: "ttft" | "tpot" | "itl" | "e2e" | "tok_s_per_user"
    stat: "mean" | "min" | "max" | "pNN" (e.g. "p50", "p99", "p99.9")
    op: "<" (upper bound, latencies) or ">" (lower bound, tok_s_per_user); both inclusive as in
        vLLM's goodput test.
    threshold: milliseconds for latencies, tokens/s for tok_s_per_user.
    class_name: None (judged on every request) or the request class (`traffic.classes[].name`)
        whose requests alone it is judged on, e.g. `ttft[support]:p99<1s`.
    text: the SLO as the user wrote it (for reports).
    unit: the unit the user wrote the threshold in ("s", "ms", "us", "tok/s"), to print achieved
        values in it; for display only.
    """

    metric: str
    stat: str
    op: str
    threshold: float
    text: str = field(default="", compare=False)
    class_name: str | None = None
    unit: str = field(default="", compare=False)

    def __str__(self) -> str:
        if self.text:
            return self.text
        unit = "" if self.metric in RATE_METRICS else "ms"
        qualifier = f"[{self.class_name}]" if self.class_name is not None else ""
        return f"{self.metric}{qualifier}:{self.stat}{self.op}{self.threshold:g}{unit}"

    def holds(self, value: float) -> bool:
        """Whether a value meets the objective (inclusive, like vLLM's `slo >= value`)."""
        return bool(value <= self.threshold) if self.op == "<" else bool(value >= self.threshold)

    def display(self, value: float | None) -> str:
        """An achieved value (ms or tok/s, as `summarize` reports it) with its unit, in the unit the
        SLO was written in: `ttft:p99<1s` -> '0.812 s', `tpot:p90<15ms` -> '12.3 ms'."""
        if value is None:
            return "n/a"
        if self.metric in RATE_METRICS:
            return f"{value:.1f} tok/s"
        unit = self.unit if self.unit in _TIME_UNITS_MS else "ms"
        v = value / _TIME_UNITS_MS[unit]
        return f"{v:.3g} {unit}" if unit == "s" else f"{v:,.1f} {unit}"


_SLO_RE = re.compile(
    r"^(?P<metric>[a-z_0-9]+)\s*(?:\[(?P<cls>[^\[\]]*)\]\s*)?:\s*(?P<stat>[a-z][a-z0-9.]*)\s*(?P<op>[<>]=?)\s*"
    r"(?P<num>[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(?P<unit>[a-z/]*)$",
    re.IGNORECASE,
)


def _parse_stat(stat: str) -> str | None:
    if stat in ("mean", "min", "max"):
        return stat
    if stat == "median":
        return "p50"
    if stat.startswith("p"):
        try:
            q = float(stat[1:])
        except ValueError:
            return None
        if 0.0 <= q <= 100.0:
            return stat
    return None


def parse_slos(text: str) -> list[Slo]:
    """Parse SLOs such as "ttft:p99<1s;tpot:p90<40ms;e2e:p50<20s;tok_s_per_user:p10>20".

    Items are separated by ';' or ','.  Each is METRIC:STAT<VALUE UNIT for latencies (ttft,
    tpot, itl, e2e; alias e2el) with UNIT s, ms or us (write the unit; a bare number is still read
    as ms, as in vLLM's --goodput), or tok_s_per_user:STAT>VALUE in tokens/s (unit tok/s
    optional).  STAT is mean, min, max, median or pNN.  '<=' and '>=' are accepted and mean the
    same as '<' and '>' (all bounds are inclusive).  Metric, statistic and unit are
    case-insensitive.

    Per request class: METRIC[CLASS]:STAT<VALUE UNIT, e.g. "ttft[support]:p99<1s", is judged on
    the requests of traffic class CLASS (`traffic.classes[].name`, case-sensitive, written
    without ';', ',', '[' or ']') only; an unqualified SLO is judged on all requests.  For goodput
    a request counts as good when it meets every unqualified SLO and every SLO qualified with its
    own class.  `summarize` refuses a class the run's requests do not have.  ITL SLOs cannot be
    qualified: ITL gaps are pooled over all requests and not recorded per request.
    """
    if not isinstance(text, str) or not text.strip():
        raise CapacityError(f"no SLOs given; write them like '{SLO_EXAMPLE}'")
    slos: list[Slo] = []
    for raw in re.split(r"[;,\n]", text):
        part = raw.strip()
        if not part:
            continue
        slos.append(_parse_one_slo(part))
    if not slos:
        raise CapacityError(f"no SLOs given; write them like '{SLO_EXAMPLE}'")
    return slos


def _parse_one_slo(part: str) -> Slo:
    def bad(why: str) -> CapacityError:
        return CapacityError(f"bad SLO '{part}': {why}; write SLOs like '{SLO_EXAMPLE}'")

    m = _SLO_RE.match(part)
    if m is None:
        raise bad("expected METRIC:STAT<VALUE UNIT or METRIC[CLASS]:STAT<VALUE UNIT, e.g. ttft:p99<1s")
    raw_metric = m["metric"].lower()
    metric = _METRIC_ALIASES.get(raw_metric, raw_metric)
    if metric not in LATENCY_METRICS + RATE_METRICS:
        raise bad(f"unknown metric '{raw_metric}' (use ttft, tpot, itl, e2e or tok_s_per_user)")
    class_name = None if m["cls"] is None else m["cls"].strip()
    if class_name is not None and not class_name:
        raise bad("empty request class in [] (name one of traffic.classes, e.g. ttft[support]:p99<1s)")
    if class_name is not None and metric not in _PER_REQUEST_METRICS:
        raise bad(f"{metric} cannot be judged per request class: its gaps are pooled over all requests")
    stat = _parse_stat(m["stat"].lower())
    if stat is None:
        raise bad(f"unknown statistic '{m['stat'].lower()}' (use mean, min, max, median or pNN with NN in 0..100)")
    op = m["op"][0]
    value = float(m["num"])
    unit = m["unit"].lower()
    if metric in LATENCY_METRICS:
        if op != "<":
            raise bad(f"{metric} is a latency, so its SLO is an upper bound: use '<'")
        if unit == "":
            unit = "ms"
        if unit not in _TIME_UNITS_MS:
            raise bad(f"unknown time unit '{unit}' (use s, ms or us)")
        threshold = value * _TIME_UNITS_MS[unit]
    else:
        if op != ">":
            raise bad(f"{metric} is a rate, so its SLO is a lower bound: use '>'")
        if unit not in ("", "tok/s"):
            raise bad(f"{metric} takes a plain number in tokens/s, not '{unit}'")
        threshold = value
    if not (threshold > 0 and math.isfinite(threshold)):
        raise bad("the threshold must be a positive number")
    return Slo(metric=metric, stat=stat, op=op, threshold=threshold, text=part, class_name=class_name,
               unit=unit if metric in LATENCY_METRICS else "tok/s")


def _check_requests(requests: Columns) -> None:
    missing = [c for c in _REQUIRED_COLUMNS if c not in requests]
    if missing:
        raise CapacityError(f"requests frame lacks columns {missing}; the simulator must record them")
    if len(requests) == 0:
        raise CapacityError("the run produced no requests; raise the horizon or the request rate")
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    if np.isnan(arrival).all():
        raise CapacityError("no request was sent (all arrival_s are NaN); raise the horizon or the request rate")
    finish = np.asarray(requests["finish_s"], dtype=float)
    first = np.asarray(requests["first_token_s"], dtype=float)
    done = ~np.isnan(finish)
    out_of_order = done & (np.isnan(first) | (first < arrival) | (finish < first))
    if out_of_order.any():
        i = int(np.flatnonzero(out_of_order)[0])
        rid = requests["request_id"][i] if "request_id" in requests else i
        raise CapacityError(
            f"request {rid} has timestamps out of order (need arrival <= first token <= finish); "
            "this is a simulator bug"
        )


def _sent(requests: Columns) -> Columns:
    """Requests that were sent (arrival_s known); a closed loop cut at its horizon leaves the
    rest unsent, and like vLLM's client we do not count requests that were never issued."""
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    return requests if not np.isnan(arrival).any() else requests[~np.isnan(arrival)]


def per_request_frame(requests: "pd.DataFrame") -> "pd.DataFrame":
    """Copy of the `requests` frame with per-request metrics added (NaN where a metric is undefined):
    `per_request` as a DataFrame."""
    df = requests.copy()
    added = per_request(columns(requests))
    for name in _PER_REQUEST_COLUMNS:
        df[name] = added[name]
    return df


_PER_REQUEST_COLUMNS = ("completed", "ttft_ms", "tpot_ms", "e2e_ms", "queue_delay_ms", "tok_s_per_user")


def per_request(requests: Requests) -> Columns:
    """Copy of `requests` with per-request metrics added (NaN where a metric is undefined).

    ttft_ms = first_token - arrival; e2e_ms = finish - arrival;
    tpot_ms = (e2e - ttft) / (output_tokens - 1), only for finished requests with more than one
    output token (vLLM `calculate_metrics`); queue_delay_ms = first_scheduled - arrival;
    tok_s_per_user = 1000 / tpot_ms; completed = finish_s is known.
    """
    df = columns(requests).copy()
    _check_requests(df)
    arrival = np.asarray(df["arrival_s"], dtype=float)
    first = np.asarray(df["first_token_s"], dtype=float)
    finish = np.asarray(df["finish_s"], dtype=float)
    out = np.asarray(df["output_tokens"], dtype=float)
    completed = ~np.isnan(finish)
    ttft_ms = (first - arrival) * 1000.0
    e2e_ms = (finish - arrival) * 1000.0
    has_tpot = completed & (out > 1)
    tpot_ms = np.full(len(df), np.nan)
    tpot_ms[has_tpot] = (e2e_ms[has_tpot] - ttft_ms[has_tpot]) / (out[has_tpot] - 1.0)
    with np.errstate(divide="ignore"):
        tok_s = np.where(has_tpot, 1000.0 / np.where(has_tpot, tpot_ms, 1.0), np.nan)
    df["completed"] = completed
    df["ttft_ms"] = ttft_ms
    df["tpot_ms"] = tpot_ms
    df["e2e_ms"] = e2e_ms
    df["queue_delay_ms"] = (np.asarray(df["first_scheduled_s"], dtype=float) - arrival) * 1000.0
    df["tok_s_per_user"] = tok_s
    return df


def _stat(values: np.ndarray, stat: str) -> float | None:
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    if stat == "mean":
        return float(np.mean(values))
    if stat == "min":
        return float(np.min(values))
    if stat == "max":
        return float(np.max(values))
    return float(np.percentile(values, float(stat[1:])))


def _stats(values: np.ndarray, stats: tuple[str, ...]) -> dict[str, float | None]:
    values = np.asarray(values, dtype=float)
    percentiles = [s for s in stats if s.startswith("p")]
    if values.size == 0 or len(percentiles) < 2:
        return {s: _stat(values, s) for s in stats}
    # one np.percentile call for all of them (one partition of the values instead of one each; the
    # same order statistics and interpolation, so the same numbers)
    at = np.percentile(values, [float(s[1:]) for s in percentiles])
    found = dict(zip(percentiles, at.tolist()))
    return {s: found[s] if s in found else _stat(values, s) for s in stats}


# The warm-up left out of steady-state figures (the plan's SLO verdicts too): the first tenth of arrivals,
# while the replicas fill (assumed; studies/plan.py states the reasoning with `evidence_requests`)
STEADY_WARMUP_FRACTION = 0.1


def offered_until_s(requests: Requests) -> float:
    """When the traffic stops arriving at its planned rate: the last arrival, or for conversations
    (a `follows` column) the last conversation's start, after which only later turns of fewer and
    fewer sessions come. NaN without arrivals."""
    df = columns(requests)
    arrival = np.asarray(df["arrival_s"], dtype=float)
    if "follows" in df:
        arrival = arrival[np.asarray(df["follows"]) < 0]
    arrival = arrival[~np.isnan(arrival)]
    return float(arrival.max()) if arrival.size else float("nan")


def steady_window(requests: Requests, num_gpus: int) -> dict[str, Any]:
    """Rates at the offered load, over the window from the arrival that ends the warm-up (the first
    STEADY_WARMUP_FRACTION of arrivals) to the last arrival (for conversations the last first turn:
    later turns then come from fewer and fewer sessions), counting what completes inside it: in a
    stable run these are the traffic's own rates. vLLM's whole-run rates divide by the duration to the
    last completion, which for conversations includes the tail of the longest sessions' later turns at
    a trickle of load (not a vLLM definition: `vllm bench serve` reports the whole-run ones)."""
    df = columns(requests)
    arrival = np.sort(np.asarray(df["arrival_s"], dtype=float))
    arrival = arrival[~np.isnan(arrival)]
    if arrival.size < 2:
        return {"window_s": None, "request_throughput_rps": None, "output_throughput_tok_s_per_gpu": None,
                "goodput_rps": None}
    t0, t1 = float(arrival[int(arrival.size * STEADY_WARMUP_FRACTION)]), offered_until_s(df)
    out = {"window_s": [t0, t1], "request_throughput_rps": None, "output_throughput_tok_s_per_gpu": None,
           "goodput_rps": None}
    if t1 <= t0:
        return out
    done = _completed(df)
    finish = np.asarray(done["finish_s"], dtype=float)
    inside = (finish >= t0) & (finish <= t1)
    span = t1 - t0
    out["request_throughput_rps"] = float(inside.sum()) / span
    out["output_throughput_tok_s_per_gpu"] = float(np.asarray(done["output_tokens"], dtype=float)[inside].sum()) / span / max(num_gpus, 1)
    return out


def _completed(df: Columns) -> Columns:
    """The completed requests of a `per_request` table."""
    return df[np.asarray(df["completed"], dtype=bool)]


def _fill_nan(values: Any, fill: float) -> np.ndarray:
    """A float column with its NaNs replaced by `fill` (pandas' fillna)."""
    v = np.asarray(values, dtype=float)
    return np.where(np.isnan(v), fill, v)


def _steady_rate(done: Columns, good: np.ndarray, steady: dict[str, Any]) -> float | None:
    """Requests meeting every SLO that complete inside the steady window, per second."""
    if not steady.get("window_s") or steady["request_throughput_rps"] is None:
        return None
    t0, t1 = steady["window_s"]
    finish = np.asarray(done["finish_s"], dtype=float)
    return float(np.sum(good & (finish >= t0) & (finish <= t1))) / (t1 - t0)


def _series_stats(t_s: np.ndarray, x: np.ndarray) -> dict[str, float | None]:
    """Time-weighted mean (each sample holds until the next) and max of a sampled series.

    If t_s is not sorted (e.g. per-replica series concatenated) the mean is the plain sample
    mean, i.e. a per-replica average rather than a cluster total."""
    t = np.asarray(t_s, dtype=float)
    v = np.asarray(x, dtype=float)
    if v.size == 0:
        return {"mean": None, "max": None}
    span = t[-1] - t[0] if t.size else 0.0
    if v.size == 1 or span <= 0 or np.any(np.diff(t) < 0):
        # one sample, or several series merged without sorting: plain sample mean
        mean = float(np.mean(v))
    else:
        # about the first sample, so a constant series' mean is exactly the constant
        mean = float(v[0] + np.sum((v[:-1] - v[0]) * np.diff(t)) / span)
    return {"mean": mean, "max": float(np.max(v))}


def in_system_at(requests: Requests, t_s: np.ndarray) -> np.ndarray:
    """Number of requests in the system (arrived, not finished) at each time in t_s.

    A request is in the system on [arrival_s, finish_s); an unfinished request (NaN finish) stays
    in the system.  Vectorised with searchsorted on the sorted arrival and finish times.
    """
    t = np.asarray(t_s, dtype=float)
    requests = _sent(columns(requests))
    arrivals = np.sort(np.asarray(requests["arrival_s"], dtype=float))
    finishes = np.asarray(requests["finish_s"], dtype=float)
    finishes = np.sort(finishes[~np.isnan(finishes)])
    arrived = np.searchsorted(arrivals, t, side="right")
    left = np.searchsorted(finishes, t, side="right")
    return (arrived - left).astype(float)


def mean_in_system(requests: Requests, t0: float, t1: float) -> float:
    """Time-average number of requests in the system over [t0, t1] (exact, not sampled).

    Integral of the in-system count = sum over requests of the overlap of [arrival, finish) with
    [t0, t1]; unfinished requests count as in the system until t1.  For Little's law
    (L = lambda * W) checks.
    """
    if not t1 > t0:
        raise CapacityError(f"mean_in_system needs t1 > t0, got t0={t0}, t1={t1}")
    requests = _sent(columns(requests))
    arrival = np.asarray(requests["arrival_s"], dtype=float)
    finish = np.asarray(requests["finish_s"], dtype=float)
    finish = np.where(np.isnan(finish), np.inf, finish)
    overlap = np.minimum(finish, t1) - np.maximum(arrival, t0)
    return float(np.sum(np.clip(overlap, 0.0, None)) / (t1 - t0))


def assess_stability(requests: Requests, run: RunInfo) -> tuple[bool, str]:
    """Decide whether the run reached a steady state or its queue grows without bound.

    Open loop (run.offered_rate_rps set): over the second half H of [start_s,
    arrival_window_end_s] fit a least-squares line to the in-system count sampled on a uniform
    grid; growth = slope * |H|.  Unstable when growth > max(5, 25 % of the mean in-system count
    over H) AND the completion rate over the arrival window (requests finished inside it / its
    length) is below 95 % of offered_rate_rps.  Any run (open or closed loop) is also unstable
    when more than 1 % of requests had not finished by end_s.  A closed loop is otherwise
    stable: its in-system count is bounded by the concurrency.

    Thresholds (ASSUMPTIONS, to be calibrated):
    * second half only: the first half holds the fill-up transient from an empty system;
    * growth floor 5 requests: a stable queue fluctuates by a few requests (M/M/1 at rho=0.7
      has mean 2.3 in system), so a fitted rise below 5 is noise;
    * 25 % of the mean: a stable system's in-system count fluctuates around its mean, a
      fitted rise by a quarter of it across half a window is a trend, not noise;
    * 95 % throughput: completions in the window plus the mean in-system count L of its second
      half (the requests a stable server still holds when arrivals stop), per second; a server
      that truly keeps up is within 5 % of the offered rate, an overloaded one falls short by
      (lambda - mu)/lambda.  Requiring both
      criteria keeps a short transient (growth that the server still absorbs) from being
      called unstable;
    * 1 % unfinished: a drained stable run leaves none; a horizon cut leaves about L of N.
    """
    requests = columns(requests)
    _check_requests(requests)
    requests = _sent(requests)
    n = len(requests)
    finish = np.asarray(requests["finish_s"], dtype=float)
    unfinished = int(np.sum(np.isnan(finish) | (finish > run.end_s)))
    unfinished_frac = unfinished / n
    notes: list[str] = []
    stable = True
    if unfinished_frac > MAX_UNFINISHED_FRACTION:
        stable = False
        notes.append(
            f"{unfinished} of {n} requests ({100 * unfinished_frac:.1f} %) had not finished by "
            f"t={run.end_s:g} s (limit {100 * MAX_UNFINISHED_FRACTION:g} %)"
        )

    if run.offered_rate_rps is None:
        if stable:
            return True, (
                f"stable: closed loop (in-system count bounded by concurrency); "
                f"{unfinished} of {n} requests unfinished"
            )
        return False, "unstable: " + "; ".join(notes) + "; lower the load or add replicas"

    t0 = run.start_s
    t1 = run.arrival_window_end_s
    if t1 is None:
        t1 = float(np.max(np.asarray(requests["arrival_s"], dtype=float)))
    if t1 > t0:
        mid = 0.5 * (t0 + t1)
        grid = np.linspace(mid, t1, _GROWTH_GRID_POINTS)
        counts = in_system_at(requests, grid)
        dt = grid - grid.mean()
        slope = float(np.sum(dt * (counts - counts.mean())) / np.sum(dt * dt))
        growth = slope * (t1 - mid)
        mean_l = mean_in_system(requests, mid, t1)
        growth_limit = max(MIN_GROWTH_REQUESTS, GROWTH_FRACTION_OF_MEAN * mean_l)
        done_in_window = int(np.sum((finish >= t0) & (finish <= t1)))
        # requests still in flight at the end of the window are not a deficit: a stable server
        # holds about its mean in-system count L then, so credit L (Little's law) before comparing
        throughput = (done_in_window + mean_l) / (t1 - t0)
        frac = throughput / run.offered_rate_rps
        grows = growth > growth_limit
        lags = frac < MIN_THROUGHPUT_FRACTION
        trend = (
            f"in-system count grew by {growth:.1f} over the second half of the arrival window "
            f"(limit {growth_limit:.1f}, mean {mean_l:.1f}); completed {throughput:.3g} rps = "
            f"{100 * frac:.0f} % of offered {run.offered_rate_rps:.3g} rps "
            f"(limit {100 * MIN_THROUGHPUT_FRACTION:.0f} %)"
        )
        if grows and lags:
            stable = False
            notes.insert(0, "queue grows without bound: " + trend)
        elif grows:
            trend += "; the rise exceeds its limit but completions keep up: a transient, run longer to confirm"
    else:
        trend = "arrival window too short to measure a trend"
    if stable:
        return True, f"stable: {trend}; {unfinished} of {n} requests unfinished"
    return False, "unstable: " + "; ".join(notes) + "; lower the request rate or add replicas"


def _json_float(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


_LAT_STATS = ("mean", "p50", "p90", "p99")
_USER_STATS = ("mean", "p10", "p50", "p90")


def _request_values(done: Columns) -> dict[str, np.ndarray]:
    """The per-request samples each statistic is taken over (completed requests; TPOT and
    tok_s_per_user only those with more than one output token)."""
    tpot = np.asarray(done["tpot_ms"], dtype=float)
    has_tpot = ~np.isnan(tpot)
    return {
        "ttft": np.asarray(done["ttft_ms"], dtype=float),
        "tpot": tpot[has_tpot],
        "e2e": np.asarray(done["e2e_ms"], dtype=float),
        "queue_delay": np.asarray(done["queue_delay_ms"], dtype=float),
        "tok_s_per_user": np.asarray(done["tok_s_per_user"], dtype=float)[has_tpot],
    }


def _request_stats(df: Columns, duration_s: float, num_gpus: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The statistics that follow from the per-request records alone, with one definition for a
    whole run and for one request class (`df`: sent, not refused requests, `per_request_frame`d;
    throughputs over the run's `duration_s` and all its `num_gpus`, so a run's per-class
    throughputs add up to its own).  Returns (statistics, the samples they were taken over)."""
    done = _completed(df)
    completed = int(len(done))
    total_in = int(done["prompt_tokens"].sum())
    total_out = int(done["output_tokens"].sum())
    values = _request_values(done)
    out_tput = total_out / duration_s
    tot_tput = (total_in + total_out) / duration_s
    median_tpot = _stat(values["tpot"], "p50")
    stats: dict[str, Any] = {
        "num_requests": int(len(df)),
        "completed": completed,
        "unfinished": int(len(df)) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput_rps": completed / duration_s,
        "output_throughput_tok_s": out_tput,
        "total_throughput_tok_s": tot_tput,
        "output_throughput_tok_s_per_gpu": out_tput / num_gpus,
        "total_throughput_tok_s_per_gpu": tot_tput / num_gpus,
        "ttft_ms": _stats(values["ttft"], _LAT_STATS),
        "tpot_ms": _stats(values["tpot"], _LAT_STATS),
        "e2e_ms": _stats(values["e2e"], _LAT_STATS),
        "queue_delay_ms": _stats(values["queue_delay"], _LAT_STATS),
        "tok_s_per_user": _stats(values["tok_s_per_user"], _USER_STATS),
        "tok_s_per_user_at_median_tpot": (
            1000.0 / median_tpot if median_tpot is not None and median_tpot > 0 else None
        ),
        "preemptions": int(df["num_preemptions"].sum()),
    }
    return stats, values


def _class_names(requests: Columns) -> list[str]:
    """The request classes of a run, in order of first appearance (every request, refused and
    unsent ones included)."""
    if "class_name" not in requests:
        return []
    return list(dict.fromkeys(_as_str(requests["class_name"]).tolist()))


def _as_str(values: np.ndarray) -> np.ndarray:
    """A column's values as Python strings (an object array), as pandas' astype(str) gives them."""
    return np.array([str(v) for v in values.tolist()], dtype=object)


def _check_slo_classes(slos: list[Slo], names: list[str]) -> None:
    for slo in slos:
        if slo.class_name is not None and slo.class_name not in names:
            have = ", ".join(repr(n) for n in names if n) or "none (the traffic has no named classes)"
            raise CapacityError(
                f"SLO '{slo}' names request class '{slo.class_name}', but no request of the run is of that "
                f"class (traffic.classes[].name); the run's classes: {have}")


def summarize(
    requests: Requests,
    itl_s: np.ndarray,
    run: RunInfo,
    slos: list[Slo] | None = None,
) -> dict[str, Any]:
    """Summarise a run with `vllm bench serve` metrics; JSON-serialisable (NaN/inf -> None).

    Latency statistics are over completed requests (TPOT and tok_s_per_user over completed
    requests with more than one output token); ITL over `itl_s`, which should hold the chunk gaps
    of completed requests (vLLM pools only successful requests' ITLs).  Aggregate SLOs are
    checked on their stated statistic; goodput applies every per-request SLO threshold to each
    completed request (ITL SLOs have no per-request value and are checked in aggregate only).
    A class-qualified SLO (`ttft[support]:p99<1s`, see `parse_slos`) is checked on that class's
    requests only, and in goodput applies to that class's requests only; its row carries
    `"class"`.  `slo_met` is False whenever the run is unstable: its statistics describe a
    transient, not a steady state.

    With more than one request class (the frame's `class_name` column), `per_class` maps each
    class (in order of first appearance) to the same statistics computed on its requests alone
    (`_request_stats`: the run's duration and GPUs as denominators), plus `failed`,
    `goodput_rps` (its requests that are good under the SLOs that apply to them, per second: the
    classes' goodputs add up to the run's), `slo` (the rows of the SLOs qualified with that class)
    and `slo_met` (None when no SLO names the class).  There is no per-class ITL: `itl_s` pools
    the chunk gaps of all requests without saying whose they are, so it cannot be split exactly.
    A one-class run has no `per_class` key.
    """
    requests = columns(requests)
    names = _class_names(requests)
    if slos:
        _check_slo_classes(slos, names)
    failed = 0
    refused = None
    all_requests = requests
    if "rejected" in requests:          # refused by the server: outside every statistic (vllm bench serve)
        refused = np.asarray(requests["rejected"], dtype=bool)
        failed = int(refused.sum())
        if failed:
            requests = requests[~refused]
    df = _sent(per_request(requests))
    duration_s = float(run.end_s - run.start_s)
    base, values = _request_stats(df, duration_s, run.num_gpus)
    done = _completed(df)
    completed = base["completed"]
    itl_ms = np.asarray(itl_s, dtype=float).ravel() * 1000.0
    itl_ms = itl_ms[~np.isnan(itl_ms)]
    values["itl"] = itl_ms
    stable, note = assess_stability(requests, run)

    result: dict[str, Any] = {
        "num_requests": base["num_requests"],
        "not_sent": int(len(requests) - len(df)),
        "completed": completed,
        "unfinished": base["unfinished"],
        "failed": failed,
        "duration_s": duration_s,
        **{k: base[k] for k in ("total_input_tokens", "total_output_tokens", "request_throughput_rps",
                                "output_throughput_tok_s", "total_throughput_tok_s",
                                "output_throughput_tok_s_per_gpu", "total_throughput_tok_s_per_gpu",
                                "ttft_ms", "tpot_ms")},
        "itl_ms": _stats(values["itl"], _LAT_STATS),
        **{k: base[k] for k in ("e2e_ms", "queue_delay_ms", "tok_s_per_user", "tok_s_per_user_at_median_tpot")},
        "goodput_rps": None,
        "slo": [],
        "slo_met": None,
        "kv_utilisation": _series_stats(run.t_s, run.kv_used_fraction),
        "running": _series_stats(run.t_s, run.running),
        "waiting": _series_stats(run.t_s, run.waiting),
        "preemptions": base["preemptions"],
        "stable": stable,
        "stability_note": note,
        "steady": steady_window(df, run.num_gpus),
    }

    per_class = len(names) > 1
    done_class = _as_str(done["class_name"]) if "class_name" in done else None
    class_values: dict[str, dict[str, np.ndarray]] = {}
    class_stats: dict[str, dict[str, Any]] = {}
    if per_class or (slos and any(s.class_name is not None for s in slos)):
        df_class = _as_str(df["class_name"])
        for name in names:
            class_stats[name], class_values[name] = _request_stats(df[df_class == name], duration_s, run.num_gpus)

    good = None
    rows = []
    if slos:
        good = np.ones(completed, dtype=bool)
        # vLLM `all_tpots`: a request with <= 1 output token has TPOT 0 for goodput.
        per_req = {
            "ttft": np.asarray(done["ttft_ms"], dtype=float),
            "tpot": _fill_nan(done["tpot_ms"], 0.0),
            "e2e": np.asarray(done["e2e_ms"], dtype=float),
            "tok_s_per_user": _fill_nan(done["tok_s_per_user"], np.inf),
        }
        for slo in slos:
            if slo.class_name is None:
                judged = values
            else:
                judged = class_values[slo.class_name]
            if slo.metric in _PER_REQUEST_METRICS:
                v = per_req[slo.metric]
                ok = (v <= slo.threshold) if slo.op == "<" else (v >= slo.threshold)
                # a qualified SLO leaves the other classes' requests as they are
                good &= ok if slo.class_name is None else (ok | (done_class != slo.class_name))
            achieved = _stat(judged[slo.metric], slo.stat)
            met = achieved is not None and slo.holds(achieved)
            row = {"slo": str(slo), "achieved": _json_float(achieved), "threshold": slo.threshold, "met": met}
            if slo.class_name is not None:
                row["class"] = slo.class_name
            rows.append(row)
        result["goodput_rps"] = int(np.sum(good)) / duration_s
        result["steady"]["goodput_rps"] = _steady_rate(done, good, result["steady"])
        result["slo"] = rows
        result["slo_met"] = bool(all(r["met"] for r in rows) and stable)

    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_delay_ms", "tok_s_per_user",
                "kv_utilisation", "running", "waiting"):
        result[key] = {k: _json_float(v) for k, v in result[key].items()}
    result["tok_s_per_user_at_median_tpot"] = _json_float(result["tok_s_per_user_at_median_tpot"])

    if per_class:
        refused_class = (_as_str(all_requests["class_name"])[refused]
                         if refused is not None and failed else np.empty(0, dtype=object))
        blocks: dict[str, Any] = {}
        for name in names:
            st = class_stats[name]
            block: dict[str, Any] = {
                **{k: st[k] for k in ("num_requests", "completed", "unfinished")},
                "failed": int(np.sum(refused_class == name)),
                **{k: st[k] for k in st if k not in ("num_requests", "completed", "unfinished")},
                "goodput_rps": None,
                "slo": [],
                "slo_met": None,
            }
            for key in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_delay_ms", "tok_s_per_user"):
                block[key] = {k: _json_float(v) for k, v in block[key].items()}
            block["tok_s_per_user_at_median_tpot"] = _json_float(block["tok_s_per_user_at_median_tpot"])
            if good is not None:
                block["goodput_rps"] = int(np.sum(good & (done_class == name))) / duration_s
                block["slo"] = [r for r in rows if r.get("class") == name]
                if block["slo"]:
                    block["slo_met"] = bool(all(r["met"] for r in block["slo"]) and stable)
            blocks[name] = block
        result["per_class"] = blocks
    return result


def flatten_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`summarize`'s nested metrics as one flat row: ttft_ms.p99 -> ttft_ms_p99 (per-SLO detail lists left out:
    their verdicts are in slo_met). A sweep's result row and the notebook API's metrics frame."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_metrics(value, f"{name}_"))
        elif isinstance(value, (list, tuple)):
            continue  # per-SLO details: their verdicts are in slo_met, their values in the statistics
        else:
            out[name] = value
    return out
