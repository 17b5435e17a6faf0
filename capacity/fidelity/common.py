"""What the fidelity checks share: error tables, the process pool, the fitted speculative costs
and the simulation of a scenario dict.

The checks import this module and each other in one direction only: `spec_serving` (the ROCm blog
rows) is used by `serving` (`capacity validate`) and `speedups` (the seed article); `calibrate`
uses `serving`.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.measurements.schemas import PREDICTED, REPORTED
from capacity.sim import simulate
from capacity.spec.decoding import build_speculation
from capacity.util.progress import Progress

METRICS = PREDICTED + (REPORTED,)

FITTED_PARAMETER = "draft_pass_overhead_us"
SEQ_KEY = "spec_seq_overhead_us"     # per-GPU host time per verifying sequence per step (hardware profile)
TOK_KEY = "spec_token_overhead_us"   # per-GPU time per verified draft token (hardware profile)


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------

def ape(pred: Iterable[float], meas: Iterable[float]) -> np.ndarray:
    """|pred - meas| / meas, element by element."""
    p, m = np.asarray(list(pred), dtype=float), np.asarray(list(meas), dtype=float)
    return np.abs(p - m) / m


def error_table(rows: pd.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
    """Median and p90 absolute percentage error of every predicted serving column (METRICS), grouped
    by `keys`."""
    out = []
    for metric in METRICS:
        pcol = f"predicted_{metric}"
        if pcol not in rows.columns or metric not in rows.columns:   # a user's file may omit measured columns
            continue
        meas = pd.to_numeric(rows[metric], errors="coerce")
        pred = pd.to_numeric(rows[pcol], errors="coerce")
        ok = meas.notna() & pred.notna() & (meas > 0)
        if not ok.any():
            continue
        sub = rows[ok].assign(ape=(pred[ok] - meas[ok]).abs() / meas[ok])
        for key, grp in sub.groupby(keys) if keys else [((), sub)]:
            key = key if isinstance(key, tuple) else (key,)
            out.append({**dict(zip(keys, key)), "metric": metric, "n": int(len(grp)),
                        "median_ape": float(grp.ape.median()), "p90_ape": float(grp.ape.quantile(0.9))})
    return out


# --------------------------------------------------------------------------------------------------
# Work
# --------------------------------------------------------------------------------------------------

def pool_map(fn: Callable, jobs: list, workers: int, progress: bool, label: str,
             title: str = "validate (speculative)", serial_below: int = 2) -> list:
    """`fn` of every job, in order: in a process pool of up to `workers` (no more than the CPUs or the
    jobs), or in this process for one worker or fewer than `serial_below` jobs. One progress line
    `title: label done/total`."""
    out = []
    prog = Progress(title, progress)
    workers = max(1, min(workers, os.cpu_count() or 1, len(jobs) or 1))
    if workers == 1 or len(jobs) < serial_below:
        for i, j in enumerate(jobs):
            out.append(fn(j))
            prog.update(label, i + 1, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, res in enumerate(pool.map(fn, jobs, chunksize=1)):
                out.append(res)
                prog.update(label, i + 1, len(jobs))
    prog.close()
    return out


def simulate_scenario(sc: dict[str, Any]):
    """simulate.run on a scenario dict, a speculative one with `build_speculation(allow_n_past_block=True)`
    (the seed article ran Kimi-K2.5's block-8 DFlash drafter at N = 11 and 15)."""
    scen = scenario_mod.from_dict(sc, sc.get("name", "scenario"))
    d = scen.deployment
    spec = None
    if scen.speculative.method not in ("none", "off", "") and scen.speculative.num_speculative_tokens > 0:
        gpu = load_gpu(d.gpu)
        if d.gpu_overrides:
            gpu = gpu.with_overrides(**d.gpu_overrides)
        model = load_model(d.model, weight_precision=d.precision, kv_dtype=d.kv_cache_dtype)
        spec = build_speculation(scen.speculative.model_dump(), gpu, model, d.tensor_parallel_size,
                                 allow_n_past_block=True,
                                 engine_limits=(scen.engine.max_num_seqs, scen.engine.max_num_batched_tokens,
                                                scen.engine.max_cudagraph_capture_size))
    return simulate.run(scen, speculation=spec)


# --------------------------------------------------------------------------------------------------
# Fitted speculative costs of a GPU
# --------------------------------------------------------------------------------------------------

def seq_key(gpu: str) -> str:
    """Fit-parameter name of one GPU's `spec_seq_overhead_us` (a hardware-profile value: host time)."""
    return f"{SEQ_KEY}@{gpu}"


def tok_key(gpu: str) -> str:
    """Fit-parameter name of one GPU's `spec_token_overhead_us` (a hardware-profile value)."""
    return f"{TOK_KEY}@{gpu}"


def gpu_cost_overrides(fitted: dict[str, float] | None, gpu: str) -> dict[str, float]:
    """The profile efficiency entries a fit sets for `gpu` (spec_seq_overhead_us, spec_token_overhead_us)."""
    return {name: fitted[key(gpu)] for name, key in ((SEQ_KEY, seq_key), (TOK_KEY, tok_key))
            if fitted and key(gpu) in fitted}


def with_efficiency(gpu_overrides: dict[str, Any] | None, values: dict[str, float]) -> dict[str, Any]:
    """`gpu_overrides` (a deployment's profile overrides) with `values` set in its efficiency entries."""
    over = dict(gpu_overrides or {})
    over["efficiency"] = {**over.get("efficiency", {}), **values}
    return over


# --------------------------------------------------------------------------------------------------
# A row's measured load against its simulated KV cache (docs/seed_validation.md section 30)
# --------------------------------------------------------------------------------------------------

# Measured requests decoding at once under this fraction of min(users, what the KV cache holds) says the
# server ran with less cache or a load cap the row does not state. basis: scripts/check_in_flight.py on the
# shipped rows (610 at 16+ users): every row but three is at 0.85 or more (median 0.97; users in their prefill or
# first-token wait are not decoding); H100's Llama-3.3-70B rows at their script's fp8 cache gave about 0.5,
# gpt-oss-120b at 512 users 0.12-0.25 (section 30). Above 1 (up to 1.65, B200) the simulator sizes the cache
# smaller than the server held; this check does not flag that side.
IN_FLIGHT_SHORTFALL = 0.8


def decoding_at_once(row: dict[str, Any], num_gpus: float) -> float:
    """Requests decoding at once by Little's law on the decode phase: output tokens per second x seconds
    per output token (NaN where a figure is missing). Depends on no fitted efficiency."""
    rate = pd.to_numeric(row.get("output_tok_s_per_gpu"), errors="coerce") * num_gpus
    return float(rate * pd.to_numeric(row.get("tpot_ms"), errors="coerce") / 1000.0)


def kv_holds_requests(scenario: dict[str, Any], mean_context_tokens: float) -> float:
    """How many requests of `mean_context_tokens` the KV cache the simulator sizes for `scenario` holds."""
    deployed = simulate.deploy(scenario_mod.from_dict(scenario))
    return deployed.memory["kv_cache_tokens"] / max(mean_context_tokens, 1.0)


def requests_allowed(scenario: dict[str, Any], users: float, kv_holds: float) -> float:
    """Requests a closed loop of `users` can have running at once: min(users, what the KV cache holds, the
    scenario's max_num_seqs where it sets one)."""
    return min(users, kv_holds, float(scenario.get("engine", {}).get("max_num_seqs") or np.inf))


def in_flight_ratio(row: dict[str, Any], scenario: dict[str, Any], users: float, num_gpus: float,
                    mean_prompt_tokens: float, mean_output_tokens: float) -> float:
    """A closed-loop row's requests decoding at once over `requests_allowed`, the KV cache's capacity taken at the
    mean context (prompt + half the output); NaN where a figure is missing."""
    holds = kv_holds_requests(scenario, mean_prompt_tokens + mean_output_tokens / 2.0)
    return decoding_at_once(row, num_gpus) / requests_allowed(scenario, users, holds)
