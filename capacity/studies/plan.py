"""`capacity plan`: how many GPUs, which ones, with which speculative decoding, for a traffic and SLOs.

For every candidate (GPU × tensor-parallel size × speculation setting × engine limits) the
planner finds the highest request rate one replica sustains within the SLOs, then the replicas
needed for the target rate with the stated headroom, and ranks candidates by GPU count, then by
$/hour. Two stages keep it fast:

1. Analytic bracket (all candidates): a mean-value model of continuous batching built on the same
   step cost model as the simulator. At rate λ a replica holds B decoding requests; each needs
   O / E[τ] steps (E[τ] tokens per step with speculation), so by Little's law
   B = λ · (O / E[τ]) · t(B), where t(B) is the step time with B decodes plus the prefill tokens
   arriving per step (λ · P · t). The largest λ with a fixed point whose TPOT (t / E[τ]) and TTFT
   (about one step with a prefill chunk plus queueing) meet the SLOs, and whose KV fits, is the
   analytic estimate.
2. Simulation (the best candidates): single-replica probes around the estimate give the sustained
   rate per replica.
3. Confirmation: the best simulated candidate's whole cluster is simulated at target × (1 + headroom)
   and the fewest replicas that meet the SLOs there are searched (`search_replicas`: bracket by
   doubling steps, then bisect; no step limit), so the recommendation meets them and one replica
   fewer misses, both simulated. A candidate whose estimate still ranks ahead is confirmed too (at
   most `_CONFIRM_AT_MOST`); the recommendation is the best confirmed one. Its row's rate is the
   confirmed rate per replica, so every row's replicas = ceil(target × (1 + headroom) / rate), and
   each row says whether its rate is confirmed, simulated on one replica, or analytic.
4. Verdicts (`judge`): an SLO is judged over the steady state (the first `WARMUP_FRACTION` of
   arrivals left out), on runs long enough for its percentile (`evidence_requests`: p99 rests on
   1,000 requests), with a distribution-free confidence interval of the percentile
   (`percentile_interval`, binomial order statistics) and the margin to the threshold with its ±.
5. The answer as a deployment (`deployment`): servers of the GPU's scale-up size, and per replica the
   `vllm serve` line and the `vllm bench serve` line that checks it; what decides it (`context`, with the
   step cost's cross-validated error for this model and TP size, `step_cost_fidelity.expected_error`) and
   re-planned what-ifs (`sensitivity`: acceptance −10/−20/−30 %, traffic × 1.5/× 2, every step slower by that
   error's p90).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import os
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from capacity.cost.step_cost import (StepFeatures, int4_default_tiles, quick_reduce_rule, resolve_moe_backend,
                                     runs_int4_triton_moe)
from capacity.errors import CapacityError
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import (ATTENTION_BACKEND_KEYS, FRACTION_EFFICIENCY_KEYS, GpuProfile, int4_tile_table,
                                      load_gpu)
from capacity.inputs.models import ModelArch, load_model
from capacity.inputs.step_cost_fidelity import expected_error, margin_against_error
from capacity.inputs.traffic import TrafficConfig, build_requests, expected_requests_per_session
from capacity.sim import simulate, summary
from capacity.sim.metrics import STEADY_WARMUP_FRACTION, parse_slos
from capacity.spec.methods import NO_SPECULATION, find_method, list_methods
from capacity.util.jsonio import write_json
from capacity.util.progress import Progress
from capacity.util.text import quote


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SpecOption(_Strict):
    method: str = "none"
    num_speculative_tokens: list[Annotated[int, Field(ge=0, le=64)]] | Annotated[int, Field(ge=0, le=64)] = 0

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        # even with N = 0: an unknown name would otherwise be planned as "speculation <name> N=0"
        if str(value).strip().lower() not in NO_SPECULATION and find_method(value) is None:
            raise ValueError(f"unknown speculative method {quote(str(value), 60)!r}; use none or one of "
                             f"{', '.join(m.name for m in list_methods())}")
        return value
    draft: str | None = None
    acceptance: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None


class SearchSpace(_Strict):
    gpu: list[str] = Field(default_factory=lambda: ["MI300X", "MI355X"])
    tensor_parallel_size: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    speculative: list[SpecOption] = Field(default_factory=lambda: [SpecOption()])
    max_num_seqs: list[int] | None = None
    max_num_batched_tokens: list[int] | None = None


class PlanConfig(_Strict):
    target_rate_rps: float = Field(gt=0, description="requests per second the cluster must serve")
    headroom: float = Field(0.2, ge=0, le=4, description="plan for target × (1 + headroom)")
    search: SearchSpace = Field(default_factory=SearchSpace)
    simulate_top: int = Field(6, ge=1, description="candidates simulated one replica at a time in each shortlist round")
    requests_per_probe: int = Field(300, ge=50)
    max_replicas: int = Field(256, ge=1)


@dataclass
class Candidate:
    gpu: str
    tensor_parallel_size: int
    method: str
    num_speculative_tokens: int
    engine: dict[str, int]
    spec: dict[str, Any]
    feasible: bool = True
    reason: str | None = None
    analytic_rate_rps: float = 0.0
    max_rate_per_replica_rps: float = 0.0
    simulated: bool = False
    replicas: int = 0
    total_gpus: int = 0
    cost_per_hour_usd: float = 0.0
    cost_per_gpu_hour_usd: float = 0.0
    confirmed: bool = False
    # the speed per user and throughput per GPU of the run its rate comes from (simulated rows only)
    tok_s_per_user_p50: float | None = None
    output_throughput_tok_s_per_gpu: float | None = None
    # how the row's per-replica rate was found, in words (analytic model, one simulated replica, or
    # the whole cluster confirmed by simulation)
    basis: str = "analytic estimate (mean-value model, not simulated)"

    @property
    def label(self) -> str:
        n = f" N={self.num_speculative_tokens}" if self.method != "none" else ""
        eng = "".join(f" {'seqs' if k == 'max_num_seqs' else 'tokens'}={v}" for k, v in self.engine.items())
        return f"{self.gpu} TP{self.tensor_parallel_size} {self.method}{n}{eng}"

    def row(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("spec",)}
        d["label"] = self.label
        return d


def expand(space: SearchSpace) -> list[Candidate]:
    engines = [dict(zip(("max_num_seqs", "max_num_batched_tokens"), combo)) for combo in itertools.product(
        space.max_num_seqs or [None], space.max_num_batched_tokens or [None])]
    engines = [{k: v for k, v in e.items() if v is not None} for e in engines]
    out = []
    for gpu, tp, opt, eng in itertools.product(space.gpu, space.tensor_parallel_size, space.speculative, engines):
        ns = opt.num_speculative_tokens if isinstance(opt.num_speculative_tokens, list) else [opt.num_speculative_tokens]
        if opt.method == "none":
            ns = [0]
        for n in ns:
            spec = {"method": opt.method, "num_speculative_tokens": n, "draft": opt.draft,
                    "acceptance": opt.acceptance, "policy": opt.policy}
            out.append(Candidate(gpu, tp, opt.method, n, eng, spec))
    if not out:
        raise CapacityError("plan.search is empty: list at least one GPU, TP size and speculative option")
    return out


def candidate_scenario(base: dict[str, Any], c: Candidate, rate: float, replicas: int = 1,
                       num_requests: int | None = None, router: str | None = None) -> dict[str, Any]:
    """The base scenario on candidate `c` with `replicas` replicas at `rate` requests per second
    (Poisson, or the base's conversations at the session rate that gives it), `num_requests` long,
    behind `router` when given (the plan's cache-aware choice, _Setup.router)."""
    sc = copy.deepcopy(base)
    sc.pop("plan", None)
    sc["deployment"].update({"gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size, "replicas": replicas})
    sc.setdefault("engine", {}).update(c.engine)
    sc["speculative"] = {k: v for k, v in c.spec.items() if v is not None}
    arrival = sc["traffic"].get("arrival") or {}
    if arrival.get("process") == "sessions":
        # conversations keep their shape; the session rate gives `rate` requests per second
        per_session = expected_requests_per_session(TrafficConfig.model_validate(sc["traffic"]))
        sc["traffic"]["arrival"] = {**arrival, "rate_sessions_per_s": float(rate) / per_session}
        sc["traffic"]["arrival"].pop("rate_profile", None)      # the plan probes steady load (the peak)
        if num_requests:
            sc["traffic"]["arrival"]["num_sessions"] = max(1, math.ceil(int(num_requests) / per_session))
            sc["traffic"].pop("duration_s", None)
            sc["traffic"].pop("num_requests", None)
    else:
        sc["traffic"]["arrival"] = {"process": "poisson", "rate_rps": float(rate)}
        if num_requests:
            sc["traffic"]["num_requests"] = int(num_requests)
            sc["traffic"].pop("duration_s", None)
    if replicas > 1 and router:
        sc["deployment"]["router"] = router
    return sc


# ---------------------------------------------------------------------------------------------- analytic
def analytic_max_rate(scenario_dict: dict[str, Any], slos: list, mean_prompt: float, mean_output: float,
                      p99_prompt: float | None = None, mean_prefill: float | None = None,
                      p99_prefill: float | None = None) -> float:
    """Largest λ (req/s per replica) whose mean-value steady state meets the latency SLOs.

    Parametrised by the decode batch B instead of λ: with S = O / E[τ] steps per request, the
    prefill tokens per step are B·P/S whatever λ is, the step time is t(B) = step(B decodes,
    B·P/S prefill tokens) and Little's law gives λ(B) = B / (S · t(B)). One vectorised pass over a
    grid of B prices every candidate batch at once. With prefix caching a request computes only
    `mean_prefill` of its `mean_prompt` tokens (the rest is found in the cache), while its
    attention and KV still span the whole prompt.
    """
    mean_prefill = mean_prompt if mean_prefill is None else mean_prefill
    sc = scenario_mod.from_dict(scenario_dict, "plan candidate")
    dep = simulate.deploy(sc)
    cost, spec, m = dep.cost, dep.speculation, dep.model
    k = sc.speculative.num_speculative_tokens if sc.speculative.method != "none" else 0
    acc = spec.acceptance
    tau = float(acc.expected_tokens(k)) if (acc is not None and k) else 1.0
    budget = float(sc.engine.max_num_batched_tokens)
    kv_tokens = dep.memory["kv_cache_tokens"]
    ctx = mean_prompt + mean_output / 2.0
    # a class's own SLO needs that class's sizes: the bracket uses the SLOs on every request, the
    # simulations judge the rest
    slos = [s for s in slos if getattr(s, "class_name", None) is None]
    tpot_limit = min((s.threshold for s in slos if s.metric == "tpot" and s.op == "<"), default=math.inf) / 1e3
    ttft_limit = min((s.threshold for s in slos if s.metric == "ttft" and s.op == "<"), default=math.inf) / 1e3
    user_min = max((s.threshold for s in slos if s.metric == "tok_s_per_user" and s.op == ">"), default=0.0)
    if user_min > 0:
        tpot_limit = min(tpot_limit, 1.0 / user_min)
    steps_per_request = mean_output / tau
    b = np.unique(np.round(np.geomspace(1, max(sc.engine.max_num_seqs, 1), 48)))
    attention_flops = cost.tables.attention_flops   # the model's, with the backend's query-tile padding
    decode_attn = float(attention_flops(np.array([1.0 + k]), np.array([ctx + 1 + k]))[0])
    decode_kv = float(m.kv_read_bytes(np.array([ctx + 1 + k]))[0])

    def step(prefill: np.ndarray) -> np.ndarray:
        """Step time with b decoding requests and `prefill` prompt tokens in the same step."""
        chunk = np.maximum(prefill, 1.0)
        pre_ctx = np.maximum(mean_prompt, chunk)
        has = prefill > 0
        f = StepFeatures(num_tokens=b * (1 + k) + prefill, num_seqs=b + has, num_sampled=b * (1 + k) + has,
                         attn_flops=b * decode_attn + has * attention_flops(chunk, pre_ctx),
                         kv_read_bytes=b * decode_kv + has * m.kv_read_bytes(pre_ctx),
                         verify_seqs=b * (k > 0))
        t = np.asarray(cost.total_time(f), dtype=float)
        if k:
            t = t + spec.draft_time_steps(b, f.num_tokens, b * ctx, k)
        return t

    # New prompts arrive q = B / S per step. Below one per step, a step either carries a whole
    # prompt or none (decode steps are memory-bound, prompt steps compute-bound: they do not
    # overlap), so the mean step is the mix of the two; above one, prompts share steps.
    q = b / steps_per_request
    t_decode, t_prompt = step(np.zeros_like(b)), step(np.minimum(np.full_like(b, max(mean_prefill, 1.0)), budget))
    t_many = step(np.minimum(q * mean_prefill, budget))
    t = np.where(q <= 1.0, (1.0 - q) * t_decode + q * t_prompt, t_many)
    lam = b / (steps_per_request * t)
    tpot = t / tau
    # TTFT p99: a long (p99) prompt waits for the step in progress, then needs its own step(s),
    # inflated by queueing behind other prompts (M/D/1-like 1/(1 − ρ), ρ = share of time in prompt
    # steps). A bracket for the simulator, not a prediction.
    p99 = float(p99_prefill if p99_prefill is not None else (p99_prompt or mean_prompt))
    room = np.maximum(budget - b * (1 + k), 1.0)
    t_long = step(np.minimum(np.full_like(b, p99), room)) * np.ceil(p99 / room)
    rho = np.minimum(q * t_prompt / t, 0.99)
    ttft = (0.5 * t + t_long) / (1.0 - rho)
    ok = ((tpot <= tpot_limit) & (ttft <= ttft_limit) & (b * (mean_prompt + mean_output) <= kv_tokens)
          & (q * mean_prefill < budget))
    return float(lam[ok].max()) if ok.any() else 0.0


# ---------------------------------------------------------------------------------------------- simulation
def _simulate(scenario_dict: dict[str, Any], explain: bool = False) -> dict[str, Any]:
    try:
        res = simulate.run(scenario_mod.from_dict(scenario_dict, "plan candidate"))
    except CapacityError as e:
        return {"error": str(e)}
    m = res.metrics
    acceptance = res.deployed.speculation.acceptance
    return {"ok": bool(m.get("slo_met")) and res.stable, "stable": res.stable, "metrics": m,
            "payload": summary.simulation_payload(res), "requests": res.requests,
            "acceptance_basis": getattr(acceptance, "provenance", None),
            "speculation_by_batch": summary.speculation_by_batch(res) if explain else None,
            "_result": res}


def _probe(args) -> tuple[int, float, bool, tuple[float | None, float | None]]:
    idx, scenario_dict, rate = args
    r = _simulate(scenario_dict)
    return idx, rate, bool(r.get("ok")), _point(r.get("metrics") or {})


def _point(m: dict[str, Any]) -> tuple[float | None, float | None]:
    """(median tok/s per user, output tok/s per GPU) of a run's metrics, for the Pareto figure."""
    return (m.get("tok_s_per_user") or {}).get("p50"), m.get("output_throughput_tok_s_per_gpu")


@dataclass
class PlanResult:
    recommendation: dict[str, Any]
    candidates: list[dict[str, Any]]
    evidence: dict[str, Any]
    recommended_scenario: dict[str, Any]
    one_fewer_scenario: dict[str, Any] | None
    evidence_requests: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        dep = self.recommendation.get("deployment") or {}
        return {"recommendation": self.recommendation,
                # the answer as something to deploy (also under recommendation.deployment)
                "servers": dep.get("servers"), "vllm_serve": dep.get("vllm_serve"),
                "vllm_bench_serve": dep.get("vllm_bench_serve"),
                "sensitivity": self.recommendation.get("sensitivity"),
                "candidates": self.candidates, "evidence": self.evidence}   # no wall time: reruns compare byte for byte


@dataclass
class _Setup:
    """What every stage reads: the scenario (with its plan section), the plan settings, the SLOs and
    the traffic's prompt and output sizes."""

    base: dict[str, Any]
    cfg: PlanConfig
    slos: list
    mean_prompt: float
    mean_output: float
    p99_prompt: float
    target: float                       # the rate the replicas are sized for: target × (1 + headroom)
    # prefix caching: prompt tokens computed (not found in the cache) on one replica that never
    # evicts, mean and p99, and the router that keeps the hits when there are several replicas
    mean_prefill: float | None = None
    p99_prefill: float | None = None
    cached_share: float = 0.0
    router: str | None = None


def _setup(scenario_name: str | None, overrides: list[str] | None) -> _Setup:
    path, data = scenario_mod.read_yaml(scenario_name)
    if not isinstance(data, dict):
        raise CapacityError(f"{path}: a scenario is a YAML mapping with deployment, traffic, slo and plan sections")
    base = scenario_mod.apply_overrides(data, overrides or [])
    if "plan" not in base:
        raise CapacityError(f"{path}: no plan section: add plan: {{target_rate_rps: ..., search: ...}} (see scenarios/default.yaml)")
    try:
        cfg = PlanConfig.model_validate(base["plan"])
    except ValidationError as e:
        raise CapacityError(scenario_mod.one_line(e, f"{path}: plan")) from None
    sc0 = scenario_mod.from_dict({k: v for k, v in base.items() if k != "plan"}, str(path))
    # a name nothing knows is bad input, said at once, not an infeasible candidate found after the search
    for gpu in cfg.search.gpu:
        load_gpu(gpu)
    d = sc0.deployment
    load_model(d.model, weight_precision=d.precision, kv_dtype=d.kv_cache_dtype)
    if not sc0.slo:
        raise CapacityError(f"{path}: a plan needs SLOs: set slo: 'ttft:p99<1s;tpot:p90<25ms'")
    slos = parse_slos(sc0.slo)
    names = [c.name for c in sc0.traffic.classes] or None
    bad = [x for x in slos if x.class_name is not None and names is not None and x.class_name not in names]
    if bad:
        raise CapacityError(f"{path}: SLO '{bad[0]}' names request class '{bad[0].class_name}'; the traffic's "
                            f"classes are {', '.join(map(repr, names))}")
    stream = build_requests(sc0.traffic, np.random.default_rng(0))
    st = _Setup(base, cfg, slos, float(stream.prompt_tokens.mean()), float(stream.output_tokens.mean()),
                float(np.percentile(stream.prompt_tokens, 99)), cfg.target_rate_rps * (1 + cfg.headroom))
    if sc0.engine.enable_prefix_caching and stream.prefix_keys is not None:
        cached = unbounded_cached_tokens(stream, sc0.engine.block_size)
        prefill = stream.prompt_tokens - cached
        st.mean_prefill, st.p99_prefill = float(prefill.mean()), float(np.percentile(prefill, 99))
        st.cached_share = float(cached.sum() / stream.prompt_tokens.sum())
        st.router = "session_affinity" if stream.follows is not None else "prefix_aware"
    return st


def unbounded_cached_tokens(stream, block_size: int) -> np.ndarray:
    """Prompt tokens each request finds in a prefix cache that never evicts, all requests on one
    replica, each earlier turn of a conversation done before the next is sent: the longest prefix
    of its blocks that an earlier request computed (its first floor((prompt + output - 1) / bs)
    blocks), capped at floor((prompt - 1) / bs) blocks (vLLM's get_computed_blocks). The ceiling a
    router can keep; the simulation gives the real figure."""
    n = len(stream)
    order = np.arange(n)
    if stream.follows is not None:                  # turns in conversation order: by depth in the chain
        follows = np.asarray(stream.follows)
        depth = np.zeros(n, dtype=np.int64)
        up = follows.copy()
        while (up >= 0).any():                      # one step up every chain at once
            depth += up >= 0
            up = np.where(up >= 0, follows[np.maximum(up, 0)], -1)
        order = np.lexsort((np.arange(n), depth))
    seen: set[int] = set()
    cached = np.zeros(n, dtype=np.int64)
    prompt, output = stream.prompt_tokens, stream.output_tokens
    for i in order.tolist():
        keys = stream.prefix_keys.block_keys(i, block_size)
        p = int(prompt[i])
        h = 0
        for key in keys[: (p - 1) // block_size]:
            if key not in seen:
                break
            h += 1
        cached[i] = h * block_size
        seen.update(keys[: (p + int(output[i]) - 1) // block_size])
    return cached


def _screen(st: _Setup, cands: list[Candidate], prog: Progress) -> None:
    """Stage 1: the analytic bracket for every candidate, sized by it; an error or no rate at all
    marks a candidate infeasible, and no feasible candidate at all is an error."""
    for i, c in enumerate(cands):
        prog.update("analytic bracket", i + 1, len(cands))
        try:
            c.cost_per_gpu_hour_usd = load_gpu(c.gpu).cost_per_gpu_hour_usd
            c.analytic_rate_rps = analytic_max_rate(candidate_scenario(st.base, c, 1.0), st.slos, st.mean_prompt,
                                                    st.mean_output, st.p99_prompt, st.mean_prefill, st.p99_prefill)
        except CapacityError as e:
            c.feasible, c.reason = False, str(e)
            continue
        if c.analytic_rate_rps <= 0:
            c.feasible, c.reason = False, "cannot meet the SLOs even at a trickle of traffic"
        else:
            c.max_rate_per_replica_rps = c.analytic_rate_rps
            _size(c, st.target, st.cfg.max_replicas)
    if not any(c.feasible for c in cands):
        reasons = sorted({c.reason for c in cands if c.reason})
        raise CapacityError(f"no candidate meets the SLOs: {reasons[0] if reasons else 'none feasible'}; "
                            "widen plan.search (more GPUs/TP) or relax the slo")


def _shortlist(cands: list[Candidate], round_: int, size: int) -> list[Candidate]:
    """The next candidates to simulate: the best unsimulated one of each (GPU, TP, method) family, by
    analytic GPU count, then cost, so that the shortlist is diverse (and in the first round the best
    plain-decoding one, which speculation is compared with); empty once no unsimulated candidate
    ranks ahead of the best simulated one."""
    pending = sorted([c for c in cands if c.feasible and not c.simulated],
                     key=lambda c: (c.total_gpus, c.cost_per_hour_usd, -c.analytic_rate_rps))
    simulated = [c for c in cands if c.feasible and c.simulated]
    best_sim = min(simulated, key=lambda c: (c.total_gpus, c.cost_per_hour_usd), default=None)
    if not pending or (best_sim is not None and (pending[0].total_gpus, pending[0].cost_per_hour_usd)
                       >= (best_sim.total_gpus, best_sim.cost_per_hour_usd)):
        return []
    top, seen = [], set()
    plain = [c for c in pending if c.method == "none"]
    if round_ == 0 and plain:
        top.append(plain[0])
        seen.add((plain[0].gpu, plain[0].tensor_parallel_size, plain[0].method))
    for c in pending:
        key = (c.gpu, c.tensor_parallel_size, c.method)
        if key not in seen:
            seen.add(key)
            top.append(c)
        if len(top) >= size:
            break
    return top


# Probed rates of a shortlisted candidate, as fractions of its (rescaled) analytic rate.
_PROBE_FACTORS = (0.4, 0.6, 0.8, 1.0)


def _probe_shortlist(st: _Setup, top: list[Candidate], ratio: float, workers: int, round_: int,
                     prog: Progress) -> None:
    """Simulate each shortlisted candidate at the probe rates (in parallel); its sustained rate is the
    highest that met the SLOs, and none at all makes it infeasible."""
    jobs = [(i, candidate_scenario(st.base, c, c.analytic_rate_rps * ratio * f, num_requests=st.cfg.requests_per_probe),
             c.analytic_rate_rps * ratio * f) for i, c in enumerate(top) for f in _PROBE_FACTORS]
    results: dict[int, list[tuple[float, bool]]] = {}
    points: dict[tuple[int, float], tuple[float | None, float | None]] = {}
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for idx, rate, ok, point in pool.map(_probe, jobs):
            results.setdefault(idx, []).append((rate, ok))
            points[(idx, rate)] = point
            done += 1
            prog.update(f"simulating candidates (round {round_ + 1})", done, len(jobs))
    for i, c in enumerate(top):
        ok_rates = [r for r, ok in results.get(i, []) if ok]
        c.simulated = True
        if ok_rates:
            c.max_rate_per_replica_rps = max(ok_rates)
            c.tok_s_per_user_p50, c.output_throughput_tok_s_per_gpu = points[(i, c.max_rate_per_replica_rps)]
            c.basis = (f"simulated: one replica met the SLOs at {c.max_rate_per_replica_rps:.2f} req/s "
                       f"({st.cfg.requests_per_probe} requests)")
            _size(c, st.target, st.cfg.max_replicas)
        else:
            c.feasible, c.reason = False, "missed the SLOs in simulation at every probed rate"


def _rescale(st: _Setup, cands: list[Candidate], ratio: float) -> float:
    """Rescale the unsimulated candidates' analytic rates by the median simulated/analytic ratio so
    far (and re-size them); that ratio, or `ratio` unchanged if nothing has been simulated."""
    found = [c.max_rate_per_replica_rps / c.analytic_rate_rps for c in cands
             if c.simulated and c.feasible and c.analytic_rate_rps > 0]
    if not found:
        return ratio
    ratio = float(np.median(found))
    for c in cands:
        if c.feasible and not c.simulated:
            c.max_rate_per_replica_rps = c.analytic_rate_rps * ratio
            c.basis = f"analytic estimate × {ratio:.2f} (the simulated/analytic median; not simulated)"
            _size(c, st.target, st.cfg.max_replicas)
    return ratio


def _simulate_best(st: _Setup, cands: list[Candidate], workers: int, prog: Progress) -> None:
    """Stage 2: up to three rounds of shortlist, probe by simulation, rescale the rest, while an
    unsimulated candidate still ranks first."""
    ratio = 1.0
    for round_ in range(3):
        top = _shortlist(cands, round_, st.cfg.simulate_top)
        if not top:
            break
        _probe_shortlist(st, top, ratio, workers, round_, prog)
        ratio = _rescale(st, cands, ratio)


def _ranked(cands: list[Candidate]) -> list[Candidate]:
    """The feasible candidates by GPU count, then cost; confirmed, then simulated ones first."""
    return sorted([c for c in cands if c.feasible],
                  key=lambda c: (c.total_gpus, c.cost_per_hour_usd, not c.confirmed, not c.simulated))


def _check_simulated(cands: list[Candidate]) -> None:
    if not any(c.feasible and c.simulated for c in cands):
        raise CapacityError("no candidate met the SLOs in simulation; relax the slo or widen plan.search")


# Evidence runs: the requests of the warm-up (the first tenth of arrivals, while the replicas fill
# from empty: assumed, not measured) are left out of the percentiles that judge the SLOs, and a run
# is long enough for the highest percentile it judges to rest on about ten requests past it
# (p99: 1,000 steady-state completions).
WARMUP_FRACTION = STEADY_WARMUP_FRACTION
_TAIL_SAMPLES = 10
CONFIDENCE = 0.95
# At most this many simulated candidates are confirmed as whole clusters (best first); the
# recommendation is the best confirmed one, the rest keep their single-replica estimate.
_CONFIRM_AT_MOST = 3


def evidence_requests(slos: list, replicas: int, floor: int) -> int:
    """Requests per evidence run: enough that, after the warm-up, the highest judged percentile has
    `_TAIL_SAMPLES` requests beyond it (p99 -> 1,000 steady-state completions), at least `floor`
    and 200 × sqrt(replicas)."""
    top = max([float(s.stat[1:]) for s in slos if s.stat.startswith("p")] or [50.0])
    tail = max(1.0 - top / 100.0, 1e-4)
    steady = math.ceil(_TAIL_SAMPLES / tail - 1e-9)
    return max(floor, int(200 * math.sqrt(replicas)), math.ceil(steady / (1.0 - WARMUP_FRACTION)))


def percentile_interval(values: np.ndarray, q: float, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the q-th percentile from n samples: the order
    statistics x_(l) and x_(u) (1-based) with l = F⁻¹(α/2) and u = F⁻¹(1 − α/2) + 1 for F the
    Binomial(n, q/100) CDF, which cover the true percentile with probability ≥ confidence
    (the number of samples below it is Binomial(n, q/100)). None for no samples; a rank off
    either end is clamped to the extreme sample."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 0:
        return None
    a = (1.0 - confidence) / 2.0
    cdf = _binomial_cdf(n, q / 100.0)
    lo = int(np.searchsorted(cdf, a - 1e-12))             # the smallest k with F(k) >= α/2
    hi = int(np.searchsorted(cdf, 1.0 - a - 1e-12)) + 1   # the smallest k with F(k) >= 1 − α/2, plus one
    return float(x[min(max(lo, 1), n) - 1]), float(x[min(max(hi, 1), n) - 1])


def _binomial_cdf(n: int, p: float) -> np.ndarray:
    """F(k) = P(Binomial(n, p) <= k) for k = 0..n, from log-space probabilities (no scipy)."""
    k = np.arange(n + 1, dtype=float)
    if p <= 0.0 or p >= 1.0:
        return (k >= (0 if p <= 0.0 else n)).astype(float)
    lg = np.array([math.lgamma(i + 1.0) for i in range(n + 1)])
    logpmf = lg[n] - lg - lg[::-1] + k * math.log(p) + (n - k) * math.log1p(-p)
    return np.minimum(np.cumsum(np.exp(logpmf)), 1.0)


def judge(run: dict[str, Any], slos: list) -> dict[str, Any]:
    """The SLO verdict of an evidence run: each SLO's achieved value over the steady-state requests
    (warm-up left out; for conversations also the turns sent after the last conversation started), its confidence interval and the margin to the threshold with its ±, and
    `ok`: the run's own verdict (stable, every SLO met over the whole run, as `capacity simulate`
    says) and every SLO met in the steady state."""
    from capacity.sim.metrics import offered_until_s, per_request_frame

    if not run.get("metrics") or run.get("requests") is None:
        return {"ok": False, "slo": [], "steady_requests": 0}
    df = per_request_frame(run["requests"])
    df = df[~np.isnan(df["arrival_s"].to_numpy(float))].sort_values("arrival_s", kind="stable")
    steady = df.iloc[int(len(df) * WARMUP_FRACTION):]
    # conversations: after the last one starts the load falls below the planned rate (metrics.offered_until_s)
    steady = steady[steady["arrival_s"].to_numpy(float) <= offered_until_s(df)]
    steady = steady[steady["completed"]]
    col = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms", "tok_s_per_user": "tok_s_per_user"}
    rows, ok = [], bool(run.get("ok"))
    for s in slos:
        row: dict[str, Any] = {"slo": str(s), "threshold": s.threshold}
        if s.metric in col:
            part = steady if s.class_name is None else steady[steady["class_name"].astype(str) == s.class_name]
            v = part[col[s.metric]].to_numpy(float)
            v = v[~np.isnan(v)]
            row["samples"] = int(v.size)
            if v.size and s.stat.startswith("p"):
                q = float(s.stat[1:])
                ach = float(np.percentile(v, q))
                row["interval"] = percentile_interval(v, q)
            elif v.size:
                ach = float({"mean": np.mean, "min": np.min, "max": np.max}[s.stat](v))
            else:
                ach = None
            row["basis"] = "steady state (first {:.0%} of arrivals left out)".format(WARMUP_FRACTION)
        else:  # ITL has no per-request value: the whole run's statistic
            ach = next((r.get("achieved") for r in run["metrics"].get("slo") or [] if r["slo"] == str(s)), None)
            row["basis"] = "whole run"
        row["achieved"] = ach
        row["met"] = ach is not None and s.holds(ach)
        if ach is not None:
            sign = 1.0 if s.op == "<" else -1.0
            row["margin"] = sign * (s.threshold - ach) / s.threshold
            if row.get("interval"):
                m = sorted(sign * (s.threshold - v) / s.threshold for v in row["interval"])
                row["margin_interval"] = m
                row["margin_pm"] = (m[1] - m[0]) / 2.0
        ok = ok and row["met"]
        rows.append(row)
    return {"ok": ok, "slo": rows, "steady_requests": int(len(steady)), "warmup_fraction": WARMUP_FRACTION,
            "confidence": CONFIDENCE}


def search_replicas(start: int, max_replicas: int, meets, known_miss: int = 0) -> tuple[int | None, dict[int, bool]]:
    """The fewest replicas r in [1, max_replicas] with meets(r), assuming more replicas never hurt:
    from `start`, bracket by doubling steps (up while it misses, down while it meets), then bisect,
    so meets(r) is true and meets(r − 1) false (or r = 1), each evaluated once. (None, tried) when
    even max_replicas misses. No step limit: the bracket reaches 1 or max_replicas in
    log2(max_replicas) steps. `known_miss`: a count already known to miss (e.g. one fewer than
    the recommendation, for a what-if that can only need more), never simulated again."""
    tried: dict[int, bool] = {}

    def at(r: int) -> bool:
        if r not in tried:
            tried[r] = bool(meets(r))
        return tried[r]

    floor = max(int(known_miss), 0)
    r = min(max(int(start), floor + 1), max_replicas)
    lo, hi, step = floor, None, 1        # lo: most replicas known to miss (0: none deployed)
    if at(r):
        hi = r
        while hi - step > floor and at(hi - step):
            hi, step = hi - step, step * 2
        lo = hi - step if hi - step > floor else floor
    else:
        lo = r
        while hi is None:
            nxt = min(lo + step, max_replicas)
            if at(nxt):
                hi = nxt
            elif nxt == max_replicas:
                return None, tried
            else:
                lo, step = nxt, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid):
            hi = mid
        else:
            lo = mid
    return hi, tried


def _evidence(st: _Setup, c: Candidate, replicas: int, n_req: int, explain: bool = False,
              rate: float | None = None) -> dict[str, Any]:
    r = _simulate(candidate_scenario(st.base, c, st.target if rate is None else rate, replicas, n_req, st.router),
                  explain=explain)
    r["judgement"] = judge(r, st.slos)
    r["ok_plan"] = r["judgement"]["ok"]
    return r


def _confirm(st: _Setup, best: Candidate, prog: Progress) -> dict[str, Any] | None:
    """Stage 3: simulate the whole cluster at target × (1 + headroom) and search the fewest replicas
    that meet the SLOs there (`search_replicas`, from the estimated count); re-size `best` to it
    and set its per-replica rate to the confirmed one (the rate over the replicas). The evidence:
    {"recommended": the run at that count, "one_fewer_replica": the run with one fewer (None at
    one replica), "replicas_tried": {count: met}}; None (and `best` infeasible) when even
    plan.max_replicas misses."""
    runs: dict[int, dict[str, Any]] = {}

    def meets(r: int) -> bool:
        prog.update(f"confirming {best.label} × {r} replicas at {st.target:g} req/s")
        runs[r] = _evidence(st, best, r, evidence_requests(st.slos, r, st.cfg.requests_per_probe))
        return bool(runs[r]["ok_plan"])

    replicas, tried = search_replicas(best.replicas, st.cfg.max_replicas, meets)
    best.confirmed = True
    if replicas is None:
        best.feasible = False
        best.reason = (f"missed the SLOs with the whole cluster simulated at {st.target:g} req/s, up to "
                       f"plan.max_replicas = {st.cfg.max_replicas} replicas")
        return None
    # the run kept as the recommendation's evidence explains where speculation pays
    runs[replicas]["speculation_by_batch"] = summary.speculation_by_batch(runs[replicas]["_result"])
    best.replicas, best.total_gpus = replicas, replicas * best.tensor_parallel_size
    best.cost_per_hour_usd = best.total_gpus * best.cost_per_gpu_hour_usd
    best.max_rate_per_replica_rps = st.target / replicas
    best.tok_s_per_user_p50, best.output_throughput_tok_s_per_gpu = _point(runs[replicas].get("metrics") or {})
    best.basis = (f"confirmed: {replicas} replicas simulated at {st.target:g} req/s meet the SLOs"
                  + (f", {replicas - 1} miss" if replicas > 1 else ""))
    return {"recommended": runs[replicas], "one_fewer_replica": runs.get(replicas - 1),
            "replicas_tried": {int(k): v for k, v in sorted(tried.items())}}


# What-ifs the plan answers by searching again (not by extrapolation): acceptance lower by 10, 20
# and 30 % (speculative.acceptance.rate_scale, every conditional rate) and traffic × 1.5 and × 2.
SENSITIVITY = (("acceptance", 0.9), ("acceptance", 0.8), ("acceptance", 0.7), ("traffic", 1.5), ("traffic", 2.0))


def sensitivity(st: _Setup, best: Candidate, prog: Progress) -> list[dict[str, Any]]:
    """GPUs the recommended configuration needs under each what-if of SENSITIVITY: the same replica
    search and SLO judgement as the recommendation, at target × (1 + headroom) × the traffic factor,
    from the recommendation's per-replica rate."""
    rows = []
    for kind, k in SENSITIVITY:
        label = f"acceptance −{(1 - k) * 100:.0f} %" if kind == "acceptance" else f"traffic × {k:g}"
        if kind == "acceptance" and best.method == "none":
            rows.append({"what_if": label, "gpus": best.total_gpus, "replicas": best.replicas,
                         "note": "no speculation: acceptance does not enter"})
            continue
        c, rate = best, st.target
        if kind == "acceptance":
            acc = dict(best.spec.get("acceptance") or {})
            acc["rate_scale"] = float(acc.get("rate_scale", 1.0)) * k
            c = dataclasses.replace(best, spec={**best.spec, "acceptance": acc})
        else:
            rate = st.target * k
        start = max(1, math.ceil(rate / best.max_rate_per_replica_rps - 1e-9))

        def meets(r: int, c=c, rate=rate, label=label) -> bool:
            prog.update(f"what if {label}: {c.label} × {r} replicas at {rate:g} req/s")
            return bool(_evidence(st, c, r, evidence_requests(st.slos, r, st.cfg.requests_per_probe), rate=rate)["ok_plan"])

        # less acceptance or more traffic never needs fewer replicas: one fewer than now misses
        replicas, tried = search_replicas(max(start, best.replicas), st.cfg.max_replicas, meets,
                                          known_miss=best.replicas - 1)
        rows.append({"what_if": label, "rate_rps": rate, "replicas": replicas,
                     "gpus": None if replicas is None else replicas * best.tensor_parallel_size,
                     "replicas_tried": {int(r): v for r, v in sorted(tried.items())},
                     "note": None if replicas is not None else f"misses even at plan.max_replicas = {st.cfg.max_replicas}"})
    slower = _slower_step_cost(st, best, prog)
    if slower is not None:
        rows.append(slower)
    return rows


# Per-request delays (TTFT only) that a slower step does not change (`_slower_step_cost`), and the expert
# efficiencies, which multiply `gemm` and `hbm` (capacity/cost/step_cost.py) and so slow with them
_KEPT_BY_A_SLOWER_STEP = ("request_overhead_ms", "prompt_token_overhead_us", "moe", "moe_int4")


def slower_step_overrides(gpu: GpuProfile, factor: float) -> dict[str, Any]:
    """`gpu_overrides` that make every engine step on `gpu` `factor` times as long: fraction efficiencies divided by
    it, step-time overheads, the scale-up latency and the per-GEMM time multiplied by it; the per-request delays and
    the expert efficiencies (relative to `gemm` and `hbm`) kept (`_KEPT_BY_A_SLOWER_STEP`)."""
    over: dict[str, Any] = {"efficiency": {
        k: (v if k in _KEPT_BY_A_SLOWER_STEP else v / factor if k in FRACTION_EFFICIENCY_KEYS else v * factor)
        for k, v in gpu.efficiency.items()}, "scaleup_latency_us": gpu.scaleup_latency_us * factor}
    if gpu.gemm_call_us:
        over["gemm_call_us"] = gpu.gemm_call_us * factor
    return over


def _slower_step_cost(st: _Setup, best: Candidate, prog: Progress) -> dict[str, Any] | None:
    """GPUs the recommendation needs if every engine step is slower by the p90 TPOT error that applies to its model
    and TP size on its GPU (`expected_error`: the profile's cross-validation): fraction efficiencies divided by
    1 + error (`slower_step_overrides`). None where that error is not measured (the context says so)."""
    dep = simulate.deploy(scenario_mod.from_dict(candidate_scenario(st.base, best, st.target, 1, 10), "plan"))
    err = expected_error(dep.gpu, dep.model.name, best.tensor_parallel_size)
    if not err["figures"]:
        return None
    p90 = float(err["figures"]["tpot_pct"][1])
    slower = 1.0 + p90 / 100.0
    label = f"step cost +{p90:.0f} %"
    base = copy.deepcopy(st.base)
    over = dict(base["deployment"].get("gpu_overrides") or {})
    slowed = slower_step_overrides(dep.gpu, slower)
    over.update({**slowed, "efficiency": {**(over.get("efficiency") or {}), **slowed["efficiency"]}})
    base["deployment"]["gpu_overrides"] = over
    slow = dataclasses.replace(st, base=base)

    def meets(r: int) -> bool:
        prog.update(f"what if {label}: {best.label} × {r} replicas at {st.target:g} req/s")
        return bool(_evidence(slow, best, r, evidence_requests(st.slos, r, st.cfg.requests_per_probe))["ok_plan"])

    # a slower step never needs fewer replicas: one fewer than now misses
    replicas, tried = search_replicas(best.replicas, st.cfg.max_replicas, meets, known_miss=best.replicas - 1)
    basis = err["basis"].replace("_", "-")
    return {"what_if": label, "rate_rps": st.target, "replicas": replicas,
            "gpus": None if replicas is None else replicas * best.tensor_parallel_size,
            "replicas_tried": {int(r): v for r, v in sorted(tried.items())},
            "note": (f"every step {p90:.1f} % slower: the p90 TPOT error of {dep.gpu.name}'s step cost ({basis})"
                     + ("" if replicas is not None else f"; misses even at plan.max_replicas = {st.cfg.max_replicas}"))}


def daily(st: _Setup, best: Candidate) -> dict[str, Any] | None:
    """With a `rate_profile` in the scenario's arrivals: plan.target_rate_rps is the peak, each step of
    the profile gets target x multiplier / peak multiplier, and the replicas it needs are that rate x
    (1 + headroom) over the confirmed per-replica rate (scaled from the confirmed cluster, not
    simulated step by step); GPU-hours per day if replicas follow the profile, against keeping the
    peak's all day. None without a profile."""
    sc = scenario_mod.from_dict({k: v for k, v in st.base.items() if k != "plan"}, "plan")
    profile = getattr(sc.traffic.arrival, "rate_profile", None)
    if profile is None or not best.max_rate_per_replica_rps:
        return None
    peak = max(profile.multipliers)
    steps = []
    for i, m in enumerate(profile.multipliers):
        rate = st.cfg.target_rate_rps * m / peak
        replicas = max(1, math.ceil(rate * (1 + st.cfg.headroom) / best.max_rate_per_replica_rps - 1e-9))
        steps.append({"start_s": i * profile.step_s, "rate_rps": rate, "replicas": min(replicas, best.replicas),
                      "gpus": min(replicas, best.replicas) * best.tensor_parallel_size})
    per_day = 86400.0 / profile.period_s
    follow = sum(x["gpus"] for x in steps) * profile.step_s / 3600.0 * per_day
    return {"step_s": profile.step_s, "period_s": profile.period_s, "peak_rate_rps": st.cfg.target_rate_rps,
            "steps": steps, "gpu_hours_per_day_following": follow,
            "gpu_hours_per_day_at_peak": best.total_gpus * 24.0,
            "cost_per_day_following_usd": follow * best.cost_per_gpu_hour_usd,
            "basis": "replicas per step = ceil(rate x (1 + headroom) / the confirmed per-replica rate); "
                     "scaled from the confirmed cluster, not simulated step by step"}


ROUTERS = ("round_robin", "least_outstanding", "session_affinity", "prefix_aware")


def prefix_caching(st: _Setup, best: Candidate, evidence: dict[str, Any], prog: Progress) -> dict[str, Any] | None:
    """What prefix caching is worth to the recommendation: the GPUs the same configuration needs
    with caching off (the same replica search and judgement), the hit rate of the confirming run,
    and, with several replicas, the hit rate and latency under each router at the sized rate.
    None when the traffic carries no block identities or caching is off."""
    if st.router is None:
        return None
    off_base = copy.deepcopy(st.base)
    off_base.setdefault("engine", {})["enable_prefix_caching"] = False
    st_off = dataclasses.replace(st, base=off_base, router=None, mean_prefill=None, p99_prefill=None)

    def meets(r: int) -> bool:
        prog.update(f"without prefix caching: {best.label} × {r} replicas at {st.target:g} req/s")
        return bool(_evidence(st_off, best, r, evidence_requests(st.slos, r, st.cfg.requests_per_probe))["ok_plan"])

    # caching off never needs fewer replicas: one fewer than with it misses
    replicas, tried = search_replicas(best.replicas, st.cfg.max_replicas, meets, known_miss=best.replicas - 1)
    m = evidence["recommended"]["metrics"]
    routers = []
    if best.replicas > 1:
        n_req = evidence_requests(st.slos, best.replicas, st.cfg.requests_per_probe)
        for router in ROUTERS:
            prog.update(f"router {router}: {best.label} × {best.replicas} at {st.target:g} req/s")
            r = _simulate(candidate_scenario(st.base, best, st.target, best.replicas, n_req, router))
            rm = r.get("metrics") or {}
            routers.append({"router": router, "prefix_cache_hit_rate": rm.get("prefix_cache_hit_rate"),
                            "ttft_p99_ms": (rm.get("ttft_ms") or {}).get("p99"),
                            "tpot_p90_ms": (rm.get("tpot_ms") or {}).get("p90"),
                            "slo_met": bool(judge(r, st.slos)["ok"]) if "metrics" in r else False})
    return {"router": st.router, "prefix_cache_hit_rate": m.get("prefix_cache_hit_rate"),
            "unbounded_cached_share": st.cached_share,
            "gpus": best.total_gpus, "replicas": best.replicas,
            "gpus_without_caching": None if replicas is None else replicas * best.tensor_parallel_size,
            "replicas_without_caching": replicas,
            "replicas_tried_without_caching": {int(k): v for k, v in sorted(tried.items())},
            "routers": routers}


def context(st: _Setup, best: Candidate, rec: dict[str, Any]) -> dict[str, Any]:
    """What the answer is for and what decides it: model and precision, traffic shape, the binding
    SLO (the smallest steady-state margin at the recommendation) and the acceptance basis in words."""
    sc = scenario_mod.from_dict({k: v for k, v in st.base.items() if k != "plan"}, "plan")
    dep = simulate.deploy(scenario_mod.from_dict(candidate_scenario(st.base, best, st.target, 1, 10), "plan"))
    process = sc.traffic.arrival.process
    arrivals = "conversations (sessions) at" if process == "sessions" else f"{process} arrivals at"
    shape = (f"{arrivals} {st.cfg.target_rate_rps:g} req/s (sized for "
             f"{st.target:g}), prompts {st.mean_prompt:,.0f} tokens and outputs {st.mean_output:,.0f} tokens on "
             f"average (p99 prompt {st.p99_prompt:,.0f})")
    judged = [s for s in rec.get("slo") or [] if s.get("margin") is not None]
    binding = min(judged, key=lambda s: s["margin"], default=None)
    basis = rec.get("acceptance_basis") or ""
    if best.method == "none":
        sentence = "No speculation: the answer does not depend on a drafter's acceptance."
    else:
        where = ("not measured on this model: carried over from the drafter's measurements on other targets"
                 if "not measured" in basis else "from the acceptance basis below" if basis
                 else "as the scenario gives it (no recorded basis)")
        scaled = " and scaled from math and code benchmarks to chat (an assumed ratio)" if "chat derived" in basis else ""
        sentence = (f"{best.method} N={best.num_speculative_tokens}'s acceptance on {sc.deployment.model} is {where}"
                    f"{scaled}; the GPU count rests on it (see the what-ifs).")
    # how far the step cost can be trusted for this model and TP size on this GPU, against the binding margin
    error = expected_error(dep.gpu, dep.model.name, best.tensor_parallel_size)
    error["against_binding_margin"] = margin_against_error(
        error, parse_slos(binding["slo"])[0].metric if binding else None, binding and binding["margin"])
    return {"model": sc.deployment.model, "precision": dep.model.weight_precision,
            "kv_cache_dtype": sc.deployment.kv_cache_dtype, "traffic": shape,
            "binding_slo": None if binding is None else binding["slo"],
            "binding_margin": None if binding is None else binding["margin"],
            "acceptance_in_words": sentence, "step_cost_error": error}


def _rank_key(c: Candidate) -> tuple:
    return (c.total_gpus, c.cost_per_hour_usd)


def _confirm_best(st: _Setup, cands: list[Candidate], prog: Progress) -> tuple[Candidate, dict[str, Any]]:
    """Confirm the best simulated candidate as a whole cluster; while another simulated candidate's
    estimate still ranks ahead of the confirmed one, confirm that one too (at most
    `_CONFIRM_AT_MOST`). The best confirmed candidate and its evidence; an error only when no
    candidate meets the SLOs as a whole cluster."""
    best, best_ev, done = None, None, 0
    while True:
        pending = sorted([c for c in cands if c.feasible and c.simulated and not c.confirmed], key=_rank_key)
        if not pending or (best is not None and (_rank_key(pending[0]) >= _rank_key(best) or done >= _CONFIRM_AT_MOST)):
            break
        c = pending[0]
        ev = _confirm(st, c, prog)
        done += 1
        if ev is not None and (best is None or _rank_key(c) < _rank_key(best)):
            best, best_ev = c, ev
    if best is None:
        raise CapacityError(f"no candidate met the SLOs with its whole cluster simulated at {st.target:g} req/s "
                            f"(target × (1 + headroom)); raise plan.max_replicas, widen plan.search or relax the slo")
    return best, best_ev


def _recommendation(st: _Setup, best: Candidate, ranked: list[Candidate], evidence: dict[str, Any],
                    comparison: list[dict[str, Any]]) -> dict[str, Any]:
    m = evidence["recommended"]["metrics"]
    out_tok_s = m["output_throughput_tok_s"] or 0.0
    fewer = evidence["one_fewer_replica"] or {}
    return {
        **best.row(),
        "target_rate_rps": st.cfg.target_rate_rps, "headroom": st.cfg.headroom,
        # the rate the replica count is confirmed at: target × (1 + headroom)
        "confirmed_at_rps": st.target,
        "cost_per_million_output_tokens_usd": best.cost_per_hour_usd / (out_tok_s * 3600) * 1e6 if out_tok_s else None,
        "slo": evidence["recommended"]["judgement"]["slo"], "slo_met": evidence["recommended"]["ok_plan"],
        "slo_whole_run": m.get("slo"),
        "evidence_requests": m.get("num_requests"),
        "one_fewer_replica_slo_met": fewer.get("ok_plan") if fewer else None,
        "one_fewer_replica_slo": (fewer.get("judgement") or {}).get("slo") if fewer else None,
        "replicas_tried": evidence.get("replicas_tried"),
        "without_speculation": _without_at_target(_best_of(ranked, "none"), comparison),
        # where the recommended drafter's acceptance comes from (measured on this target, or carried
        # over from other targets): the recommendation is only as good as that number
        "acceptance_basis": evidence["recommended"].get("acceptance_basis"),
        # "use N up to B running requests, off above" at this traffic (decode-only view)
        "speculation_by_batch": evidence["recommended"].get("speculation_by_batch"),
        # the target traffic on the recommendation, on the same GPUs with speculation off, and on the
        # cheapest deployment without speculation: throughput and latency with and without it
        "comparison": comparison,
    }


def run(scenario_name: str | None = None, overrides: list[str] | None = None, workers: int | None = None,
        progress: bool = True) -> PlanResult:
    t0 = time.perf_counter()
    prog = Progress("plan", progress)
    st = _setup(scenario_name, overrides)
    cands = expand(st.cfg.search)
    workers = max(1, min(workers or os.cpu_count() or 1, 8))
    _screen(st, cands, prog)
    _simulate_best(st, cands, workers, prog)
    _check_simulated(cands)
    best, evidence = _confirm_best(st, cands, prog)
    ranked = _ranked(cands)
    n_conf = evidence_requests(st.slos, best.replicas, st.cfg.requests_per_probe)
    # the with/without table describes the target rate (no headroom) with runs of the probes' size,
    # the recommendation's own evidence run when that is the same run
    n_table = max(st.cfg.requests_per_probe, int(200 * math.sqrt(best.replicas)))
    at_target = evidence["recommended"] if st.target == st.cfg.target_rate_rps and n_table == n_conf else \
        _simulate(candidate_scenario(st.base, best, st.cfg.target_rate_rps, best.replicas, n_table, st.router))
    comparison = _with_and_without(st.base, best, ranked, st.cfg.target_rate_rps, n_table, at_target, prog, st.router)
    rec = _recommendation(st, best, ranked, evidence, comparison)
    replicas = best.replicas
    rec_sc = candidate_scenario(st.base, best, st.target, replicas, n_conf, st.router)
    fewer_sc = candidate_scenario(st.base, best, st.target, replicas - 1, n_conf, st.router) if replicas > 1 else None
    rec["deployment"] = deployment(st, best, rec_sc)
    rec["context"] = context(st, best, rec)
    rec["sensitivity"] = sensitivity(st, best, prog)
    rec["prefix_caching"] = prefix_caching(st, best, evidence, prog)
    rec["daily"] = daily(st, best)
    prog.close()
    rec_sc["description"] = _describe(rec, st)
    if fewer_sc is not None:
        fewer_sc["description"] = (f"One replica fewer than the plan's recommendation ({replicas - 1} × {best.label}) "
                                   f"at {st.target:g} req/s: expected to miss the SLOs")
    ev_json = {k: (v or {}).get("payload") for k, v in evidence.items() if k != "replicas_tried"}
    ev_req = {k: (v or {}).get("requests") for k, v in evidence.items() if k != "replicas_tried" and v}
    return PlanResult(rec, [c.row() for c in ranked] + [c.row() for c in cands if not c.feasible], ev_json,
                      rec_sc, fewer_sc, ev_req, time.perf_counter() - t0)


def _with_and_without(base: dict[str, Any], best: Candidate, ranked: list[Candidate], rate: float, n_req: int,
                      recommended: dict[str, Any], prog: Progress, router: str | None = None) -> list[dict[str, Any]]:
    """The target rate simulated on the recommendation (already done), on the same deployment with
    speculation off, and on the cheapest deployment without speculation: [{label, gpus, slo_met,
    metrics}] for the summary's with/without table. Empty when the recommendation drafts nothing."""
    def entry(label: str, c: Candidate, replicas: int, res: dict[str, Any]) -> dict[str, Any]:
        m = res.get("metrics") or {}
        return {"label": label, "config": c.label, "gpus": replicas * c.tensor_parallel_size,
                "rate_rps": rate, "num_requests": n_req,
                "slo_met": bool(res.get("ok")), "stable": bool(res.get("stable")),
                "metrics": summary.comparison_metrics(m) if m else None, "error": res.get("error")}

    if best.method == "none":
        return []
    out = [entry(f"{best.method} N={best.num_speculative_tokens}", best, best.replicas, recommended)]
    off = dataclasses.replace(best, method="none", num_speculative_tokens=0, spec={"method": "none"})
    prog.update(f"the same {best.replicas} replica(s) without speculation")
    out.append(entry("same GPUs, no spec", off, best.replicas,
                     _simulate(candidate_scenario(base, off, rate, best.replicas, n_req, router))))
    plain = next((c for c in ranked if c.method == "none" and c.simulated), None) or \
        next((c for c in ranked if c.method == "none"), None)
    if plain is not None:
        # its replica count comes from a probe of one replica; at the target rate and this run's length
        # it can miss by a hair, so add replicas (at most _WITHOUT_EXTRA_REPLICAS) until it meets the SLOs:
        # the column is the cheapest deployment without speculation that this table shows meeting them
        for replicas in range(plain.replicas, plain.replicas + _WITHOUT_EXTRA_REPLICAS + 1):
            prog.update(f"the cheapest deployment without speculation: {plain.label} × {replicas}")
            res = _simulate(candidate_scenario(base, plain, rate, replicas, n_req, router))
            if res.get("ok") or res.get("error"):
                break
        out.append({**entry("cheapest without", plain, replicas, res),
                    "replicas": replicas, "replicas_from_search": plain.replicas})
    return out


_WITHOUT_EXTRA_REPLICAS = 2   # assumed: a probe that misses by more is reported as missing, not searched further


def _without_at_target(without: dict[str, Any] | None, comparison: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The plan's without-speculation answer with the replica count the with/without table confirmed."""
    col = next((c for c in comparison if c["label"] == "cheapest without"), None)
    if without is None or col is None or col["replicas"] == col["replicas_from_search"]:
        return without
    per_replica_usd = without["cost_per_hour_usd"] / col["replicas_from_search"]
    if col["slo_met"]:
        note = (f"{col['replicas']} replicas: the search's {col['replicas_from_search']} missed the SLOs at the "
                f"target rate in the with/without run")
    else:
        note = (f"{col['replicas']} replicas still miss the SLOs at the target rate in the with/without run "
                f"(the search's count was {col['replicas_from_search']})")
    return {**without, "total_gpus": col["gpus"], "cost_per_hour_usd": per_replica_usd * col["replicas"],
            "note": note}


def _best_of(ranked: list[Candidate], method: str) -> dict[str, Any] | None:
    for c in ranked:
        if c.method == method and c.simulated:
            return {"label": c.label, "total_gpus": c.total_gpus, "cost_per_hour_usd": c.cost_per_hour_usd}
    for c in ranked:
        if c.method == method:
            return {"label": c.label, "total_gpus": c.total_gpus, "cost_per_hour_usd": c.cost_per_hour_usd,
                    "note": "analytic estimate (not simulated)"}
    return None


def _size(c: Candidate, target: float, max_replicas: int) -> None:
    c.replicas = max(1, math.ceil(target / c.max_rate_per_replica_rps - 1e-9))
    if c.replicas > max_replicas:
        c.feasible, c.reason = False, f"needs more than plan.max_replicas = {max_replicas} replicas"
    c.total_gpus = c.replicas * c.tensor_parallel_size
    c.cost_per_hour_usd = c.total_gpus * c.cost_per_gpu_hour_usd


# ---------------------------------------------------------------------------------------------- deployment
# vLLM's spellings: `vllm serve` flags (vllm/engine/arg_utils.py) and the --speculative-config JSON
# keys "method", "model", "num_speculative_tokens" (vllm/config/speculative.py SpeculativeConfig);
# `vllm bench serve` flags (vllm/benchmarks/serve.py; --goodput takes "KEY:VALUE" pairs in ms for
# ttft, tpot, e2el). The method names are capacity/data/methods.yaml's `vllm_method`.
_GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el"}


def speculative_config(method: str, num_speculative_tokens: int, target: str, draft: str | None) -> dict[str, Any] | None:
    """vLLM's --speculative-config for a method of capacity/data/methods.yaml: {"method": its
    `vllm_method`, "model": the draft checkpoint (none for native MTP and n-gram),
    "num_speculative_tokens": N}; None for speculation off."""
    from capacity.spec.methods import get_method

    if method == "none" or not num_speculative_tokens:
        return None
    m = get_method(method)
    cfg: dict[str, Any] = {"method": m.vllm_method.split()[0]}
    if m.drafter == "checkpoint":
        model = draft or m.default_draft(target)
        if model:
            cfg["model"] = model
    cfg["num_speculative_tokens"] = int(num_speculative_tokens)
    return cfg


def attention_backend_args(gpu: Any, model: Any, backend: str) -> tuple[list[str], list[str]]:
    """(environment, `vllm serve` arguments) that make vLLM run the attention kernels the plan priced.

    Needed on ROCm only: since vLLM 0.19 a model with neither MLA nor attention sinks runs ROCM_ATTN when no
    `--attention-backend` is named, VLLM_ROCM_USE_AITER=1 or not (vllm/platforms/rocm.py
    `_get_backend_priorities`, PR #36702; docs/seed_validation.md section 33), whose prompt chunks and
    verification steps pay a 128-row query tile ("rocm"). "auto" prices AITER's flash attention there, which
    InferenceX's MI355X scripts select with VLLM_ROCM_USE_AITER=1 and --attention-backend ROCM_AITER_FA
    (capacity/data/measurements/serve_recipes.yaml). A model that "auto" runs on the Triton kernel (attention
    sinks, Gemma 4's mixed head sizes) or on an MLA kernel gets that from vLLM without a flag; so does every
    model on CUDA."""
    if not gpu.is_rocm or model.uses_mla:
        return [], []
    if backend == "rocm":
        return [], ["--attention-backend", "ROCM_ATTN"]
    if backend == "triton":
        return [], ["--attention-backend", "TRITON_ATTN"]
    key = gpu.attention_efficiency_key(model) if backend == "auto" else ATTENTION_BACKEND_KEYS[backend]
    if key == "attention" and model.largest_head_dim <= 256:   # ROCM_AITER_FA's largest (get_supported_head_sizes)
        return ["VLLM_ROCM_USE_AITER=1"], ["--attention-backend", "ROCM_AITER_FA"]
    return [], []


def moe_backend_env(gpu: Any, model: Any, backend: str, env: list[str]) -> list[str]:
    """Environment to add to `env` so that vLLM runs the fused-MoE kernels the plan priced (engine.moe_backend).

    VLLM_ROCM_USE_AITER=1 also switches on AITER's fused MoE (vllm/_aiter_ops.py `is_fused_moe_enabled`:
    VLLM_ROCM_USE_AITER and VLLM_ROCM_USE_AITER_MOE, the latter on by default), so a MoE model priced on Triton's
    fused MoE under that variable needs VLLM_ROCM_USE_AITER_MOE=0, and one priced on AITER's needs the variable.
    Quark MXFP4 experts on gfx950 run AITER's kernels either way (step_cost.resolve_moe_backend)."""
    if not gpu.is_rocm or not model.num_moe_layers:
        return []
    vllms_choice = resolve_moe_backend(gpu, model)
    priced = vllms_choice if backend == "auto" else backend
    if priced == "aiter" and "VLLM_ROCM_USE_AITER=1" not in env and vllms_choice != "aiter":
        return ["VLLM_ROCM_USE_AITER=1"]
    if priced == "triton" and "VLLM_ROCM_USE_AITER=1" in env:
        return ["VLLM_ROCM_USE_AITER_MOE=0"]
    return []


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def int4_tiles_note(gpu: GpuProfile, model: ModelArch, tp: int, expert_parallel: bool, tiles: str = "auto") -> str | None:
    """The deployment note where the plan priced the model's int4 experts under vLLM's default tiles because vLLM ships
    no tuned ones for the shape (engine.int4_moe_tiles 'auto'; step_cost `int4_default_tiles`), else None."""
    if not (tiles == "auto" and runs_int4_triton_moe(gpu, model)
            and int4_default_tiles(gpu, model, tp, tp if expert_parallel else 1)):
        return None
    return (f"vLLM ships no tuned int4 MoE tiles for {model.name}'s experts on {gpu.name} at TP{tp}, so its Triton int4 "
            f"kernel runs the default tiles, priced {int4_tile_table().default_tiles_slowdown:g}x slower on the experts "
            "than tuned ones (vLLM PR #35093 measured 5-7x); a server given tuned tiles (vLLM's "
            "benchmarks/kernels/benchmark_moe.py --tune, VLLM_TUNED_CONFIG_FOLDER) is priced with "
            "--set engine.int4_moe_tiles=tuned")


def deployment(st: _Setup, best: Candidate, rec_sc: dict[str, Any]) -> dict[str, Any]:
    """The recommendation as something to deploy: servers of the GPU's platform (GPUs per server:
    the profile's `scaleup_world_size`, the GPUs of one scale-up domain, i.e. one 8-GPU node), the
    replicas each server holds, and per replica the `vllm serve` line and the `vllm bench serve`
    line that checks it at its share of target × (1 + headroom)."""
    sc = scenario_mod.from_dict({k: v for k, v in rec_sc.items() if k != "plan"}, "recommended")
    d, e, sp = sc.deployment, sc.engine, sc.speculative
    gpu = load_gpu(d.gpu)
    per_server = int(gpu.scaleup_world_size)
    tp = d.tensor_parallel_size
    notes = []
    if tp > per_server or per_server % tp:
        notes.append(f"tensor-parallel size {tp} does not divide the {per_server} GPUs of one {gpu.name} server: "
                     "a replica would span servers")
        per_server_replicas = max(per_server // tp, 1)
    else:
        per_server_replicas = per_server // tp
    servers = math.ceil(best.replicas / per_server_replicas)
    spec = speculative_config(sp.method, sp.num_speculative_tokens, d.model, sp.draft)
    serve = ["vllm", "serve", d.model, "--tensor-parallel-size", str(tp),
             "--max-num-seqs", str(e.max_num_seqs), "--max-num-batched-tokens", str(e.max_num_batched_tokens),
             "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}"]
    if e.max_cudagraph_capture_size is not None:
        serve += ["--max-cudagraph-capture-size", str(e.max_cudagraph_capture_size)]
        if gpu.efficiency.get("eager_kernel_us"):
            notes.append(f"steps of up to {e.max_cudagraph_capture_size} tokens are priced as replayed graphs, without "
                         f"{gpu.name}'s host time per kernel; on MI355X's gpt-oss-120b rows served that way (vLLM 0.10.1) "
                         "prompts took about 13 ms more than that prices (docs/seed_validation.md section 51)")
    if d.kv_cache_dtype == "fp8":
        serve += ["--kv-cache-dtype", "fp8"]
    if d.expert_parallel:
        serve += ["--enable-expert-parallel"]
    if d.precision == "fp8":
        serve += ["--quantization", "fp8"]
    elif d.precision:
        notes.append(f"precision {d.precision}: serve a checkpoint quantized to {d.precision} (the line names the model id)")
    # prefix caching as planned (vLLM's default is on; the random-prompt check below shares no prefix)
    if not e.enable_prefix_caching:
        serve += ["--no-enable-prefix-caching"]
    elif st.router is not None and best.replicas > 1:
        notes.append(f"route conversations with {st.router.replace('_', ' ')} (the planned hit rate needs a "
                     "cache-aware load balancer, e.g. llm-d's endpoint picker or sticky sessions)")
    if spec:
        serve += ["--speculative-config", json.dumps(spec)]
    model = load_model(d.model, weight_precision=d.precision, kv_dtype=d.kv_cache_dtype)   # as the simulation loads it
    tiles = int4_tiles_note(gpu, model, tp, d.expert_parallel, e.int4_moe_tiles)
    if tiles:
        notes.append(tiles)
    env, attention = attention_backend_args(gpu, model, e.attention_backend)
    serve += [*attention, "--port", "8000"]
    if "ROCM_AITER_FA" in attention:
        notes.append("--attention-backend ROCM_AITER_FA names the attention kernels the plan priced: without it vLLM "
                     ">= 0.19 on ROCm runs ROCM_ATTN, whose prompt chunks and speculative verification pay a 128-row "
                     "query tile (price that with --set engine.attention_backend=rocm)")
    env += moe_backend_env(gpu, model, e.moe_backend, env)
    if quick_reduce_rule(gpu.architecture, tp, e.quick_reduce_quantization) is not None:
        env.append(f"VLLM_ROCM_QUICK_REDUCE_QUANTIZATION={e.quick_reduce_quantization.upper()}")
    serve = [*env, *serve]
    stream = build_requests(sc.traffic, np.random.default_rng(0))
    per_replica = st.target / best.replicas
    goodput = []
    for s in st.slos:
        if s.metric in _GOODPUT_KEYS:
            goodput.append(f"{_GOODPUT_KEYS[s.metric]}:{s.threshold:g}")
        elif s.metric == "tok_s_per_user":
            goodput.append(f"tpot:{1000.0 / s.threshold:g}")
    pct = sorted({s.stat[1:] for s in st.slos if s.stat.startswith("p")} | {"50"}, key=float)
    n_prompts = evidence_requests(st.slos, 1, st.cfg.requests_per_probe)
    mean_prompt = int(round(float(stream.prompt_tokens.mean())))
    # with prefix caching, the planned share of each prompt found cached becomes one shared prefix
    # (vllm bench serve's --random-prefix-len: that many tokens before each random prompt)
    shared = int(round(mean_prompt * st.cached_share)) if e.enable_prefix_caching and st.router is not None else 0
    prefix = ["--random-prefix-len", str(shared)] if shared else []
    bench = ["vllm", "bench", "serve", "--backend", "vllm", "--model", d.model, "--base-url", "http://SERVER:8000",
             "--dataset-name", "random", *prefix, "--random-input-len", str(max(mean_prompt - shared, 1)),
             "--random-output-len", str(int(round(float(stream.output_tokens.mean())))), "--ignore-eos",
             "--request-rate", f"{per_replica:.3g}", "--burstiness", "1.0", "--num-prompts", str(n_prompts),
             "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", ",".join(pct)]
    if goodput:
        bench += ["--goodput", *goodput]
    bench += ["--save-result", "--save-detailed", "--result-filename", "plan_check.json"]
    return {
        "gpu": gpu.name, "gpus_per_server": per_server, "replicas_per_server": per_server_replicas,
        "servers": servers, "gpus": best.total_gpus, "replicas": best.replicas, "tensor_parallel_size": tp,
        "gpus_per_server_source": f"GPU profile {gpu.name}, scaleup_world_size: {_source_of(gpu, 'scaleup_world_size')}",
        "speculative_config": spec,
        "vllm_serve": " ".join(_shell_quote(a) for a in serve),
        "vllm_serve_argv": serve,
        "vllm_bench_serve": " ".join(_shell_quote(a) for a in bench),
        "vllm_bench_serve_argv": bench,
        "bench_rate_per_replica_rps": per_replica,
        "notes": notes + [
            "one `vllm serve` per replica (replicas_per_server per server, each on its own GPUs, e.g. "
            "CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES, and port) behind a load balancer",
            "the bench line checks one replica at its share of the planned rate with random prompts of the "
            "traffic's mean lengths; acceptance depends on the text, so for speculation benchmark your own "
            "prompts (e.g. --dataset-name sharegpt --dataset-path ...) and feed the result to `capacity validate`"]
        + ([f"the planned {st.cached_share:.0%} of each prompt found in the prefix cache is one shared "
            f"{shared}-token prefix in the bench line; to replay conversations themselves use vLLM's "
            "benchmarks/multi_turn/benchmark_serving_multi_turn.py"] if shared else []),
    }


def _source_of(gpu, key: str) -> str:
    rec = gpu.provenance.get(key)
    return getattr(rec, "source", None) or "no source recorded"


def _describe(rec: dict[str, Any], st: _Setup) -> str:
    dep = rec["deployment"]
    spec = (f"{rec['method']} N={rec['num_speculative_tokens']}" if rec["method"] != "none" else "no speculation")
    return (f"capacity plan's recommendation: {dep['replicas']} replicas × {dep['gpu']} TP{dep['tensor_parallel_size']} "
            f"= {dep['gpus']} GPUs on {dep['servers']} server(s) of {dep['gpus_per_server']}, {spec}, "
            f"at {st.target:g} req/s (target {st.cfg.target_rate_rps:g} × (1 + {st.cfg.headroom:g} headroom))")


# ---------------------------------------------------------------------------------------------- output
def _verdict(row: dict[str, Any]) -> str:
    """'met, margin 12 % ± 4 %' for one judged SLO."""
    word = "met" if row.get("met") else "MISSED"
    if row.get("margin") is None:
        return word
    pm = row.get("margin_pm")
    iv = row.get("margin_interval")
    close = iv is not None and iv[0] < 0.0 < iv[1]
    return (f"{word}, margin {row['margin'] * 100:.0f} %" + (f" ± {pm * 100:.0f} %" if pm is not None else "")
            + (": within the run's uncertainty" if close else ""))


def _achieved(row: dict[str, Any]) -> str:
    ach = row.get("achieved")
    if ach is None:
        return "-"
    unit = "" if row["slo"].startswith("tok_s_per_user") else " ms"
    iv = row.get("interval")
    ci = f" [{iv[0]:,.1f}, {iv[1]:,.1f}]" if iv else ""
    return f"{ach:,.1f}{unit}{ci}"


def summary_text(p: PlanResult) -> str:
    r = p.recommendation
    dep = r.get("deployment") or {}
    wrap = textwrap.TextWrapper(width=110, initial_indent=" " * 16, subsequent_indent=" " * 18)
    lines = [
        f"Recommendation  {r['replicas']} × {r['gpu']} TP{r['tensor_parallel_size']} = {r['total_gpus']} GPUs"
        + (f" on {dep['servers']} server(s) of {dep['gpus_per_server']} GPUs" if dep else "")
        + f", speculation {r['method']}" + (f" N={r['num_speculative_tokens']}" if r["method"] != "none" else ""),
        f"                for {r['target_rate_rps']:g} req/s, confirmed at {r['confirmed_at_rps']:g} req/s "
        f"(+{r['headroom']:.0%} headroom), ${r['cost_per_hour_usd']:,.2f}/hour (assumed $/GPU-h)"
        + (f", ${r['cost_per_million_output_tokens_usd']:.2f} per million output tokens" if r.get("cost_per_million_output_tokens_usd") else ""),
    ]
    ctx = r.get("context") or {}
    if ctx:
        lines += wrap.wrap(f"for {ctx['model']} ({ctx['precision']} weights, {ctx['kv_cache_dtype']} KV cache), "
                           f"{ctx['traffic']}")
    slo = r.get("slo") or []
    if slo:
        lines.append(f"                SLOs at {r['confirmed_at_rps']:g} req/s, {r.get('evidence_requests')} requests, "
                     f"the first {WARMUP_FRACTION:.0%} left out as warm-up, {CONFIDENCE:.0%} intervals:")
    for s in slo:
        lines.append(f"                  {s['slo']}: {_achieved(s)} ({_verdict(s)})")
    fewer = r.get("one_fewer_replica_slo")
    if r["replicas"] > 1:
        missed = [s["slo"] for s in fewer or [] if not s.get("met")]
        lines.append(f"                one replica fewer ({r['replicas'] - 1}) at {r['confirmed_at_rps']:g} req/s: SLOs "
                     + ("met (!)" if r.get("one_fewer_replica_slo_met") else
                        "missed" + (f" ({', '.join(missed)})" if missed else " (unstable or whole-run SLO)")))
    if ctx.get("binding_slo"):
        lines.append(f"                binding SLO: {ctx['binding_slo']} (the smallest margin, {ctx['binding_margin'] * 100:.0f} %)")
    if ctx.get("acceptance_in_words"):
        lines += wrap.wrap("what decides it: " + ctx["acceptance_in_words"])
    err = ctx.get("step_cost_error")
    if err:
        lines += wrap.wrap("step cost: " + err["in_words"]
                           + (" So " + err["against_binding_margin"] if err.get("against_binding_margin") else ""))
    sens = r.get("sensitivity") or []
    if sens:
        cells = [f"{x['what_if']}: " + (f"{x['gpus']} GPUs" if x.get("gpus") is not None else "none fits")
                 for x in sens]
        lines += wrap.wrap(f"what if (re-planned, same configuration): {'; '.join(cells)} "
                           f"(now {r['total_gpus']} GPUs)")
    pc = r.get("prefix_caching")
    if pc:
        hit = pc.get("prefix_cache_hit_rate")
        off = pc.get("gpus_without_caching")
        text = (f"prefix caching: {pc['gpus']} GPUs with it ({'' if hit is None else f'hit rate {hit:.0%}, '}"
                f"router {pc['router']}), {off if off is not None else 'none fits'} GPUs without "
                f"(engine.enable_prefix_caching: false)")
        if pc.get("routers"):
            text += "; by router: " + ", ".join(
                f"{x['router']} {x['prefix_cache_hit_rate'] or 0:.0%} hits"
                + (f", TTFT p99 {x['ttft_p99_ms']:,.0f} ms" if x.get("ttft_p99_ms") is not None else "")
                + ("" if x["slo_met"] else " (misses)") for x in pc["routers"])
        lines += wrap.wrap(text)
    dl = r.get("daily")
    if dl:
        lines += wrap.wrap(f"over the day (rate_profile, peak {dl['peak_rate_rps']:g} req/s): "
                           f"{min(x['gpus'] for x in dl['steps'])}-{max(x['gpus'] for x in dl['steps'])} GPUs, "
                           f"{dl['gpu_hours_per_day_following']:,.0f} GPU-hours a day if replicas follow the load "
                           f"against {dl['gpu_hours_per_day_at_peak']:,.0f} at the peak's all day "
                           f"(replicas scaled from the confirmed per-replica rate)")
    if r.get("acceptance_basis"):
        lines += wrap.wrap("acceptance basis: " + r["acceptance_basis"])
    sb = r.get("speculation_by_batch")
    if sb:
        lines += ["                " + line for line in summary.speculation_lines(sb)]
    wo = r.get("without_speculation")
    if r["method"] != "none" and wo:
        lines.append(f"Without speculation the best is {wo['label']}: {wo['total_gpus']} GPUs "
                     f"(${wo['cost_per_hour_usd']:,.2f}/hour)" + (f", {wo['note']}" if wo.get("note") else ""))
    if dep:
        lines += ["", f"Deploy          {dep['servers']} server(s) of {dep['gpus_per_server']} {dep['gpu']} "
                      f"({dep['gpus']} GPUs used, up to {dep['replicas_per_server']} TP{dep['tensor_parallel_size']} "
                      f"replica(s) per server); {dep['replicas']} replica(s), each:",
                  "  " + dep["vllm_serve"],
                  f"Check one replica at its share, {dep['bench_rate_per_replica_rps']:.3g} req/s:",
                  "  " + dep["vllm_bench_serve"]]
        for note in dep.get("notes") or []:
            lines += textwrap.wrap("(" + note + ")", width=110, initial_indent="  ", subsequent_indent="   ")
    runs = [c for c in r.get("comparison") or [] if c.get("metrics")]
    if len(runs) > 1:
        lines.append("")
        lines += summary.metrics_table(f"At {r['target_rate_rps']:g} req/s",
                               [(f"{c['label']}", c["metrics"]) for c in runs])
        cells = [f"{c['gpus']} GPUs, " + ("SLO met" if c["slo_met"] else "SLO missed" if c.get("stable", True)
                                          else "overloaded") for c in runs]
        lines.append(f"{'deployment':28} " + " ".join(f"{x:>22}" for x in cells))
    per_class = (((p.evidence or {}).get("recommended") or {}).get("metrics") or {}).get("per_class")
    if per_class:
        lines.append("")
        lines.append(f"Per request class on the recommendation at {r['confirmed_at_rps']:g} req/s:")
        lines += summary.per_class_lines(per_class)
    lines.append("")
    lines.append(f"replicas = ceil({r['confirmed_at_rps']:g} req/s / req/s per replica); basis: how that rate was found")
    lines.append(f"{'rank':>4}  {'candidate':44} {'req/s/replica':>13} {'replicas':>8} {'GPUs':>5} {'$/hour':>9}  basis")
    for i, c in enumerate([c for c in p.candidates if c["feasible"]][:15], 1):
        lines.append(f"{i:4d}  {c['label']:44} {c['max_rate_per_replica_rps']:13.2f} {c['replicas']:8d} "
                     f"{c['total_gpus']:5d} {c['cost_per_hour_usd']:9.2f}  {c.get('basis', '')}")
    infeasible = [c for c in p.candidates if not c["feasible"]]
    lines.append(f"({len(p.candidates)} candidates, {len(infeasible)} infeasible; planned in {p.wall_time_s:.0f} s)")
    for c in infeasible[:5]:
        lines.append(f"      infeasible: {c['label']}: {c['reason']}")
    return "\n".join(lines)


def write(p: PlanResult, out) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", p.to_json())
    (out / "recommended.yaml").write_text(yaml.safe_dump(p.recommended_scenario, sort_keys=False, allow_unicode=True),
                                          encoding="utf-8")
    if p.one_fewer_scenario:
        (out / "one_fewer_replica.yaml").write_text(
            yaml.safe_dump(p.one_fewer_scenario, sort_keys=False, allow_unicode=True), encoding="utf-8")
    for name, df in p.evidence_requests.items():
        (out / "evidence" / name).mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "evidence" / name / "requests.csv", index=False)
