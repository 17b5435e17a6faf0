"""Tests for capacity.inputs.traffic against independent truth: distribution moments, closed forms from
vLLM's benchmark code, and the trace statistics published in the traces README / trace_stats.csv.
"""

from __future__ import annotations

import csv
import hashlib
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.inputs.traffic import (
    ClosedLoop,
    EmpiricalLength,
    FixedLength,
    GammaArrivals,
    LognormalLength,
    PoissonArrivals,
    RangeRatioLength,
    RequestClass,
    TraceArrivals,
    TrafficConfig,
    UniformLength,
    build_requests,
    read_trace,
    resolve_trace,
    sample_lengths,
    shipped_traces,
)

FIRST500 = Path(__file__).parent / "data" / "azure2023_conv_first500.csv"
SHIPPED = data_dir() / "traces"
Z = 5.0  # tolerance in standard errors for the statistical tests


def one_class(input_tokens=None, output_tokens=None, name="c") -> dict:
    return {"name": name,
            "input_tokens": input_tokens or {"dist": "fixed", "value": 100},
            "output_tokens": output_tokens or {"dist": "fixed", "value": 10}}


def gaps_of(arrival_s: np.ndarray) -> np.ndarray:
    """Inter-arrival gaps including the first one from t = 0 (vLLM starts the clock at 0)."""
    return np.diff(np.concatenate([[0.0], arrival_s]))


def gamma_cv_standard_error(shape: float, n: int) -> float:
    """Delta-method standard error of the sample CV (std/mean) of n Gamma(shape) draws.

    Var(cv_hat) ~ (s^4/m^4 + (mu4 - s^4)/(4 s^2 m^2) - mu3/m^3) / n with the gamma moments
    (scale 1): m = k, s^2 = k, mu3 = 2k, mu4 = 3k^2 + 6k.
    """
    k = shape
    m, var, mu3, mu4 = k, k, 2 * k, 3 * k * k + 6 * k
    v = (var**2 / m**4 + (mu4 - var**2) / (4 * var * m**2) - mu3 / m**3) / n
    return math.sqrt(v)


# ---------------------------------------------------------------------------------------------
# Arrivals
# ---------------------------------------------------------------------------------------------


def test_poisson_interarrival_mean_and_cv() -> None:
    n, rate = 40_000, 8.0
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=rate, vllm_rescale=False),
                        classes=[RequestClass(**one_class())], num_requests=n)
    gaps = gaps_of(build_requests(cfg, np.random.default_rng(11)).arrival_s)
    # Exponential(rate): mean 1/rate, sd 1/rate, so the mean's standard error is 1/(rate*sqrt(n)).
    assert abs(gaps.mean() - 1 / rate) < Z / (rate * math.sqrt(n))
    cv = gaps.std() / gaps.mean()
    assert abs(cv - 1.0) < Z * gamma_cv_standard_error(1.0, n)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 4.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness: float) -> None:
    n, rate = 50_000, 3.0
    cfg = TrafficConfig(arrival=GammaArrivals(rate_rps=rate, burstiness=burstiness, vllm_rescale=False),
                        classes=[RequestClass(**one_class())], num_requests=n)
    arrival = build_requests(cfg, np.random.default_rng(5)).arrival_s
    gaps = gaps_of(arrival)
    cv = gaps.std() / gaps.mean()
    assert abs(cv - 1 / math.sqrt(burstiness)) < Z * gamma_cv_standard_error(burstiness, n)
    # Mean rate: n arrivals over the last arrival time; relative standard error cv/sqrt(n).
    measured_rate = n / arrival[-1]
    assert abs(measured_rate / rate - 1) < Z * (1 / math.sqrt(burstiness)) / math.sqrt(n)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 3.0])
def test_vllm_rescale_puts_last_arrival_at_n_over_rate(burstiness: float) -> None:
    # vllm/benchmarks/serve.py get_request: target_total_delay_s = total_requests / request_rate.
    n, rate = 2_000, 4.0
    cfg = TrafficConfig(arrival=GammaArrivals(rate_rps=rate, burstiness=burstiness),
                        classes=[RequestClass(**one_class())], num_requests=n)
    arrival = build_requests(cfg, np.random.default_rng(3)).arrival_s
    assert arrival[-1] == pytest.approx(n / rate, rel=1e-12)
    assert arrival[0] > 0  # vLLM's first request waits one gap
    assert np.all(np.diff(arrival) >= 0)
    # Rescaling multiplies every gap by one factor, so the CV keeps its value.
    gaps = gaps_of(arrival)
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < Z * gamma_cv_standard_error(burstiness, n)


def test_poisson_is_gamma_with_burstiness_one() -> None:
    classes = [RequestClass(**one_class())]
    a = build_requests(TrafficConfig(arrival=PoissonArrivals(rate_rps=2.0), classes=classes, num_requests=500),
                       np.random.default_rng(9))
    b = build_requests(TrafficConfig(arrival=GammaArrivals(rate_rps=2.0, burstiness=1.0), classes=classes,
                                     num_requests=500), np.random.default_rng(9))
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)


def test_infinite_burstiness_gives_constant_gaps() -> None:
    # YAML's `.inf` loads as float("inf").
    cfg = TrafficConfig.model_validate({"arrival": {"process": "gamma", "rate_rps": 4, "burstiness": math.inf},
                                        "classes": [one_class()], "num_requests": 20})
    arrival = build_requests(cfg, np.random.default_rng(0)).arrival_s
    np.testing.assert_allclose(arrival, np.arange(1, 21) / 4.0, rtol=1e-12)


def test_infinite_rate_sends_everything_at_zero() -> None:
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=math.inf), classes=[RequestClass(**one_class())],
                        num_requests=50)
    stream = build_requests(cfg, np.random.default_rng(0))
    assert len(stream) == 50 and np.all(stream.arrival_s == 0.0)


def test_duration_only_poisson_count() -> None:
    rate, duration = 20.0, 500.0
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=rate), classes=[RequestClass(**one_class())],
                        duration_s=duration)
    arrival = build_requests(cfg, np.random.default_rng(4)).arrival_s
    expected = rate * duration  # Poisson count: mean = variance = rate*duration
    assert abs(len(arrival) - expected) < Z * math.sqrt(expected)
    assert arrival.max() < duration and np.all(np.diff(arrival) >= 0)


def test_duration_cuts_a_fixed_count() -> None:
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=10.0), classes=[RequestClass(**one_class())],
                        num_requests=1000, duration_s=50.0)
    arrival = build_requests(cfg, np.random.default_rng(4)).arrival_s
    # 1000 requests rescaled to end at 100 s; the first 50 s hold about half of them.
    assert arrival.max() < 50.0
    assert abs(len(arrival) - 500) < Z * math.sqrt(1000 * 0.25)


def test_closed_loop_stream() -> None:
    cfg = TrafficConfig(arrival=ClosedLoop(concurrency=8), classes=[RequestClass(**one_class())],
                        num_requests=100)
    stream = build_requests(cfg, np.random.default_rng(0))
    assert len(stream) == 100 and stream.concurrency == 8
    assert np.all(np.isnan(stream.arrival_s))
    assert np.all(stream.prompt_tokens == 100) and np.all(stream.output_tokens == 10)


# ---------------------------------------------------------------------------------------------
# Classes and lengths
# ---------------------------------------------------------------------------------------------


def test_class_mix_follows_weights() -> None:
    weights = [1.0, 2.0, 7.0]
    n = 50_000
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=100.0),
                        classes=[RequestClass(**one_class(name=f"k{i}"), weight=w) for i, w in enumerate(weights)],
                        num_requests=n)
    stream = build_requests(cfg, np.random.default_rng(21))
    assert stream.class_names == ["k0", "k1", "k2"]
    counts = np.bincount(stream.class_index, minlength=3)
    for count, w in zip(counts, weights):
        p = w / sum(weights)
        assert abs(count / n - p) < Z * math.sqrt(p * (1 - p) / n)


def test_lengths_follow_their_class() -> None:
    cfg = TrafficConfig(arrival=PoissonArrivals(rate_rps=10.0), num_requests=2000, classes=[
        RequestClass(name="short", input_tokens=FixedLength(value=7), output_tokens=FixedLength(value=3)),
        RequestClass(name="long", input_tokens=FixedLength(value=9000), output_tokens=FixedLength(value=500)),
    ])
    frame = build_requests(cfg, np.random.default_rng(2)).to_frame()
    assert list(frame.columns) == ["arrival_s", "prompt_tokens", "output_tokens", "class_index", "class_name"]
    short = frame[frame.class_name == "short"]
    long = frame[frame.class_name == "long"]
    assert len(short) + len(long) == 2000
    assert (short.prompt_tokens == 7).all() and (short.output_tokens == 3).all()
    assert (long.prompt_tokens == 9000).all() and (long.output_tokens == 500).all()


@pytest.mark.parametrize("mean,ratio", [(100, 0.1), (1024, 0.5), (128, 0.0), (1, 0.5), (333, 0.37)])
def test_range_ratio_bounds_follow_vllm(mean: int, ratio: float) -> None:
    # vllm/benchmarks/datasets/random.py RandomDataset.get_sampling_params:
    #   low = floor(L*(1-r)), high = ceil(L*(1+r)), output low raised to 1, integers(low, high+1).
    low = max(math.floor(mean * (1 - ratio)), 1)
    high = max(math.ceil(mean * (1 + ratio)), 1)
    n = 40_000
    x = sample_lengths(RangeRatioLength(mean=mean, range_ratio=ratio), n, np.random.default_rng(1))
    assert x.dtype == np.int64
    assert x.min() == low and x.max() == high  # both ends are reached with this many draws
    # Discrete uniform on [low, high]: mean (low+high)/2, variance ((high-low+1)^2-1)/12.
    sd = math.sqrt(((high - low + 1) ** 2 - 1) / 12)
    assert abs(x.mean() - (low + high) / 2) <= Z * sd / math.sqrt(n)


def test_range_ratio_float_quirk() -> None:
    # 100 * (1 + 0.1) == 110.00000000000001 in float64, so vLLM's ceil gives 111.
    x = sample_lengths(RangeRatioLength(mean=100, range_ratio=0.1), 20_000, np.random.default_rng(0))
    assert (x.min(), x.max()) == (90, 111)


@settings(max_examples=50, deadline=None)
@given(mean=st.integers(1, 100_000), ratio=st.floats(0.0, 0.99), seed=st.integers(0, 2**32 - 1))
def test_range_ratio_never_leaves_its_bounds(mean: int, ratio: float, seed: int) -> None:
    x = sample_lengths(RangeRatioLength(mean=mean, range_ratio=ratio), 200, np.random.default_rng(seed))
    assert x.min() >= max(math.floor(mean * (1 - ratio)), 1)
    assert x.max() <= max(math.ceil(mean * (1 + ratio)), 1)


def test_uniform_length_moments() -> None:
    n, low, high = 40_000, 50, 150
    x = sample_lengths(UniformLength(low=low, high=high), n, np.random.default_rng(8))
    assert x.min() == low and x.max() == high
    sd = math.sqrt(((high - low + 1) ** 2 - 1) / 12)
    assert abs(x.mean() - (low + high) / 2) <= Z * sd / math.sqrt(n)


def test_lognormal_median() -> None:
    n, median, sigma = 40_001, 500.0, 1.0
    x = sample_lengths(LognormalLength(median=median, sigma=sigma), n, np.random.default_rng(12))
    # Sample median of a lognormal: standard error 1/(2 f(m) sqrt(n)) with
    # f(m) = 1/(m sigma sqrt(2 pi)), i.e. m sigma sqrt(pi/2)/sqrt(n); +1 for integer rounding.
    se = median * sigma * math.sqrt(math.pi / 2) / math.sqrt(n)
    assert abs(np.median(x) - median) < Z * se + 1
    # ln(x) is normal with sd sigma (rounding barely matters at this median).
    assert abs(np.log(x).std() - sigma) < 0.02


def test_lognormal_clipping() -> None:
    x = sample_lengths(LognormalLength(median=100, sigma=2.0, min=20, max=300), 10_000, np.random.default_rng(1))
    assert x.min() == 20 and x.max() == 300


def test_empirical_reproduces_published_trace_means() -> None:
    # Published in the traces README / trace_stats.csv (azure2023_conv.csv): in_mean 1154.7,
    # out_mean 211.1.
    published = {"input": 1154.7, "output": 211.1}
    # The spread of each column, read straight from the CSV (not through capacity.inputs.traffic).
    raw = pd.read_csv(SHIPPED / "azure2023_conv.csv")
    spread = {"input": raw["ContextTokens"].std(ddof=0), "output": raw["GeneratedTokens"].std(ddof=0)}
    n = 200_000
    for column in ("input", "output"):
        x = sample_lengths(EmpiricalLength(trace="azure2023_conv", column=column), n, np.random.default_rng(17))
        # Sampling with replacement: standard error sd/sqrt(n); 0.05 for the published rounding.
        assert abs(x.mean() - published[column]) < Z * spread[column] / math.sqrt(n) + 0.05


# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,rows,in_mean,out_mean,in_median,span_s,rate_rps,cv", [
    # Literals copied from /work/shared/traces/trace_stats.csv (published statistics).
    ("azure2023_conv", 19366, 1154.7, 211.1, 1020.0, 3501.7, 5.5301, 1.094),
    ("azure2023_code", 8819, 2047.8, 27.9, 1469.0, 3435.9, 2.5664, 13.151),
])
def test_read_trace_matches_published_statistics(name, rows, in_mean, out_mean, in_median, span_s, rate_rps, cv):
    df = read_trace(name)
    assert list(df.columns) == ["arrival_s", "input_tokens", "output_tokens"]
    assert len(df) == rows
    assert abs(df.input_tokens.mean() - in_mean) <= 0.05
    assert abs(df.output_tokens.mean() - out_mean) <= 0.05
    assert df.input_tokens.median() == in_median
    assert df.arrival_s.iloc[0] == 0.0
    assert abs(df.arrival_s.iloc[-1] - span_s) <= 0.05
    assert abs((rows - 1) / df.arrival_s.iloc[-1] - rate_rps) <= 0.00005
    gaps = np.diff(df.arrival_s.to_numpy())
    assert abs(gaps.std() / gaps.mean() - cv) <= 0.0005


def _first500_rows() -> list[tuple[float, int, int]]:
    """Parse the test file with the csv module and datetime, independently of pandas."""
    with FIRST500.open(newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f") for r in rows]
    return [((s - stamps[0]).total_seconds(), int(r["ContextTokens"]), int(r["GeneratedTokens"]))
            for s, r in zip(stamps, rows)]


def test_replay_first500() -> None:
    expected = _first500_rows()
    cfg = TrafficConfig(arrival=TraceArrivals(path=str(FIRST500)))
    stream = build_requests(cfg, np.random.default_rng(0))
    assert len(stream) == 500 and stream.concurrency is None
    assert stream.arrival_s[0] == 0.0
    np.testing.assert_array_equal(stream.prompt_tokens, [r[1] for r in expected])
    np.testing.assert_array_equal(stream.output_tokens, [r[2] for r in expected])
    # 7-digit fractions were cut to 6 for datetime, hence the 1 us tolerance.
    np.testing.assert_allclose(stream.arrival_s, [r[0] for r in expected], atol=1e-6, rtol=0)
    assert stream.class_names == ["azure2023_conv_first500"]
    assert np.all(stream.class_index == 0)


def test_time_scale_halves_the_span() -> None:
    base = build_requests(TrafficConfig(arrival=TraceArrivals(path=str(FIRST500))), np.random.default_rng(0))
    fast = build_requests(TrafficConfig(arrival=TraceArrivals(path=str(FIRST500), time_scale=2.0)),
                          np.random.default_rng(0))
    assert len(fast) == len(base)
    assert fast.arrival_s[-1] == pytest.approx(base.arrival_s[-1] / 2, rel=1e-12)
    np.testing.assert_array_equal(fast.prompt_tokens, base.prompt_tokens)


def test_trace_window_and_caps() -> None:
    expected = _first500_rows()
    times = np.array([r[0] for r in expected])
    start, duration = 20.0, 30.0
    cfg = TrafficConfig(arrival=TraceArrivals(path=str(FIRST500), start_s=start), duration_s=duration)
    stream = build_requests(cfg, np.random.default_rng(0))
    inside = (times >= start) & (times - start < duration)
    assert len(stream) == int(inside.sum())
    np.testing.assert_array_equal(stream.prompt_tokens, np.array([r[1] for r in expected])[inside])
    assert stream.arrival_s.min() >= 0 and stream.arrival_s.max() < duration
    capped = build_requests(TrafficConfig(arrival=TraceArrivals(path=str(FIRST500), max_requests=40),
                                          num_requests=60), np.random.default_rng(0))
    assert len(capped) == 40
    with pytest.raises(CapacityError, match="no requests"):
        build_requests(TrafficConfig(arrival=TraceArrivals(path=str(FIRST500), start_s=1e6)),
                       np.random.default_rng(0))


def test_trace_with_classes_labels_by_weight() -> None:
    cfg = TrafficConfig(arrival=TraceArrivals(path="azure2023_conv"),
                        classes=[RequestClass(**one_class(name="a"), weight=1.0),
                                 RequestClass(**one_class(name="b"), weight=3.0)])
    stream = build_requests(cfg, np.random.default_rng(0))
    n = len(stream)
    p = 0.75
    assert abs(np.mean(stream.class_index == 1) - p) < Z * math.sqrt(p * (1 - p) / n)
    assert stream.prompt_tokens.mean() == pytest.approx(1154.7, abs=0.05)  # lengths stay the file's


def test_other_trace_formats_read_the_same(tmp_path: Path) -> None:
    expected = _first500_rows()[:50]
    t0 = 1000.0  # absolute offset: read_trace makes times relative to the first request
    formats = {
        "vidur.csv": ("arrived_at,num_prefill_tokens,num_decode_tokens", lambda t: f"{t:.7f}"),
        "mooncake.csv": ("timestamp_ms,input_length,output_length", lambda t: f"{(t + t0) * 1000:.4f}"),
        "generic.csv": ("arrival_s,input_tokens,output_tokens", lambda t: f"{t + t0:.7f}"),
    }
    for name, (header, stamp) in formats.items():
        path = tmp_path / name
        path.write_text(header + "\n" + "".join(f"{stamp(t)},{i},{o}\n" for t, i, o in expected))
        df = read_trace(str(path))
        np.testing.assert_array_equal(df.input_tokens, [r[1] for r in expected])
        np.testing.assert_array_equal(df.output_tokens, [r[2] for r in expected])
        np.testing.assert_allclose(df.arrival_s, [r[0] for r in expected], atol=2e-6, rtol=0)


def test_zero_token_rows_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n5.0,0,0\n6.0,10,0\n7.5,12,4\n9.0,0,3\n10.0,8,2\n")
    df = read_trace(str(path))
    assert df.input_tokens.tolist() == [12, 8] and df.output_tokens.tolist() == [4, 2]
    assert df.arrival_s.tolist() == [0.0, 2.5]


def test_missing_columns_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,Tokens\n2023-11-16 18:15:46.68,1,2\n")
    with pytest.raises(CapacityError) as info:
        read_trace(str(path))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"trace {path}") or str(path) in message
    assert "missing columns GeneratedTokens" in message
    assert "expected one of:" in message and "arrival_s,input_tokens,output_tokens" in message


def test_bad_values_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "neg.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,5,5\n1,-3,5\n")
    with pytest.raises(CapacityError, match="input_tokens data row 2"):
        read_trace(str(path))
    with pytest.raises(CapacityError, match="no such file") as info:
        resolve_trace("no_such_trace")
    assert "azure2023_conv" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(CapacityError, match="no such file"):
        build_requests(TrafficConfig(arrival=PoissonArrivals(rate_rps=1.0), num_requests=5, classes=[
            RequestClass(**one_class(input_tokens={"dist": "empirical", "trace": str(tmp_path / "x.csv"),
                                                   "column": "input"}))]), np.random.default_rng(0))


def test_length_only_files_work_for_empirical(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n10,1,11,10\n30,3,33,10\n")
    x = sample_lengths(EmpiricalLength(trace=str(path), column="input"), 1000, np.random.default_rng(0))
    assert set(x.tolist()) == {10, 30}
    with pytest.raises(CapacityError, match="missing columns"):
        read_trace(str(path))  # replay needs a time column


def test_shipped_traces_are_the_published_files() -> None:
    assert {"azure2023_conv", "azure2023_code"} <= set(shipped_traces())
    # sha256 published in the traces README.
    published = {
        "azure2023_conv.csv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "azure2023_code.csv": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    }
    for name, digest in published.items():
        assert hashlib.sha256((SHIPPED / name).read_bytes()).hexdigest() == digest
    prefix = FIRST500.read_bytes()
    assert (SHIPPED / "azure2023_conv.csv").read_bytes()[: len(prefix)] == prefix
    assert prefix.count(b"\n") == 501
    assert resolve_trace("azure2023_conv") == resolve_trace("azure2023_conv.csv")


# ---------------------------------------------------------------------------------------------
# Determinism and validation
# ---------------------------------------------------------------------------------------------


def _mixed_config() -> TrafficConfig:
    return TrafficConfig.model_validate({
        "arrival": {"process": "gamma", "rate_rps": 6.0, "burstiness": 0.7},
        "num_requests": 3000,
        "classes": [
            {"name": "chat", "weight": 3, "input_tokens": {"dist": "empirical", "trace": "azure2023_conv", "column": "input"},
             "output_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.8, "max": 2048}},
            {"name": "code", "weight": 1, "input_tokens": {"dist": "range_ratio", "mean": 2000, "range_ratio": 0.5},
             "output_tokens": {"dist": "uniform", "low": 5, "high": 60}},
        ],
    })


def test_determinism_per_seed() -> None:
    cfg = _mixed_config()
    a = build_requests(cfg, np.random.default_rng(123))
    b = build_requests(cfg, np.random.default_rng(123))
    c = build_requests(cfg, np.random.default_rng(124))
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "class_index"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert not np.array_equal(getattr(a, field), getattr(c, field))
    assert a.prompt_tokens.dtype == np.int64 and a.arrival_s.dtype == np.float64
    assert a.prompt_tokens.min() >= 1 and a.output_tokens.min() >= 1


def test_extra_keys_are_rejected() -> None:
    good = {"arrival": {"process": "poisson", "rate_rps": 1.0}, "classes": [one_class()], "num_requests": 5}
    TrafficConfig.model_validate(good)
    typos = [
        {**good, "num_request": 5},
        {**good, "arrival": {"process": "poisson", "rate_rps": 1.0, "rate": 2}},
        {**good, "classes": [one_class(input_tokens={"dist": "range_ratio", "mean": 10, "range_ratio": 0.1,
                                                     "ratio": 0.2})]},
        {**good, "classes": [{**one_class(), "wieght": 2}]},
    ]
    for data in typos:
        with pytest.raises(ValidationError, match="extra_forbidden|Extra inputs are not permitted"):
            TrafficConfig.model_validate(data)


@pytest.mark.parametrize("data,fragment", [
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "classes": [], "num_requests": 5}, "classes is empty"),
    ({"arrival": {"process": "poisson", "rate_rps": 0}, "classes": [one_class()], "num_requests": 5}, "greater than 0"),
    ({"arrival": {"process": "poisson", "rate_rps": -2}, "classes": [one_class()], "num_requests": 5}, "greater than 0"),
    ({"arrival": {"process": "gamma", "rate_rps": 1, "burstiness": 0}, "classes": [one_class()], "num_requests": 5},
     "greater than 0"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "classes": [one_class()]}, "num_requests or duration_s"),
    ({"arrival": {"process": "closed_loop", "concurrency": 4}, "classes": [one_class()], "duration_s": 10},
     "closed_loop needs num_requests"),
    ({"arrival": {"process": "closed_loop", "concurrency": 0}, "classes": [one_class()], "num_requests": 5},
     "greater than or equal to 1"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
      "classes": [one_class(input_tokens={"dist": "uniform", "low": 9, "high": 3})]}, "high >= low"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
      "classes": [one_class(input_tokens={"dist": "range_ratio", "mean": 9, "range_ratio": 1.0})]}, "less than 1"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
      "classes": [one_class(output_tokens={"dist": "fixed", "value": 0})]}, "greater than or equal to 1"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
      "classes": [one_class(name="x"), one_class(name="x")]}, "unique"),
    ({"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
      "classes": [one_class(input_tokens={"dist": "zipf", "value": 3})]}, "does not match any of the expected tags"),
    ({"arrival": {"process": "trace", "path": "azure2023_conv", "time_scale": 0}}, "greater than 0"),
])
def test_invalid_configs_are_rejected(data: dict, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        TrafficConfig.model_validate(data)
