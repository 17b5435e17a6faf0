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
2. Simulation (the best candidates): a short discrete-event bisection around the estimate gives
   the sustained rate; the winner is confirmed by simulating the whole cluster at the target rate,
   and with one replica fewer, which must miss an SLO (else the answer was not minimal and the
   planner steps down).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from capacity.cost.step_cost import StepFeatures
from capacity.errors import CapacityError
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.inputs.traffic import build_requests
from capacity.sim import simulate, summary
from capacity.sim.metrics import parse_slos
from capacity.util.jsonio import write_json
from capacity.util.progress import Progress


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpecOption(_Strict):
    method: str = "none"
    num_speculative_tokens: list[int] | int = 0
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
    simulate_top: int = Field(6, ge=1, description="candidates confirmed with the simulator")
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
                       num_requests: int | None = None) -> dict[str, Any]:
    sc = copy.deepcopy(base)
    sc.pop("plan", None)
    sc["deployment"].update({"gpu": c.gpu, "tensor_parallel_size": c.tensor_parallel_size, "replicas": replicas})
    sc.setdefault("engine", {}).update(c.engine)
    sc["speculative"] = {k: v for k, v in c.spec.items() if v is not None}
    sc["traffic"]["arrival"] = {"process": "poisson", "rate_rps": float(rate)}
    if num_requests:
        sc["traffic"]["num_requests"] = int(num_requests)
        sc["traffic"].pop("duration_s", None)
    return sc


# ---------------------------------------------------------------------------------------------- analytic
def analytic_max_rate(scenario_dict: dict[str, Any], slos: list, mean_prompt: float, mean_output: float,
                      p99_prompt: float | None = None) -> float:
    """Largest λ (req/s per replica) whose mean-value steady state meets the latency SLOs.

    Parametrised by the decode batch B instead of λ: with S = O / E[τ] steps per request, the
    prefill tokens per step are B·P/S whatever λ is, the step time is t(B) = step(B decodes,
    B·P/S prefill tokens) and Little's law gives λ(B) = B / (S · t(B)). One vectorised pass over a
    grid of B prices every candidate batch at once.
    """
    sc = scenario_mod.from_dict(scenario_dict, "plan candidate")
    dep = simulate.deploy(sc)
    cost, spec, m = dep.cost, dep.speculation, dep.model
    k = sc.speculative.num_speculative_tokens if sc.speculative.method != "none" else 0
    acc = spec.acceptance
    tau = float(acc.expected_tokens(k)) if (acc is not None and k) else 1.0
    budget = float(sc.engine.max_num_batched_tokens)
    kv_tokens = dep.memory["kv_cache_tokens"]
    ctx = mean_prompt + mean_output / 2.0
    tpot_limit = min((s.threshold for s in slos if s.metric == "tpot" and s.op == "<"), default=math.inf) / 1e3
    ttft_limit = min((s.threshold for s in slos if s.metric == "ttft" and s.op == "<"), default=math.inf) / 1e3
    user_min = max((s.threshold for s in slos if s.metric == "tok_s_per_user" and s.op == ">"), default=0.0)
    if user_min > 0:
        tpot_limit = min(tpot_limit, 1.0 / user_min)
    steps_per_request = mean_output / tau
    b = np.unique(np.round(np.geomspace(1, max(sc.engine.max_num_seqs, 1), 48)))
    decode_attn = float(m.attention_flops(np.array([1.0 + k]), np.array([ctx + 1 + k]))[0])
    decode_kv = float(m.kv_read_bytes(np.array([ctx + 1 + k]))[0])

    def step(prefill: np.ndarray) -> np.ndarray:
        """Step time with b decoding requests and `prefill` prompt tokens in the same step."""
        chunk = np.maximum(prefill, 1.0)
        pre_ctx = np.maximum(mean_prompt, chunk)
        has = prefill > 0
        f = StepFeatures(num_tokens=b * (1 + k) + prefill, num_seqs=b + has, num_sampled=b * (1 + k) + has,
                         attn_flops=b * decode_attn + has * m.attention_flops(chunk, pre_ctx),
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
    t_decode, t_prompt = step(np.zeros_like(b)), step(np.minimum(np.full_like(b, mean_prompt), budget))
    t_many = step(np.minimum(q * mean_prompt, budget))
    t = np.where(q <= 1.0, (1.0 - q) * t_decode + q * t_prompt, t_many)
    lam = b / (steps_per_request * t)
    tpot = t / tau
    # TTFT p99: a long (p99) prompt waits for the step in progress, then needs its own step(s),
    # inflated by queueing behind other prompts (M/D/1-like 1/(1 − ρ), ρ = share of time in prompt
    # steps). A bracket for the simulator, not a prediction.
    p99 = float(p99_prompt or mean_prompt)
    room = np.maximum(budget - b * (1 + k), 1.0)
    t_long = step(np.minimum(np.full_like(b, p99), room)) * np.ceil(p99 / room)
    rho = np.minimum(q * t_prompt / t, 0.99)
    ttft = (0.5 * t + t_long) / (1.0 - rho)
    ok = ((tpot <= tpot_limit) & (ttft <= ttft_limit) & (b * (mean_prompt + mean_output) <= kv_tokens)
          & (q * mean_prompt < budget))
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
            "speculation_by_batch": summary.speculation_by_batch(res) if explain else None}


def _probe(args) -> tuple[int, float, bool]:
    idx, scenario_dict, rate = args
    r = _simulate(scenario_dict)
    return idx, rate, bool(r.get("ok"))


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
        return {"recommendation": self.recommendation, "candidates": self.candidates, "evidence": self.evidence,
                "wall_time_s": self.wall_time_s}


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


def _setup(scenario_name: str | None, overrides: list[str] | None) -> _Setup:
    path, data = scenario_mod.read_yaml(scenario_name)
    if not isinstance(data, dict):
        raise CapacityError(f"{path}: a scenario is a YAML mapping with deployment, traffic, slo and plan sections")
    base = scenario_mod.apply_overrides(data, overrides or [])
    if "plan" not in base:
        raise CapacityError(f"{path}: no plan section: add plan: {{target_rate_rps: ..., search: ...}} (see scenarios/default.yaml)")
    try:
        cfg = PlanConfig.model_validate(base["plan"])
    except Exception as e:  # pydantic ValidationError -> one line
        raise CapacityError(f"{path}: plan: {str(e).splitlines()[0]} ({str(e).splitlines()[-1].strip()})") from None
    sc0 = scenario_mod.from_dict({k: v for k, v in base.items() if k != "plan"}, str(path))
    if not sc0.slo:
        raise CapacityError(f"{path}: a plan needs SLOs: set slo: 'ttft:p99<1s;tpot:p90<25ms'")
    slos = parse_slos(sc0.slo)
    stream = build_requests(sc0.traffic, np.random.default_rng(0))
    return _Setup(base, cfg, slos, float(stream.prompt_tokens.mean()), float(stream.output_tokens.mean()),
                  float(np.percentile(stream.prompt_tokens, 99)), cfg.target_rate_rps * (1 + cfg.headroom))


def _screen(st: _Setup, cands: list[Candidate], prog: Progress) -> None:
    """Stage 1: the analytic bracket for every candidate, sized by it; an error or no rate at all
    marks a candidate infeasible, and no feasible candidate at all is an error."""
    for i, c in enumerate(cands):
        prog.update("analytic bracket", i + 1, len(cands))
        try:
            c.cost_per_gpu_hour_usd = load_gpu(c.gpu).cost_per_gpu_hour_usd
            c.analytic_rate_rps = analytic_max_rate(candidate_scenario(st.base, c, 1.0), st.slos, st.mean_prompt,
                                                    st.mean_output, st.p99_prompt)
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
    done = 0
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for idx, rate, ok in pool.map(_probe, jobs):
            results.setdefault(idx, []).append((rate, ok))
            done += 1
            prog.update(f"simulating candidates (round {round_ + 1})", done, len(jobs))
    for i, c in enumerate(top):
        ok_rates = [r for r, ok in results.get(i, []) if ok]
        c.simulated = True
        if ok_rates:
            c.max_rate_per_replica_rps = max(ok_rates)
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


def _choose(cands: list[Candidate]) -> tuple[list[Candidate], Candidate]:
    """(the feasible candidates by GPU count, then cost, simulated first; the best simulated one)."""
    ranked = sorted([c for c in cands if c.feasible],
                    key=lambda c: (c.total_gpus, c.cost_per_hour_usd, not c.simulated))
    sim_ranked = [c for c in ranked if c.simulated]
    if not sim_ranked:
        raise CapacityError("no candidate met the SLOs in simulation; relax the slo or widen plan.search")
    return ranked, sim_ranked[0]


def _confirm(st: _Setup, best: Candidate, n_req: int, prog: Progress) -> dict[str, Any]:
    """Stage 3: simulate the whole cluster at the target rate, adding a replica while it misses the
    SLOs and removing one while one fewer also meets them; re-size `best` to the confirmed count.
    The evidence: {"recommended": the run at that count, "one_fewer_replica": the run with one fewer}."""
    rate = st.cfg.target_rate_rps
    replicas = best.replicas
    for _ in range(8):
        prog.update(f"confirming {best.label} × {replicas} replicas")
        at = _simulate(candidate_scenario(st.base, best, rate, replicas, n_req), explain=True)
        if at.get("ok"):
            fewer = _simulate(candidate_scenario(st.base, best, rate, replicas - 1, n_req)) if replicas > 1 else None
            if fewer is not None and fewer.get("ok"):
                replicas -= 1  # not minimal: step down and confirm again
                continue
            evidence = {"recommended": at, "one_fewer_replica": fewer}
            break
        replicas += 1
    else:
        raise CapacityError(f"could not confirm {best.label} at {rate} req/s within 8 adjustments")
    best.replicas, best.total_gpus = replicas, replicas * best.tensor_parallel_size
    best.cost_per_hour_usd = best.total_gpus * best.cost_per_gpu_hour_usd
    return evidence


def _recommendation(st: _Setup, best: Candidate, ranked: list[Candidate], evidence: dict[str, Any],
                    comparison: list[dict[str, Any]]) -> dict[str, Any]:
    m = evidence["recommended"]["metrics"]
    out_tok_s = m["output_throughput_tok_s"] or 0.0
    return {
        **best.row(),
        "target_rate_rps": st.cfg.target_rate_rps, "headroom": st.cfg.headroom,
        "cost_per_million_output_tokens_usd": best.cost_per_hour_usd / (out_tok_s * 3600) * 1e6 if out_tok_s else None,
        "slo": m.get("slo"), "slo_met": m.get("slo_met"),
        "one_fewer_replica_slo_met": (evidence["one_fewer_replica"] or {}).get("metrics", {}).get("slo_met"),
        "without_speculation": _best_of(ranked, "none"),
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
    ranked, best = _choose(cands)
    n_conf = max(st.cfg.requests_per_probe, int(200 * math.sqrt(best.replicas)))
    evidence = _confirm(st, best, n_conf, prog)
    comparison = _with_and_without(st.base, best, ranked, st.cfg.target_rate_rps, n_conf, evidence["recommended"], prog)
    prog.close()
    rec = _recommendation(st, best, ranked, evidence, comparison)
    rate, replicas = st.cfg.target_rate_rps, best.replicas
    rec_sc = candidate_scenario(st.base, best, rate, replicas, n_conf)
    fewer_sc = candidate_scenario(st.base, best, rate, replicas - 1, n_conf) if replicas > 1 else None
    ev_json = {k: (v or {}).get("payload") for k, v in evidence.items()}
    ev_req = {k: (v or {}).get("requests") for k, v in evidence.items() if v}
    return PlanResult(rec, [c.row() for c in ranked] + [c.row() for c in cands if not c.feasible], ev_json,
                      rec_sc, fewer_sc, ev_req, time.perf_counter() - t0)


def _with_and_without(base: dict[str, Any], best: Candidate, ranked: list[Candidate], rate: float, n_req: int,
                      recommended: dict[str, Any], prog: Progress) -> list[dict[str, Any]]:
    """The target rate simulated on the recommendation (already done), on the same deployment with
    speculation off, and on the cheapest deployment without speculation: [{label, gpus, slo_met,
    metrics}] for the summary's with/without table. Empty when the recommendation drafts nothing."""
    def entry(label: str, c: Candidate, replicas: int, res: dict[str, Any]) -> dict[str, Any]:
        m = res.get("metrics") or {}
        return {"label": label, "config": c.label, "gpus": replicas * c.tensor_parallel_size,
                "slo_met": bool(res.get("ok")), "stable": bool(res.get("stable")),
                "metrics": summary.comparison_metrics(m) if m else None, "error": res.get("error")}

    if best.method == "none":
        return []
    out = [entry(f"{best.method} N={best.num_speculative_tokens}", best, best.replicas, recommended)]
    off = dataclasses.replace(best, method="none", num_speculative_tokens=0, spec={"method": "none"})
    prog.update(f"the same {best.replicas} replica(s) without speculation")
    out.append(entry("same GPUs, no spec", off, best.replicas,
                     _simulate(candidate_scenario(base, off, rate, best.replicas, n_req))))
    plain = next((c for c in ranked if c.method == "none" and c.simulated), None) or \
        next((c for c in ranked if c.method == "none"), None)
    if plain is not None:
        prog.update(f"the cheapest deployment without speculation: {plain.label} × {plain.replicas}")
        out.append(entry("cheapest without", plain, plain.replicas,
                         _simulate(candidate_scenario(base, plain, rate, plain.replicas, n_req))))
    return out


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
        c.feasible, c.reason = False, f"needs more than {max_replicas} replicas"
    c.total_gpus = c.replicas * c.tensor_parallel_size
    c.cost_per_hour_usd = c.total_gpus * c.cost_per_gpu_hour_usd


# ---------------------------------------------------------------------------------------------- output
def summary_text(p: PlanResult) -> str:
    r = p.recommendation
    lines = [
        f"Recommendation  {r['replicas']} × {r['gpu']} TP{r['tensor_parallel_size']} = {r['total_gpus']} GPUs, "
        f"speculation {r['method']}" + (f" N={r['num_speculative_tokens']}" if r["method"] != "none" else ""),
        f"                for {r['target_rate_rps']:g} req/s (sized for +{r['headroom']:.0%} headroom), "
        f"${r['cost_per_hour_usd']:,.2f}/hour (assumed $/GPU-h), "
        + (f"${r['cost_per_million_output_tokens_usd']:.2f} per million output tokens" if r.get("cost_per_million_output_tokens_usd") else ""),
    ]
    for s in r.get("slo") or []:
        ach = s.get("achieved")
        lines.append(f"                {s['slo']}: {'-' if ach is None else f'{ach:,.1f}'} "
                     f"({'met' if s['met'] else 'MISSED'})")
    lines.append(f"                one replica fewer: SLOs {'met (!)' if r.get('one_fewer_replica_slo_met') else 'missed'}")
    if r.get("acceptance_basis"):
        basis = r["acceptance_basis"]
        lines.append("                acceptance: " + (basis if len(basis) <= 160 else basis[:157] + "..."))
    sb = r.get("speculation_by_batch")
    if sb:
        lines += ["                " + line for line in summary.speculation_lines(sb)]
    wo = r.get("without_speculation")
    if r["method"] != "none" and wo:
        lines.append(f"Without speculation the best is {wo['label']}: {wo['total_gpus']} GPUs "
                     f"(${wo['cost_per_hour_usd']:,.2f}/hour)" + (f", {wo['note']}" if wo.get("note") else ""))
    runs = [c for c in r.get("comparison") or [] if c.get("metrics")]
    if len(runs) > 1:
        lines.append("")
        lines += summary.metrics_table(f"At {r['target_rate_rps']:g} req/s",
                               [(f"{c['label']}", c["metrics"]) for c in runs])
        cells = [f"{c['gpus']} GPUs, " + ("SLO met" if c["slo_met"] else "SLO missed" if c.get("stable", True)
                                          else "overloaded") for c in runs]
        lines.append(f"{'deployment':28} " + " ".join(f"{x:>22}" for x in cells))
    lines.append("")
    lines.append(f"{'rank':>4}  {'candidate':44} {'req/s/replica':>13} {'replicas':>8} {'GPUs':>5} {'$/hour':>9}  basis")
    for i, c in enumerate([c for c in p.candidates if c["feasible"]][:15], 1):
        lines.append(f"{i:4d}  {c['label']:44} {c['max_rate_per_replica_rps']:13.2f} {c['replicas']:8d} "
                     f"{c['total_gpus']:5d} {c['cost_per_hour_usd']:9.2f}  {'simulated' if c['simulated'] else 'analytic, rescaled'}")
    infeasible = [c for c in p.candidates if not c["feasible"]]
    lines.append(f"({len(p.candidates)} candidates, {len(infeasible)} infeasible; planned in {p.wall_time_s:.0f} s)")
    for c in infeasible[:5]:
        lines.append(f"      infeasible: {c['label']}: {c['reason']}")
    return "\n".join(lines)


def write(p: PlanResult, out) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "plan.json", p.to_json())
    (out / "recommended.yaml").write_text(yaml.safe_dump(p.recommended_scenario, sort_keys=False))
    if p.one_fewer_scenario:
        (out / "one_fewer_replica.yaml").write_text(yaml.safe_dump(p.one_fewer_scenario, sort_keys=False))
    for name, df in p.evidence_requests.items():
        (out / "evidence" / name).mkdir(parents=True, exist_ok=True)
        df.to_csv(out / "evidence" / name / "requests.csv", index=False)
