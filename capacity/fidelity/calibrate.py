"""Fit a GPU's efficiency parameters to measured serving rows (`capacity calibrate`).

Only physically meaningful parameters shared by every row of the GPU are fitted — the fraction
of peak FLOPs linear layers reach (gemm), of HBM bandwidth (hbm), of peak for attention FLOPs
(attention), of scale-up bandwidth for all-reduce (allreduce), and the fixed per-step and
per-sequence overheads — never a per-row or per-model correction.

Fitting re-prices recorded schedules instead of re-simulating: in a closed loop served by one
replica, which requests run in which step does not depend on how long the steps take (a new
request is sent when one finishes, i.e. at a step boundary). So each row is simulated once, its
per-step features are kept (tokens, sequences, attention FLOPs, KV bytes), and for a candidate
parameter set the step durations are priced with numpy and the row's latencies and throughputs
read off their cumulative sum — the same numbers a full simulation with those parameters gives.
That is exact for a closed loop with no request delay (request_overhead_ms and
prompt_token_overhead_us 0). With a request delay, and for
open-loop (Poisson/gamma) runs, the schedule depends on timing: open-loop rows are re-priced with
their idle gaps kept (a busy period starts at the later of the previous step's end and the
recorded wake-up); a change of the request delay moves the step an idle engine waited for, and
otherwise the request's own latencies (`Repricer.predict`); and `rounds` > 1 re-records every row
with the fitted parameters and fits again, so the last fit is made on schedules simulated at
(nearly) the fitted values. Away from its recording point re-pricing is not exact (a request keeps
the step it joined, although with another request delay it would join another), so the errors
`run` reports come from schedules re-recorded at the final fitted values, i.e. a full simulation
with them (what `capacity validate` gives); the re-priced ones are kept beside them and a warning
says when the two disagree. Rows are recorded on the profile being calibrated (a YAML path too),
and a row that cannot be re-recorded in a later round keeps its earlier schedule (with a warning).

Input: any file `capacity.measurements.readers` knows (vllm bench serve results, the serving CSV schema;
speculative-decoding counters become acceptance profiles). Only parameters the runs can identify
are fitted (`identifiable_keys`); the others keep the profile's value and are reported.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from capacity.cost.step_cost import StepCostModel, StepFeatures, cudagraph_max_tokens
from capacity.errors import CapacityError
from capacity.fidelity import transfer
from capacity.fidelity.common import IN_FLIGHT_SHORTFALL, error_table, in_flight_ratio, pool_map
from capacity.fidelity.serving import default_files
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import FRACTION_EFFICIENCY_KEYS, GpuProfile, load_gpu, save_profile
from capacity.inputs.models import load_model
from capacity.measurements import readers
from capacity.measurements.clients import v0_engine
from capacity.measurements.row_scenario import PROMPTS_PER_USER, row_scenario, row_stream
from capacity.measurements.schemas import model_aliases, parse_float
from capacity.sim import simulate
from capacity.sim.simulate import has_request_delay, request_delays_s

# Upper bound of the serving stack's time per prompt token (us). What grows with the prompt before a
# request reaches vLLM's scheduler, as published (vllm-project/vllm): the API server's BPE encode of the
# prompt text `vllm bench serve` sends, at most ~1.3 us/token all in (PR #19334, which fixed issue #19012:
# 100 concurrent 10k-token prompts through /v1/completions in 1.34 s on an RTX 3090 host; identical prompts,
# so prefix caching leaves the host work), run on one tokeniser thread (vllm/utils/async_utils.py
# AsyncMicrobatchTokenizer, max_workers=1) so concurrent prompts queue behind each other, and holding the
# GIL against the output handler's detokenisation of every streaming request; prefix-block hashing
# 0.03-0.2 us/token (PR #15297: sha256+pickle 3.57 ms for 50k tokens on an Apple M2; PR #43789: 31 M
# tokens/s; PR #29261's design doc: 100-200 ns/token). Random-dataset text (decoded consecutive vocabulary ids, mostly
# rare multi-byte pieces) misses the BPE word cache. So a few us/token at most, more under load (inferred); 30 us/token
# (an 8k prompt 0.25 s before scheduling) is past anything a serving stack that keeps up with its GPU
# shows. basis: those sources for the range; the bound itself assumed. A fit on it is reported as failed.
PROMPT_TOKEN_OVERHEAD_MAX_US = 30.0
FITTED_KEYS = ("gemm", "moe", "moe_int4", "hbm", "attention", "attention_triton", "allreduce", "step_overhead_ms", "per_seq_overhead_us",
               "layer_overhead_us", "request_overhead_ms", "prompt_token_overhead_us", "moe_token_overhead_ns", "aiter_moe_token_overhead_ns",
               "eager_kernel_us")
# Host time per kernel of a step that replays no graph (step_cost module docstring): 0 to EAGER_KERNEL_MAX_US.
# basis: assumed (an order of magnitude, not measured here): a PyTorch eager op's dispatch and launch ~5-20 us on a server CPU, a kernel launched
# from Inductor's wrapper less; 100 us per kernel would make a 60-layer model's prompt step 0.1-0.2 s of host time.
# A fit on the bound is reported as failed.
EAGER_KERNEL_MAX_US = 100.0
BOUNDS = {"gemm": (0.02, 1.0), "moe": (0.02, 1.0), "moe_int4": (0.01, 1.0), "hbm": (0.2, 1.0), "attention": (0.01, 1.0),
          "attention_triton": (0.01, 1.0), "allreduce": (0.02, 1.0), "step_overhead_ms": (0.0, 30.0), "per_seq_overhead_us": (0.0, 500.0),
          "layer_overhead_us": (0.0, 2000.0), "request_overhead_ms": (0.0, 500.0),
          "prompt_token_overhead_us": (0.0, PROMPT_TOKEN_OVERHEAD_MAX_US), "moe_token_overhead_ns": (0.0, 5000.0),
          "aiter_moe_token_overhead_ns": (0.0, 5000.0), "eager_kernel_us": (0.0, EAGER_KERNEL_MAX_US)}
FIT_METRICS = ("output_tok_s_per_gpu", "ttft_ms", "tpot_ms")
# the ratio to the measurement a non-positive re-priced prediction counts as in the fit's residuals (`_residuals`):
# log(1e-6) = -13.8, far beyond any real error, so the optimiser leaves that region instead of failing on log(<= 0)
NONPOSITIVE_PREDICTION_RATIO = 1e-6
# Fitted only when asked for (`--fit KEY`) or where the profile already has a nonzero value: terms some profiles ship
# (H100, H200) and others do not (docs/seed_validation.md sections 31-32).
OPT_IN_KEYS = ("moe_token_overhead_ns", "aiter_moe_token_overhead_ns", "eager_kernel_us")
# How close to its lower bound a fitted value counts as on it: overheads (floor 0) within 1e-3 of their unit
# (a nanosecond-scale host time is no time), fractions within 0.1 % of their floor
FLOOR_TOLERANCE = {"step_overhead_ms": 1e-6, "per_seq_overhead_us": 1e-3, "layer_overhead_us": 1e-3, "moe_token_overhead_ns": 1e-3,
                   "aiter_moe_token_overhead_ns": 1e-3, "eager_kernel_us": 1e-3,
                   "request_overhead_ms": 1e-6, "prompt_token_overhead_us": 1e-3}
F_SCALE = 0.1   # soft-L1 scale of the log errors: beyond ~10 % a row's pull grows linearly, not quadratically
# A second, neutral starting point for the fit (least squares on a roofline has local minima):
# mid-range efficiencies and small overheads. Not a prior: the better of the two fits is kept.
# Weak prior: each fraction efficiency that has a microbenchmark anchor in the profile (GEMM, STREAM,
# FlashAttention, all-reduce bus bandwidth ratios; `prior_efficiencies`) adds one residual
# PRIOR_WEIGHT * log(value / anchor) to the least squares, i.e. a factor-e deviation from the
# microbenchmark costs as much as PRIOR_WEIGHT rows that are off by a factor e. With a few models
# per GPU several parameters trade off against each other (attention vs gemm, allreduce vs per-layer
# overhead) and the unregularised fit drifts to values that fit those models and predict others
# badly. basis: chosen by leave-one-model-out on the InferenceX rows (2026-11-29, one recording
# round, re-priced). MI300X: weight 0 -> LOMO median |error| output tok/s 27.9 %, TPOT 36.4 %,
# TTFT 32.9 %; weight 3 -> 17.9 %, 19.5 %, 22.3 %, fitted rows 9.3 / 8.9 / 14.3 % (unchanged).
# MI355X: LOMO 20.7 / 20.8 / 36.7 % -> 19.1 / 18.4 / 35.4 %, fitted TPOT 14.3 -> 16.2 %. The shipped
# profiles are still the unregularised fits. The MI300X refit's 14.3 % TTFT was a re-pricing artefact,
# not a row-set difference (166 TTFT rows in both commands): before 2026-11-29 17:40 `run` recorded every row
# on the shipped profile of the row's GPU name (so `--gpu fitted.yaml` re-recorded at the shipped
# values again, hence the "same fit" of the second round), and the second round was silently dropped
# when a row finished at one point but not the other (170 vs 171 recordable rows). The fit was thus
# re-priced at request delay 24 ms on schedules recorded at 66.8 ms, where a request keeps the late
# step it joined: re-priced TTFT 14.3 %, simulated 28.8 % (predicted 42 ms too early, median), the
# same per row as `capacity validate` once recorded at 24 ms (max relative difference 1.5e-12).
# `run` now reports errors simulated at the fitted values and warns when re-pricing disagrees.
# Recorded correctly, the rounds swing (delay 24 -> 66 ms: re-pricing below the recorded delay does
# not move a request to an earlier step), so `run` keeps the round whose simulated cost is lowest.
# MI300X prior refit, round 2 (delay 65.7 ms), `capacity validate` figures: median output tok/s 9.4 %,
# TPOT 9.3 %, TTFT 15.5 % (shipped profile: 9.6 / 9.4 / 15.0 %); the LOMO figures above were re-priced
# from schedules recorded at the shipped values and are to be re-measured with this `run`.
# Re-measured with this `run` (simulated, 2026-11-29 19:05): MI355X LOMO median output tok/s 20.5 %,
# TPOT 19.2 %, TTFT 38.3 % (p90 45.7 / 49.9 / 101.4 %), fitted rows 13.9 / 16.1 / 23.4 %; MI300X not yet.
PRIOR_WEIGHT = 3.0
PRIOR_KEYS = ("gemm", "hbm", "attention", "allreduce")

NEUTRAL_START = {"gemm": 0.5, "moe": 0.5, "moe_int4": 0.5, "hbm": 0.7, "attention": 0.3, "attention_triton": 0.3, "allreduce": 0.5,
                 "step_overhead_ms": 1.0,
                 "per_seq_overhead_us": 10.0, "layer_overhead_us": 10.0, "request_overhead_ms": 20.0,
                 "prompt_token_overhead_us": 2.0, "moe_token_overhead_ns": 100.0, "aiter_moe_token_overhead_ns": 100.0,
                 "eager_kernel_us": 10.0}


@dataclass
class RecordedRow:
    """One measured row and the schedule the simulator ran for it."""

    row: dict[str, Any]
    scenario: dict[str, Any]
    features: np.ndarray          # (steps, 5): tokens, seqs, sampled, attention FLOPs, KV bytes
    arrival_step: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    num_gpus: int
    open_loop: bool
    arrival_s: np.ndarray          # send times (s); closed loop: when the engine dispatched them
    step_end_s: np.ndarray         # recorded step end times (s)
    dispatch_step: np.ndarray      # closed loop: step at whose end a request was sent (-1: at t = 0)
    record_eff: dict[str, float]   # efficiency the schedule was recorded with


def record_row(row: dict[str, Any], prompts_per_user: int = PROMPTS_PER_USER,
               efficiency: dict[str, float] | None = None, gpu: str | None = None) -> RecordedRow | str:
    """Simulate a row once and keep its schedule; a string says why it cannot be recorded.

    `gpu` (a profile name or YAML path) is the profile simulated, default the shipped profile named by
    the row; `efficiency` overrides its efficiency entries."""
    sc, reason = row_scenario(row, prompts_per_user, speculative=False)
    if sc is None:
        return reason
    if sc["deployment"]["replicas"] != 1:
        return "only single-replica rows can be re-priced"
    if gpu is not None:
        sc["deployment"]["gpu"] = str(gpu)
    if efficiency:
        sc["deployment"]["gpu_overrides"] = {"efficiency": dict(efficiency)}
    try:
        scenario = scenario_mod.from_dict(sc, sc["name"])
        res = simulate.run(scenario, stream=row_stream(row, sc))
    except CapacityError as e:
        return str(e)
    rep = res.cluster.replicas[0]
    t = res.cluster.table
    if np.any(np.isnan(t.finish)):
        return "the simulation did not finish every request"
    open_loop = sc["traffic"]["arrival"]["process"] != "closed_loop"
    ends = np.asarray(rep.recorder.t, dtype=float)
    idx = np.searchsorted(ends, t.arrival, side="left")
    hit = (idx < len(ends)) & (np.abs(ends[np.minimum(idx, len(ends) - 1)] - t.arrival) < 1e-9) & (t.arrival > 0)
    dispatch = np.where(hit, idx, -1)
    return RecordedRow(row=row, scenario=sc, features=np.asarray(rep.recorder.features, dtype=float),
                       arrival_step=t.arrival_step.copy(), first_token_step=t.first_token_step.copy(),
                       finish_step=t.finish_step.copy(), prompt_tokens=t.prompt.copy(),
                       output_tokens=t.target.copy(), num_gpus=res.num_gpus, open_loop=open_loop,
                       arrival_s=t.arrival.copy(), step_end_s=ends, dispatch_step=dispatch,
                       record_eff=dict(res.deployed.gpu.efficiency))


class ClosedLoopEnds:
    """Step end times of a recorded closed loop under new step durations:
    end_k = c_k + max_{j<=k}(L_j - c_prev_j), where L_j is the latest bound on step j: 0 for step 0,
    d_i for a request i sent at t = 0 that step j first schedules, and (end of the step that
    dispatched it) + d_i for every other request i it first schedules (d_i: request i's delay).

    Every dispatch precedes its join, so one pass over the steps with a bound, in order, settles
    each bound before it is used (the running max changes only there; a lookup finds it at a
    dispatch step). Same floating-point operations as iterating the equation to its fixed point.
    The steps and their dispatches are fixed by the recording, so they are grouped once here.
    """

    def __init__(self, join_step: np.ndarray, dispatch_step: np.ndarray):
        first: dict[int, list[int]] = {}
        later: dict[int, list[tuple[int, int]]] = {}
        for i, (j, k) in enumerate(zip(join_step.tolist(), dispatch_step.tolist())):
            if k < 0:
                first.setdefault(j, []).append(i)
            else:
                later.setdefault(j, []).append((k, i))
        steps = sorted(set(first) | {0} | set(later))
        self.steps = np.asarray(steps, dtype=np.int64)
        position = {j: n for n, j in enumerate(steps)}
        self.first_position = np.asarray([position[j] for j in first for _ in first[j]], dtype=np.int64)
        self.first_request = np.asarray([i for j in first for i in first[j]], dtype=np.int64)
        self.dispatch = [[k for k, _ in later.get(j, [])] for j in steps]
        self.flat_dispatch = np.asarray([k for j in steps for k, _ in later.get(j, [])], dtype=np.int64)
        self.flat_request = np.asarray([i for j in steps for _, i in later.get(j, [])], dtype=np.int64)

    def __call__(self, c: np.ndarray, c_prev: np.ndarray, d: np.ndarray) -> np.ndarray:
        first_bound = np.full(len(self.steps), -math.inf)
        np.maximum.at(first_bound, self.first_position, d[self.first_request])
        c_at_dispatch = iter(c[self.flat_dispatch].tolist())
        d_later = iter(d[self.flat_request].tolist())
        m_steps: list[int] = []
        m_values: list[float] = []
        m = -math.inf
        for j, bound, ks, cp in zip(self.steps.tolist(), first_bound.tolist(), self.dispatch,
                                    c_prev[self.steps].tolist()):
            if j == 0:
                bound = max(bound, 0.0)
            for k in ks:
                end_k = next(c_at_dispatch) + m_values[bisect_right(m_steps, k) - 1]
                bound = max(bound, end_k + next(d_later))
            v = bound - cp
            if v > m:
                m = v
                m_steps.append(j)
                m_values.append(m)
        at = np.searchsorted(np.asarray(m_steps), np.arange(len(c)), side="right") - 1
        return c + np.asarray(m_values)[at]


WAITED_FOR_TOLERANCE_S = 1e-7   # a step that starts this close to a request's arrival at the engine waited for it


class Repricer:
    """Prices a recorded row under any efficiency parameters."""

    def __init__(self, rec: RecordedRow, gpu: GpuProfile):
        d = rec.scenario["deployment"]
        model = load_model(d["model"], weight_precision=d.get("precision"), kv_dtype=d.get("kv_cache_dtype", "bf16"))
        self.rec = rec
        engine = rec.scenario.get("engine", {})
        self.cost = StepCostModel(gpu, model, d["tensor_parallel_size"], expert_parallel=d.get("expert_parallel", False),
                                  async_scheduling=engine.get("async_scheduling", True),
                                  quick_reduce_quantization=engine.get("quick_reduce_quantization", "none"),
                                  attention_backend=engine.get("attention_backend", "auto"),
                                  moe_backend=engine.get("moe_backend", "auto"),
                                  int4_tiles=engine.get("int4_moe_tiles", "auto"),
                                  graph_max_tokens=cudagraph_max_tokens(
                                      engine.get("max_num_seqs", scenario_mod.Engine.model_fields["max_num_seqs"].default),
                                      (rec.scenario.get("speculative") or {}).get("num_speculative_tokens") or 0,
                                      engine.get("max_num_batched_tokens",
                                                 scenario_mod.Engine.model_fields["max_num_batched_tokens"].default),
                                      engine.get("max_cudagraph_capture_size")))
        f = rec.features
        self.features = StepFeatures(*(f[:, i] for i in range(f.shape[1])))
        # the first step whose recorded start is at or after a request reached the engine
        starts = rec.step_end_s - np.asarray(self.cost.total_time(self.features, rec.record_eff), dtype=float)
        self.recorded_delay_s = request_delays_s(rec.record_eff, rec.prompt_tokens)
        reach = rec.arrival_s + self.recorded_delay_s
        self.join_step = np.minimum(np.searchsorted(starts, reach - 1e-9, side="left"), len(starts) - 1)
        # requests whose arrival started their step (the engine was idle, waiting for them): their delay
        # moves the schedule (`_ends`); every other request's delay moves its own latencies (`predict`)
        self.waited_for = np.abs(starts[self.join_step] - reach) <= WAITED_FOR_TOLERANCE_S
        if not rec.open_loop:
            self.closed_loop = ClosedLoopEnds(self.join_step, rec.dispatch_step)

    def _ends(self, durations: np.ndarray, bound_delay_s: np.ndarray) -> np.ndarray:
        """Step end times of the recorded schedule with new step durations.

        Steps run back to back, except that no step can start before the requests it first schedules
        have reached the engine: a request sent at a (open loop: recorded; closed loop: the end of the
        step that freed its slot) arrives after its request delay d (`bound_delay_s`, from `predict`),
        so the first step that recorded it starts at >= a + d. With C the cumulative durations,
        end_k = C_k + max_{j<=k}(L_j - C_{j-1}) (L_j: the latest such bound on step j). A closed loop's
        bounds depend on earlier ends (ClosedLoopEnds). At the recording parameters this reproduces the
        simulation exactly.
        """
        r = self.rec
        c = np.cumsum(durations)
        c_prev = c - durations
        if not r.open_loop:
            return self.closed_loop(c, c_prev, bound_delay_s)
        bounds = np.full(len(durations), -np.inf)
        np.maximum.at(bounds, self.join_step, r.arrival_s + bound_delay_s)
        return c + np.maximum.accumulate(bounds - c_prev)

    def predict(self, efficiency: dict[str, float]) -> dict[str, float]:
        r = self.rec
        durations = np.asarray(self.cost.total_time(self.features, efficiency), dtype=float)
        out = r.output_tokens
        # A request whose delay changes by x reaches the engine x later. If the engine was idle waiting for it,
        # its step starts x later (a bound of the schedule, exact). Otherwise it joins the first step that
        # starts after it, and on average (the wait for a step boundary is the same) its first token and end
        # move by x: a shift of its own latencies. Moving the busy engine's bound instead keeps the request
        # in the late step it joined when x < 0 and stalls every other request when x > 0; that biased the
        # fitted request delay upward (docs/seed_validation.md section 29).
        delay = request_delays_s(efficiency, r.prompt_tokens)
        shift = np.where(self.waited_for, 0.0, delay - self.recorded_delay_s)
        ends = self._ends(durations, np.where(self.waited_for, delay, self.recorded_delay_s))
        first = ends[r.first_token_step] + shift
        finish = ends[r.finish_step] + shift
        if r.open_loop:
            arrival = r.arrival_s
            duration = float(finish.max() - arrival.min())
        else:   # a closed-loop request is sent when another finishes, at that step's end (or at t = 0)
            arrival = np.where(r.dispatch_step >= 0, ends[np.maximum(r.dispatch_step, 0)], 0.0)
            duration = float(finish.max())
        multi = out > 1
        tpot = (finish[multi] - first[multi]) / (out[multi] - 1) * 1e3
        stat = np.mean if str(r.row.get("latency_stat", "median")).lower().startswith("mean") else np.median
        tpot_stat = float(stat(tpot))
        return {
            "predicted_output_tok_s_per_gpu": out.sum() / duration / r.num_gpus,
            "predicted_total_tok_s_per_gpu": (out.sum() + r.prompt_tokens.sum()) / duration / r.num_gpus,
            "predicted_tok_s_per_user": 1e3 / float(np.median(tpot)),
            "predicted_ttft_ms": float(stat(first - arrival)) * 1e3,
            "predicted_tpot_ms": tpot_stat,
            "predicted_e2e_ms": float(stat(finish - arrival)) * 1e3,
        }


def _record_star(args):
    return record_row(*args)


def record_rows(rows: pd.DataFrame | list[dict[str, Any]], workers: int = 2, progress: bool = True,
                prompts_per_user: int = PROMPTS_PER_USER,
                efficiency: dict[str, float] | None = None, gpu: str | None = None) -> list[RecordedRow | str]:
    """`record_row` for each row, in order (a process pool of `workers`)."""
    records = rows.to_dict(orient="records") if isinstance(rows, pd.DataFrame) else list(rows)
    jobs = [(r, prompts_per_user, efficiency, gpu) for r in records]
    return pool_map(_record_star, jobs, workers, progress, "simulated rows", title="calibrate")


def _residuals(x: np.ndarray, keys: tuple[str, ...], base: dict[str, float], pricers: list[Repricer],
               metrics: tuple[str, ...] = FIT_METRICS) -> np.ndarray:
    eff = dict(base)
    eff.update(zip(keys, x))
    res = []
    for p in pricers:
        pred = p.predict(eff)
        for m in metrics:
            meas = parse_float(p.rec.row.get(m))
            if meas > 0 and not math.isnan(meas):
                # a re-pricing far from the recording can shift a time below zero (a TTFT less the step time
                # the recorded schedule held): no physical prediction, priced as a very large error
                res.append(math.log(max(pred[f"predicted_{m}"], meas * NONPOSITIVE_PREDICTION_RATIO) / meas))
    return np.asarray(res)


def _fit_residuals(x, keys, base, pricers, metrics, prior, prior_weight) -> np.ndarray:
    r = _residuals(x, keys, base, pricers, metrics)
    return np.concatenate([r, _prior_residuals(x, keys, prior, prior_weight)]) if prior else r


def prior_weights(weight: float | Mapping[str, float]) -> dict[str, float]:
    """Each PRIOR_KEYS efficiency's prior weight: one number for all, or a mapping (keys it omits get
    PRIOR_WEIGHT). Raises CapacityError on a key that has no prior or a weight that is not >= 0."""
    if isinstance(weight, Mapping):
        unknown = [k for k in weight if k not in PRIOR_KEYS]
        if unknown:
            raise CapacityError(f"--prior-weight {unknown[0]}=...: no microbenchmark prior on it; "
                                f"use one of {', '.join(PRIOR_KEYS)}")
        out = {k: weight.get(k, PRIOR_WEIGHT) for k in PRIOR_KEYS}
    else:
        out = dict.fromkeys(PRIOR_KEYS, weight)
    for k, w in out.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise CapacityError(f"--prior-weight {w}: give a finite number >= 0 (0: no prior), "
                                f"or KEY=W for one of {', '.join(PRIOR_KEYS)}")
    return {k: float(w) for k, w in out.items()}


def parse_prior_weight(texts: list[str]) -> float | dict[str, float]:
    """`--prior-weight` arguments: `W` (every anchor) or `KEY=W` (one anchor; repeatable, the others keep
    a plain `W` if one is given, else PRIOR_WEIGHT)."""
    base, per_key = PRIOR_WEIGHT, {}
    for text in texts:
        key, _, value = text.rpartition("=")
        try:
            w = float(value)
        except ValueError:
            raise CapacityError(f"--prior-weight {text}: give a number W or KEY=W, e.g. --prior-weight gemm=10") from None
        if key:
            per_key[key.strip()] = w
        else:
            base = w
    return prior_weights({**dict.fromkeys(PRIOR_KEYS, base), **per_key}) if per_key else base


def _active_prior(prior, prior_weight) -> dict[str, float] | None:
    """The anchors whose weight is above 0 (None: no prior residuals at all)."""
    w = prior_weights(prior_weight)
    active = {k: v for k, v in (prior or {}).items() if w.get(k, 0.0) > 0}
    return active or None


def simulated_cost(pricers: list[Repricer], eff: dict[str, float], keys: tuple[str, ...],
                   metrics: tuple[str, ...] = FIT_METRICS, prior: dict[str, float] | None = None,
                   prior_weight: float | Mapping[str, float] = PRIOR_WEIGHT) -> float:
    """The objective `fit` minimises (soft-L1 of the log errors plus the prior), at `eff`;
    a full simulation's value when `pricers` were recorded at `eff`."""
    x = np.array([eff[k] for k in keys])
    r = _fit_residuals(x, tuple(keys), eff, pricers, metrics, _active_prior(prior, prior_weight), prior_weight)
    z = (r / F_SCALE) ** 2      # scipy's soft_l1: rho(z) = 2 (sqrt(1 + z) - 1), cost = 0.5 f^2 sum rho
    return float(0.5 * F_SCALE ** 2 * np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def identifiable_keys(pricers: list[Repricer], start: dict[str, float],
                      metrics: tuple[str, ...] = FIT_METRICS) -> tuple[tuple[str, ...], dict[str, str]]:
    """The FITTED_KEYS these runs can pin down, and why each other one is left at the profile value.

    Structural rules: moe needs a MoE model (moe_int4 one with int4 experts), allreduce a run with TP > 1, layer_overhead_us runs of
    models with different layer counts (with one layer count it is the same constant per step as
    step_overhead_ms), prompt_token_overhead_us runs with more than one prompt length (with one it is the
    same constant per request as request_overhead_ms). Then a sensitivity test: a key whose 10 % change moves no fitted metric by
    more than 0.1 % (log-residual norm) is not identifiable from these runs.
    """
    why: dict[str, str] = {}
    models = [p.cost.model for p in pricers]
    moe_keys = {p.cost.moe_efficiency_key for p in pricers if p.cost.model.num_moe_layers}
    if "moe" not in moe_keys:
        why["moe"] = "no MoE model with fp8/fp4/bf16 experts in the runs"
    if not moe_keys:
        why["moe_token_overhead_ns"] = "no MoE model in the runs"
    if not any(p.cost.model.num_moe_layers and p.cost.moe_backend == "aiter" for p in pricers):
        why["aiter_moe_token_overhead_ns"] = "no run of a MoE model on AITER's fused MoE"
    if not all(getattr(p.cost, "_kernels_per_pass", 0) for p in pricers):
        why["eager_kernel_us"] = "the profile counts no kernels per layer (kernels_per_dense_layer)"
    if "moe_int4" not in moe_keys:
        why["moe_int4"] = "no MoE model with int4 (W4A16) experts in the runs"
    attention_keys = {getattr(p.cost, "attention_key", "attention") for p in pricers}
    if "attention" not in attention_keys:
        why["attention"] = "no run of a model whose attention runs the flash-attention kernels"
    if "attention_triton" not in attention_keys:
        why["attention_triton"] = ("no run whose attention runs vLLM's Triton unified-attention kernel (a model with "
                                   "attention sinks on ROCm, or engine.attention_backend: triton)")
    if all(p.cost.tp == 1 for p in pricers):
        why["allreduce"] = "every run is TP=1 (no all-reduce)"
    if len({int(t) for p in pricers for t in np.unique(p.rec.prompt_tokens)}) < 2:
        why["prompt_token_overhead_us"] = ("one prompt length in the runs: a time per prompt token is the same "
                                           "constant per request as request_overhead_ms")
    if len({m.num_layers for m in models}) < 2:
        why["layer_overhead_us"] = ("one layer count in the runs: a per-layer overhead is the same constant per "
                                    "step as step_overhead_ms (fitted)")
    keys = [k for k in FITTED_KEYS if k not in why]
    x0 = np.array([start[k] for k in keys])
    r0 = _residuals(x0, tuple(keys), start, pricers, metrics)
    for i, k in enumerate(keys):
        x = x0.copy()
        # a fraction by 10 %; an overhead by at least a fixed step, so that one already fitted to about 0
        # (3e-20 ms) is still tested (a 10 % change of nothing moves nothing)
        step = {"step_overhead_ms": 0.5, "request_overhead_ms": 5.0, "prompt_token_overhead_us": 2.0,
                "moe_token_overhead_ns": 100.0, "aiter_moe_token_overhead_ns": 100.0,
                "eager_kernel_us": 5.0}.get(k, 5.0)
        x[i] = x0[i] * 1.1 if k in FRACTION_EFFICIENCY_KEYS else x0[i] + max(0.1 * x0[i], step)
        if np.linalg.norm(_residuals(x, tuple(keys), start, pricers, metrics) - r0) < 1e-3:
            why[k] = "no fitted metric of these runs moves when it changes"
    return tuple(k for k in keys if k not in why), why


def prior_efficiencies(profile: GpuProfile) -> dict[str, float]:
    """The pre-calibration anchor of each PRIOR_KEYS efficiency that is a measurement of this GPU: its value
    if the profile was never fitted, else the value its note records as 'before calibration' (save_profile
    keeps it across refits). An anchor labelled `assumed` (no microbenchmark of this GPU: a sibling's ratio
    or a guess, e.g. MI355X's HBM, attention and all-reduce ratios copied from MI300X) is no prior: a guess
    held with the weight of PRIOR_WEIGHT rows is not evidence, and on MI355X it held `moe` on its bound once
    the per-routed-token time was fitted (docs/seed_validation.md section 35)."""
    out = {}
    for k in PRIOR_KEYS:
        leaf = profile.provenance.get(f"efficiency.{k}")
        if leaf is None:
            continue
        if leaf.basis.strip().lower() != "fitted":
            if not _is_assumed(leaf.basis):
                out[k] = float(leaf.value)
            continue
        m = re.search(r"before calibration: ([0-9.eE+-]+) *(\(([^:)]*))?", leaf.note or "")
        if m and not _is_assumed(m.group(3) or ""):
            out[k] = float(m.group(1))
    return {k: v for k, v in out.items() if v > 0}


def _is_assumed(basis: str) -> bool:
    """Whether a basis (or the basis a 'before calibration' note records) says the value is assumed."""
    return basis.strip().lower().startswith("assumed")


def _prior_residuals(x: np.ndarray, keys: tuple[str, ...], prior: dict[str, float],
                     weight: float | Mapping[str, float]) -> np.ndarray:
    w = prior_weights(weight)
    return np.asarray([w[k] * math.log(max(v, 1e-12) / prior[k]) for k, v in zip(keys, x) if k in prior])


def opt_in_keys_fitted(keys: tuple[str, ...], fit_also: tuple[str, ...], start: Mapping[str, float],
                       not_fitted: dict[str, str]) -> tuple[str, ...]:
    """`keys` without the OPT_IN_KEYS nobody asked for (`--fit`) and the profile has no value of (0), each with its
    reason in `not_fitted`: a profile that ships the term (H100, H200) refits it with the plain command."""
    for k in OPT_IN_KEYS:
        if k in keys and k not in fit_also and not start.get(k):
            keys = tuple(x for x in keys if x != k)
            not_fitted[k] = "fitted only with --fit or where the profile already has a value (a term not every profile ships)"
    return keys


def upper_bound(key: str, gpu: GpuProfile | None) -> float:
    """The upper bound of fitted parameter `key` on `gpu`: BOUNDS, and for a fraction efficiency its physical
    ceiling (`GpuProfile.efficiency_ceiling`: 1, or the measured all-reduce ratio where NVLS exceeds the links)."""
    if key in FRACTION_EFFICIENCY_KEYS and gpu is not None:
        return gpu.efficiency_ceiling(key)
    return BOUNDS[key][1]


def fit(pricers: list[Repricer], start: dict[str, float], keys: tuple[str, ...] = FITTED_KEYS,
        metrics: tuple[str, ...] = FIT_METRICS, info: dict[str, Any] | None = None,
        prior: dict[str, float] | None = None, prior_weight: float | Mapping[str, float] = PRIOR_WEIGHT,
        neutral_start: bool = True) -> dict[str, float]:
    """Least squares on log errors of throughput, TTFT and TPOT (robust soft-L1 loss), plus the weak
    prior toward the microbenchmark anchors `prior` (PRIOR_WEIGHT; none when `prior` is empty or the
    weight is 0). `neutral_start` also starts from NEUTRAL_START and keeps the better fit."""
    if not pricers:
        raise CapacityError("no rows to calibrate on: give serving measurements for this GPU")
    if not keys:
        return dict(start)
    gpu = getattr(pricers[0].cost, "gpu", None)    # None: a test's stand-in rows, bounded by BOUNDS
    lo = np.array([BOUNDS[k][0] for k in keys])
    hi = np.array([upper_bound(k, gpu) for k in keys])
    best = None
    for origin in (start, NEUTRAL_START) if neutral_start else (start,):
        x0 = np.clip([origin[k] for k in keys], lo, hi)
        sol = least_squares(_fit_residuals, x0, bounds=(lo, hi),
                            args=(keys, start, pricers, metrics, _active_prior(prior, prior_weight), prior_weight),
                            loss="soft_l1", f_scale=F_SCALE, x_scale=np.maximum(x0, 1e-2))
        if best is None or sol.cost < best.cost:
            best = sol
    sol = best
    if info is not None:
        info["converged"] = bool(sol.success)
        info["message"] = str(sol.message)
        info["at_bound"] = [k for k, v, h in zip(keys, sol.x, hi) if v >= h * (1 - 1e-3)]
        info["upper_bounds"] = dict(zip(keys, hi.tolist()))
        info["at_floor"] = [k for k, v in zip(keys, sol.x) if v <= BOUNDS[k][0] + FLOOR_TOLERANCE.get(k, 1e-3 * BOUNDS[k][0])]
    fitted = dict(start)
    fitted.update({k: float(v) for k, v in zip(keys, sol.x)})
    return fitted


def predictions(pricers: list[Repricer], eff: dict[str, float]) -> pd.DataFrame:
    rows = []
    for p in pricers:
        row = {k: v for k, v in p.rec.row.items() if k not in _LIST_COLUMNS}
        rows.append({**row, **p.predict(eff), "skipped": None})
    return pd.DataFrame(rows)


_LIST_COLUMNS = ("input_lens", "output_lens", "start_times")


@dataclass
class CalibrationResult:
    gpu: str
    fitted: dict[str, float]
    start: dict[str, float]
    rows_used: int
    skipped: dict[str, int]
    train_errors: list[dict[str, Any]]   # simulated at the fitted values (schedules re-recorded there)
    repriced_train_errors: list[dict[str, Any]] = field(default_factory=list)   # what the fit itself saw
    round_costs: list[float] = field(default_factory=list)   # simulated cost of each round's fit (lowest kept)
    holdout_errors: list[dict[str, Any]] = field(default_factory=list)
    lomo_errors: list[dict[str, Any]] = field(default_factory=list)
    lomo_fits: dict[str, dict[str, float]] = field(default_factory=dict)
    lotpo_errors: list[dict[str, Any]] = field(default_factory=list)   # leave-one-TP-size-out
    lotpo_fits: dict[str, dict[str, float]] = field(default_factory=dict)
    # leave-one-GPU-out within the family: each sibling's shipped rows on these fitted values, no refit
    sibling_errors: list[dict[str, Any]] = field(default_factory=list)
    out: str | None = None
    fitted_keys: tuple[str, ...] = FITTED_KEYS
    not_fitted: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    fitted_on: str = ""
    acceptance: list[dict[str, Any]] = field(default_factory=list)
    acceptance_out: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def summary_text(self) -> str:
        lines = [f"Calibrated {self.gpu} on {self.rows_used} rows"
                 + (f" (skipped: {', '.join(f'{n}× {r}' for r, n in self.skipped.items())})" if self.skipped else "")]
        lines.append("parameter                  start    fitted")
        for k in FITTED_KEYS:
            tag = "" if k in self.fitted_keys else f"   not fitted: {self.not_fitted.get(k, 'held fixed')}"
            lines.append(f"{k:24} {self.start[k]:8.3f} {self.fitted[k]:9.3f}{tag}")
        for w in self.warnings:
            lines.append(f"warning: {w}")
        # out of sample first: what a user asking about a sibling GPU, a model or a TP size outside the fit gets
        for sib in self.sibling_errors:
            lines.append("")
            lines.append(f"Leave-one-GPU-out within the family ({sib['sibling']}'s shipped rows on these values, no refit):")
            lines.append(f"{'metric':22} {'rows':>5} {'median APE':>11} {'p90 APE':>8}")
            for metric, t in sib["errors"].items():
                lines.append(f"{metric:22} {t['rows']:5d} {t['median_pct'] / 100:10.1%} {t['p90_pct'] / 100:8.1%}")
        for title, table in (("Leave-one-model-out cross-validation (fit without a model, predict it)", self.lomo_errors),
                             ("Leave-one-TP-size-out cross-validation (fit without a TP size, predict it)",
                              self.lotpo_errors),
                             ("Error on held-out rows (not used in the fit)", self.holdout_errors),
                             ("Error on the rows fitted on (simulated at the fitted values)", self.train_errors)):
            if not table:
                continue
            lines.append("")
            lines.append(title + ":")
            lines.append(f"{'model':42} {'metric':22} {'rows':>5} {'median APE':>11} {'p90 APE':>8}")
            for g in table:
                lines.append(f"{str(g.get('model', 'all'))[:42]:42} {g['metric']:22} {g['n']:5d} "
                             f"{g['median_ape']:10.1%} {g['p90_ape']:8.1%}")
        for a in self.acceptance:
            lines.append("")
            lines.append(f"Acceptance ({a['num_spec_tokens']} draft positions, {a['num_drafts']:.0f} drafts, mean "
                         f"acceptance length {a['mean_acceptance_length']:.2f}) from {a['source']}")
            lines.append("  P(accepted >= k): " + ", ".join(f"{x:.3f}" for x in a["marginal"]))
            lines.append("  use: --set 'speculative.acceptance=" + json.dumps(a["config"]).replace('"', "") + "'")
        if self.out:
            lines.append(f"\nwrote {self.out}")
        if self.acceptance_out:
            lines.append(f"wrote {self.acceptance_out}")
        return "\n".join(lines)


REPRICING_TOLERANCE = 0.02   # |re-priced - simulated| median APE (absolute) above which run() warns


def _repricing_warnings(repriced: list[dict[str, Any]], simulated: list[dict[str, Any]]) -> list[str]:
    """Where the fit's re-priced errors and the simulated ones at the same values disagree (all rows)."""
    sim = {g["metric"]: g["median_ape"] for g in simulated if g.get("model") == "all"}
    out = []
    for g in repriced:
        m = g["metric"]
        if g.get("model") == "all" and m in FIT_METRICS and m in sim and abs(g["median_ape"] - sim[m]) > REPRICING_TOLERANCE:
            out.append(f"{m}: re-priced median error {g['median_ape']:.1%} but {sim[m]:.1%} simulated at the fitted "
                       f"values (the schedules changed with the parameters); raise --rounds")
    return out


def _tables(df: pd.DataFrame) -> list[dict[str, Any]]:
    return error_table(df, ["model"]) + [{"model": "all", **g} for g in error_table(df, [])]


def _describe_sources(rows: pd.DataFrame, paths: list[Path]) -> str:
    """What a fit used: files, dates and engine versions (kept in the profile's fitted_on)."""
    def uniq(col: str) -> str:
        if col not in rows:
            return ""
        vals = sorted({str(v) for v in rows[col] if str(v) not in ("", "nan", "None")})
        return ", ".join(vals[:6]) + (f" (+{len(vals) - 6} more)" if len(vals) > 6 else "")
    parts = [f"files {', '.join(p.name for p in paths)}"]
    for col, label in (("source_id", "sources"), ("date", "dates"), ("framework_version", "engine")):
        u = uniq(col)
        if u:
            parts.append(f"{label} {u}")
    return "; ".join(parts)


V0_NOT_FITTED = ("vLLM < 0.8 ran the V0 engine (its scheduler is not the one simulated): "
                 "validated by `capacity validate`, not fitted")


def fit_exclusion(row: dict[str, Any]) -> str | None:
    """Why a serving row does not enter the fit (None: it does): what `row_scenario` cannot model,
    speculative rows, and V0-engine runs."""
    reason = row_scenario(row, speculative=False)[1]
    if reason is None and v0_engine(row):
        reason = V0_NOT_FITTED
    return reason


def _filter_gpu(rows: pd.DataFrame, profile: GpuProfile, given: str) -> pd.DataFrame:
    if rows.empty:
        return rows
    names = {profile.name.upper(), str(given).upper()}
    return rows[rows["gpu"].astype(str).str.upper().isin(names)]


def run(files: list[str] | None, gpu: str, out: str | None = None, holdout: float = 0.0, progress: bool = True,
        workers: int = 2, cross_validate: bool = True, seed: int = 0, max_rows: int | None = None,
        tp: int | None = None, model: str | None = None, sets: list[str] | None = None,
        rounds: int | None = None, keys: tuple[str, ...] | None = None,
        prior_weight: float | Mapping[str, float] = PRIOR_WEIGHT, hold: tuple[str, ...] = (),
        fit_also: tuple[str, ...] = ()) -> CalibrationResult:
    """Fit `gpu`'s efficiency parameters to measured serving runs (any format `readers` knows).

    `tp`, `model`, `sets` (column=value) fill what vLLM result files do not state. `rounds` (default: 2
    when a row has a request delay to fit or runs open loop, else 1) re-records the schedules at the
    fitted parameters and refits. `keys` forces the fitted parameters (default: the identifiable ones).
    `prior_weight` weighs the pull toward the profile's microbenchmark anchors (PRIOR_WEIGHT; 0: none): one
    number for every anchor or a mapping per PRIOR_KEYS efficiency (`prior_weights`).
    `hold` keeps these parameters at the profile's values (an ablation: the fit without one term);
    `fit_also` fits these OPT_IN_KEYS too (a screen of a term not shipped).
    """
    unknown = [k for k in fit_also if k not in OPT_IN_KEYS]
    if unknown:
        raise CapacityError(f"--fit {unknown[0]}: not an opt-in parameter; use one of {', '.join(OPT_IN_KEYS)}")
    unknown = [k for k in hold if k not in FITTED_KEYS]
    if unknown:
        raise CapacityError(f"--hold {unknown[0]}: not a fitted parameter; use one of {', '.join(FITTED_KEYS)}")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= 20):
        raise CapacityError(f"--rounds {rounds}: give a whole number from 1 to 20 (default: 1 or 2)")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CapacityError(f"--workers {workers}: give a whole number >= 1")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1):
        raise CapacityError(f"max_rows {max_rows}: give a whole number >= 1")
    weights = prior_weights(prior_weight)
    profile = load_gpu(gpu)
    if not 0.0 <= holdout < 1.0:
        raise CapacityError(f"--holdout {holdout}: give a fraction in [0, 1), e.g. 0.25")
    extra = _column_values(sets)
    paths = [Path(f) for f in files] if files else default_files()
    meas, rows, skipped = _read_rows(paths, profile, gpu, readers.Overrides(gpu=profile.name, tp=tp, model=model,
                                                                            extra=extra), max_rows)
    start = dict(profile.efficiency)
    recorder = _Recorder(profile, gpu, workers, progress)
    acceptance = [{**r.to_json(), "config": readers.acceptance_config(r)} for r in meas.acceptance]
    result = CalibrationResult(gpu=profile.name, fitted=dict(start), start=start, rows_used=0, skipped=skipped,
                               train_errors=[], acceptance=acceptance)
    if rows.empty:
        if not acceptance:
            raise CapacityError(f"no serving rows for GPU {profile.name} that the simulator can model "
                                f"({'; '.join(skipped) or 'none given'})")
        _write_acceptance(result, meas.acceptance, out)
        return result
    pricers = recorder.first(rows, skipped)
    result.warnings.extend(_load_shortfall_warnings(pricers))
    split = _holdout_split(len(pricers), holdout, seed)
    train, _ = split(pricers)
    if not train:
        raise CapacityError("--holdout leaves no rows to fit on; lower it")
    if keys is None:
        keys, not_fitted = identifiable_keys(train, start)
    else:
        not_fitted = {k: "held fixed by the caller" for k in FITTED_KEYS if k not in keys}
    for k in hold:
        if k in keys:
            keys = tuple(x for x in keys if x != k)
            not_fitted[k] = "held at the profile's value (--hold)"
    keys = opt_in_keys_fitted(keys, fit_also, start, not_fitted)
    if rounds is None:
        rounds = 2 if (has_request_delay(start) or any(p.rec.open_loop for p in pricers)) else 1
    prior = prior_efficiencies(profile)
    fit_kw = {"prior": prior, "prior_weight": weights}
    fitted, fitted_on_pricers, pricers, info = _fit_in_rounds(result, pricers, split, start, keys, rounds, fit_kw,
                                                              recorder)
    result.fitted, result.rows_used = fitted, len(split(pricers)[0])
    result.fitted_keys, result.not_fitted = tuple(keys), not_fitted
    train = _report_errors(result, fitted, fitted_on_pricers, pricers, split, info)
    if cross_validate:
        _leave_one_model_out(result, train, fitted, keys, fit_kw, recorder)
        if not files:   # the shipped rows: the family's other GPUs have theirs
            for sibling in transfer.siblings_with_rows(profile):
                rows_on_fit = transfer.predict(profile, sibling, efficiency=fitted, workers=workers, progress=progress)
                result.sibling_errors.append({"sibling": sibling, "errors": transfer.errors(rows_on_fit)})
    for reason, n in recorder.stale.items():
        result.warnings.append(f"{n} re-recordings failed ({reason}); those rows kept their earlier schedule, "
                               f"so their errors are re-priced, not simulated")
    train_rows = pd.DataFrame([p.rec.row for p in train])
    result.fitted_on = (f"capacity calibrate on {len(train)} rows ({_describe_sources(train_rows, paths)}), "
                        f"fitted {', '.join(keys)}"
                        + (f" with prior weight {_describe_weights(weights)} toward the microbenchmark anchors "
                           f"measured on this GPU ({', '.join(sorted(prior))})" if _active_prior(prior, weights) else "")
                        + f", {date.today()}")
    if out:
        save_profile(profile, out, {k: fitted[k] for k in keys}, result.fitted_on,
                     cross_validation_section(result, list(train_rows["model"]), [int(p.cost.tp) for p in train],
                                              " ".join(["capacity calibrate", *_command_words(gpu, hold, fit_also,
                                                                                               files)])
                                              + f" ({date.today()})") if cross_validate else None)
        result.out = out
    _write_acceptance(result, meas.acceptance, out)
    return result


def _command_words(gpu: str, hold: tuple[str, ...], fit_also: tuple[str, ...], files: list[str] | None) -> list[str]:
    """The calibrate command line that wrote a profile, for its `cross_validation.measured_by`."""
    return [*(str(f) for f in files or []), f"--gpu {gpu}", *(f"--hold {k}" for k in hold),
            *(f"--fit {k}" for k in fit_also)]


def _error_figures(table: list[dict[str, Any]]) -> dict[str, list[float]] | None:
    """The all-rows median / p90 (%) of each FIT_METRICS metric of an error table, or None without one."""
    overall = {g["metric"]: g for g in table if g.get("model") == "all"}
    if not all(m in overall for m in FIT_METRICS):
        return None
    name = {"output_tok_s_per_gpu": "output_tok_s_per_gpu_pct", "tpot_ms": "tpot_pct", "ttft_ms": "ttft_pct"}
    return {name[m]: [round(100 * overall[m]["median_ape"], 1), round(100 * overall[m]["p90_ape"], 1)]
            for m in ("output_tok_s_per_gpu", "tpot_ms", "ttft_ms")}


def cross_validation_section(result: CalibrationResult, models: list[str], tps: list[int],
                             measured_by: str) -> dict[str, Any] | None:
    """The `cross_validation` section of a written profile (hardware._CrossValidationModel): what the fit saw
    (rows, models as architecture ids, TP sizes) and its errors out of sample and on its own rows. None where the
    fit was not cross-validated or has no error table of its rows."""
    fitted = _error_figures(result.train_errors)
    if fitted is None or not result.lomo_errors and not result.lotpo_errors:
        return None
    aliases = model_aliases()
    return {"measured_by": measured_by, "rows": len(models),
            "models": sorted({aliases.get(str(m), str(m)) for m in models}),
            "tensor_parallel_sizes": sorted(set(tps)),
            "leave_one_model_out": _error_figures(result.lomo_errors),
            "leave_one_tp_size_out": _error_figures(result.lotpo_errors),
            "fitted_rows": fitted}


def _load_shortfall_warnings(pricers: list[Repricer]) -> list[str]:
    """One warning naming the closed-loop rows whose measured load falls short of what their users and
    simulated KV cache allow (`common.in_flight_ratio` under IN_FLIGHT_SHORTFALL): their scenario is not
    what the server ran. They stay in the fit."""
    short = []
    for p in pricers:
        rec = p.rec
        if rec.open_loop:
            continue
        users = parse_float(rec.row.get("concurrency_or_qps"))
        ratio = in_flight_ratio(rec.row, rec.scenario, users, rec.num_gpus,
                                float(np.mean(rec.prompt_tokens)), float(np.mean(rec.output_tokens)))
        if ratio < IN_FLIGHT_SHORTFALL:
            tp, isl, osl = (parse_float(rec.row.get(k)) for k in ("tp", "isl", "osl"))
            short.append(f"{rec.row.get('model')} TP{tp:g} {isl:g}/{osl:g} at {users:g} users ({ratio:.2f})")
    if not short:
        return []
    return [f"{len(short)} rows decode fewer requests at once (output tok/s x TPOT) than {IN_FLIGHT_SHORTFALL:g} x "
            f"min(users, what the simulated KV cache holds): the server ran with less KV cache or a load cap the "
            f"rows do not state (check kv_cache_dtype, max_num_seqs, the client); they stay in the fit: "
            + "; ".join(short[:3]) + ("; ..." if len(short) > 3 else "")]


def _describe_weights(weights: dict[str, float]) -> str:
    """'3' when every anchor has the same weight, else 'gemm 10, hbm 3, ...'."""
    if len(set(weights.values())) == 1:
        return f"{next(iter(weights.values())):g}"
    return ", ".join(f"{k} {w:g}" for k, w in weights.items())


# ---------------------------------------------------------------------------------------- run's steps

def _column_values(sets: list[str] | None) -> dict[str, str]:
    """--set column=value items as a mapping (the row columns vLLM result files do not state)."""
    extra = {}
    for item in sets or []:
        if "=" not in item:
            raise CapacityError(f"--set '{item}': expected column=value, e.g. precision=fp8")
        k, v = item.split("=", 1)
        extra[k.strip()] = v.strip()
    return extra


def _read_rows(paths: list[Path], profile: GpuProfile, gpu: str, ov: readers.Overrides,
               max_rows: int | None) -> tuple[readers.Measurements, pd.DataFrame, dict[str, int]]:
    """(what the files hold, the serving rows of the GPU that enter the fit, why the others do not: count)."""
    meas = readers.load(paths, ov)
    rows = _filter_gpu(meas.serving, profile, gpu)
    reasons = [fit_exclusion(r) for r in rows.to_dict(orient="records")]
    rows = rows[[r is None for r in reasons]]
    if max_rows:
        rows = rows.iloc[np.linspace(0, len(rows) - 1, min(max_rows, len(rows))).astype(int)]
    skipped: dict[str, int] = {}
    for reason in reasons:
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
    return meas, rows, skipped


class _Recorder:
    """Records rows on the profile being calibrated (a YAML path too, not the shipped profile of the
    row's GPU name) and re-records them at fitted values; `stale` counts the re-recordings that failed."""

    def __init__(self, profile: GpuProfile, gpu: str, workers: int, progress: bool):
        self.profile, self.gpu, self.workers, self.progress = profile, gpu, workers, progress
        self.stale: dict[str, int] = {}

    def first(self, rows: pd.DataFrame, skipped: dict[str, int]) -> list[Repricer]:
        """The rows recorded at the profile's values; a row that cannot be is counted in `skipped`."""
        pricers = []
        for rec in record_rows(rows, workers=self.workers, progress=self.progress, gpu=self.gpu):
            if isinstance(rec, str):
                skipped[rec] = skipped.get(rec, 0) + 1
            else:
                pricers.append(Repricer(rec, self.profile))
        if not pricers:
            raise CapacityError(f"no serving rows for GPU {self.profile.name} could be simulated ({'; '.join(skipped)})")
        return pricers

    def again(self, ps: list[Repricer], eff: dict[str, float]) -> list[Repricer]:
        """The same rows, in the same order, re-recorded at `eff`; a row that cannot be recorded there
        keeps its earlier schedule (counted in `stale`), so the row set never changes between rounds."""
        recs = record_rows([p.rec.row for p in ps], workers=self.workers, progress=self.progress, efficiency=eff,
                           gpu=self.gpu)
        out = []
        for p, rec in zip(ps, recs):
            if isinstance(rec, str):
                self.stale[rec] = self.stale.get(rec, 0) + 1
                out.append(p)
            else:
                out.append(Repricer(rec, self.profile))
        return out


def _holdout_split(n: int, holdout: float, seed: int) -> Callable[[list], tuple[list, list]]:
    """A split of any list of the n rows (in their order) into (fitted on, held out)."""
    rng = np.random.default_rng(seed)
    held = set(rng.choice(n, int(round(holdout * n)), replace=False).tolist()) if holdout else set()
    return lambda ps: ([p for i, p in enumerate(ps) if i not in held], [p for i, p in enumerate(ps) if i in held])


def _fit_in_rounds(result: CalibrationResult, pricers: list[Repricer], split: Callable, start: dict[str, float],
                   keys: tuple[str, ...], rounds: int, fit_kw: dict[str, Any], recorder: _Recorder
                   ) -> tuple[dict[str, float], list[Repricer], list[Repricer], dict[str, Any]]:
    """(the kept fit, the schedules it was fitted on, the schedules recorded at it, the fit's info).

    Every round's fit is checked by re-recording the rows at it (a full simulation, exact), and the
    fit with the lowest simulated cost is kept: re-pricing is exact only at its recording point, so the
    last round need not be best. (Until 2026-12-05 re-pricing kept a request in the late step it
    joined when the delay was lowered, and the rounds swung between two delays, MI300X 24 -> 66 ms;
    `Repricer.predict` now shifts a busy engine's request instead.)"""
    info: dict[str, Any] = {}
    train, _ = split(pricers)
    fitted = fit(train, start, keys, info=info, **fit_kw)
    candidates = []           # (simulated cost, fit, schedules it was fitted on, schedules recorded at it)
    for i in range(rounds):
        fitted_on_pricers = pricers
        pricers = recorder.again(pricers, fitted)     # re-record at the fitted values (same rows, same order)
        train, _ = split(pricers)
        candidates.append((simulated_cost(train, fitted, keys, **fit_kw), fitted, fitted_on_pricers, pricers))
        if i < rounds - 1:
            fitted = fit(train, fitted, keys, info=info, **fit_kw)
    _, fitted, fitted_on_pricers, pricers = min(candidates, key=lambda c: c[0])
    result.round_costs = [c[0] for c in candidates]
    kept = result.round_costs.index(min(result.round_costs))
    if kept < len(candidates) - 1:
        result.warnings.append(f"kept round {kept + 1}'s fit: simulated cost {result.round_costs[kept]:.4g} against "
                               f"{', '.join(f'{c:.4g}' for c in result.round_costs)} by round (the request delay swings "
                               f"between rounds)")
    return fitted, fitted_on_pricers, pricers, info


def _report_errors(result: CalibrationResult, fitted: dict[str, float], fitted_on_pricers: list[Repricer],
                   pricers: list[Repricer], split: Callable, info: dict[str, Any]) -> list[Repricer]:
    """The errors of the kept fit on the rows fitted on and held out, and the fit's warnings; returns
    the rows fitted on (their schedules recorded at the fit).

    Re-pricing is exact only at the recording point, so the reported errors come from the schedules
    re-recorded at the kept fit, i.e. what `capacity validate` simulates with it."""
    result.repriced_train_errors = _tables(predictions(split(fitted_on_pricers)[0], fitted))
    train, test = split(pricers)
    result.train_errors = _tables(predictions(train, fitted))
    result.warnings.extend(_repricing_warnings(result.repriced_train_errors, result.train_errors))
    if not info.get("converged", True):
        result.warnings.append(f"the fit did not converge ({info.get('message')}); check the runs and the errors")
    result.warnings.extend(_bound_warning(k, "upper", info["upper_bounds"][k]) for k in info.get("at_bound", []))
    result.warnings.extend(_bound_warning(k, "floor") for k in info.get("at_floor", []))
    if test:
        result.holdout_errors = _tables(predictions(test, fitted))
    return train


_BOUND_WARNINGS = {
    ("upper", True): "{k} landed on its bound {v:g} (past it the kernels would outrun the spec or measurement it is a fraction of): the runs are faster than the model allows; "
                     "check the GPU, TP, precision and model of the runs",
    ("upper", False): "{k} landed on its upper bound {v:g} (a failed fit: larger than the mechanism it stands for "
                      "allows); the runs are slower than the model explains",
    ("floor", True): "{k} landed on its floor {v:g} (a failed fit: slower than any kernel it stands for); the runs are "
                     "slower than the model explains",
    ("floor", False): "{k} fitted to 0 (its floor): these runs show none of that time, or another term carries it; "
                      "not identified by them",
}


def _bound_warning(key: str, side: str, value: float | None = None) -> str:
    """The warning for a fitted value on its upper bound or its floor (`BOUNDS`; `value`: the bound in force)."""
    if value is None:
        value = BOUNDS[key][1 if side == "upper" else 0]
    return _BOUND_WARNINGS[side, key in FRACTION_EFFICIENCY_KEYS].format(k=key, v=value)


def _leave_one_model_out(result: CalibrationResult, train: list[Repricer], fitted: dict[str, float],
                         keys: tuple[str, ...], fit_kw: dict[str, Any], recorder: _Recorder) -> None:
    """Leave-one-model-out and leave-one-TP-size-out cross-validation (`leave_one_group_out`), where
    the rows have more than one model or TP size."""
    result.lomo_errors, result.lomo_fits = leave_one_group_out(train, fitted, keys, fit_kw, recorder.again,
                                                               lambda p: str(p.rec.row["model"]))
    result.lotpo_errors, fits = leave_one_group_out(train, fitted, keys, fit_kw, recorder.again,
                                                    lambda p: int(p.cost.tp))
    result.lotpo_fits = {f"TP{tp}": f for tp, f in fits.items()}


def leave_one_group_out(train: list[Repricer], fitted: dict[str, float], keys: tuple[str, ...],
                        fit_kw: dict[str, Any], again: Callable[[list[Repricer], dict[str, float]], list[Repricer]],
                        group: Callable[[Repricer], Any]) -> tuple[list[dict[str, Any]], dict[Any, dict[str, float]]]:
    """(error table, fit per fold) of holding out each `group` of rows in turn: fit on the others, then
    simulate the held-out rows at the fold's fit (`again` re-records them there, not re-priced far from
    it). A key the fold's rows cannot identify (`identifiable_keys`: e.g. moe_int4 without the only int4
    model, allreduce without a TP > 1 row) is held at the full fit's value instead of drifting wherever
    the optimiser leaves it. Nothing (empty table) with one group."""
    groups = sorted({group(p) for p in train})
    if len(groups) <= 1:
        return [], {}
    oof, fits = [], {}
    for g in groups:
        rows = [p for p in train if group(p) != g]
        fold_keys = tuple(k for k in identifiable_keys(rows, fitted)[0] if k in keys)
        fits[g] = fit(rows, fitted, fold_keys, **fit_kw)
        if "attention_triton" in keys and "attention_triton" not in fold_keys:
            # the held-out rows are the only ones on the Triton kernel: what a GPU calibrated without them
            # has for it (a profile without the entry: the flash kernels' value), not the full fit's
            fits[g]["attention_triton"] = fits[g]["attention"]
        oof.append(predictions(again([p for p in train if group(p) == g], fits[g]), fits[g]))
    return _tables(pd.concat(oof, ignore_index=True)), fits


def _write_acceptance(result: CalibrationResult, records: list, out: str | None) -> None:
    """With --out PROFILE.yaml and spec-decode counters: PROFILE.acceptance.yaml, a scenario fragment."""
    if not (out and records):
        return
    by_n: dict[int, list] = {}
    for r in records:
        by_n.setdefault(r.num_spec_tokens, []).append(r)
    doc = {"speculative": {"num_speculative_tokens": max(by_n),
                           "acceptance": readers.acceptance_config(readers.pooled(by_n[max(by_n)]))}}
    path = Path(out).with_suffix("").as_posix() + ".acceptance.yaml"
    header = "".join(f"# fitted on {r.source}: {r.num_drafts:.0f} drafts, N={r.num_spec_tokens}, mean acceptance "
                     f"length {r.mean_acceptance_length:.3f}\n" for r in records)
    try:
        Path(path).write_text("# Acceptance measured by vLLM's spec-decode counters (capacity calibrate, "
                              f"{date.today()}). Merge into a scenario.\n" + header
                              + yaml.safe_dump(doc, sort_keys=False))
    except OSError as e:
        raise CapacityError(f"cannot write {path}: {e.strerror or e}") from None
    result.acceptance_out = path
