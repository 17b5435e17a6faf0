"""Run one scenario: build the cluster from the scenario, drive the traffic, collect metrics.

The path of a request: traffic.build_requests() gives it an arrival time and lengths; the
Cluster's router hands it to a Replica (sim/engine.py), whose steps are priced by StepCostModel
(cost/step_cost.py); when it finishes, metrics.summarize() turns the RequestTable into vLLM-bench
statistics.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from capacity.sim import memory, metrics
from capacity.sim.engine import EngineLimits, Replica, RequestTable
from capacity.sim.prefix_cache import HitCounters
from capacity.errors import CapacityError
from capacity.inputs.hardware import GpuProfile, load_gpu
from capacity.inputs.models import ModelArch, load_model
from capacity.inputs.scenario import Scenario
from capacity.spec.decoding import build_speculation
from capacity.spec.draft_cost import DraftCost
from capacity.spec.interface import Speculation
from capacity.spec.methods import uses_target_hidden_states
from capacity.cost.step_cost import StepCostModel, cudagraph_max_tokens
from capacity.inputs.traffic import RequestStream, build_requests

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Deployed:
    """Everything derived from a scenario before any request arrives."""

    gpu: GpuProfile
    model: ModelArch
    cost: StepCostModel
    limits: EngineLimits
    kv_split: int
    block_bytes: float
    memory: dict[str, float]
    speculation: Speculation
    drop_last_cached_block: bool = False   # vLLM's EAGLE rule for prefix-cache hits (spec.methods.USE_EAGLE_METHODS)

    def kv_blocks_for(self, tokens: np.ndarray) -> np.ndarray:
        per_gpu = (self.model.kv_cache_bytes(tokens) + self.speculation.extra_kv_cache_bytes(tokens)) / self.kv_split
        return np.ceil(per_gpu / self.block_bytes).astype(np.int64)


def deploy(scenario: Scenario, speculation: Speculation | None = None) -> Deployed:
    """Load hardware and model, size the KV cache, and check the model fits."""
    d, e = scenario.deployment, scenario.engine
    gpu = load_gpu(d.gpu)
    if d.gpu_overrides:
        gpu = gpu.with_overrides(**d.gpu_overrides)
    model = load_model(d.model, weight_precision=d.precision, kv_dtype=d.kv_cache_dtype)
    tp = d.tensor_parallel_size
    if tp > gpu.scaleup_world_size:
        raise CapacityError(f"deployment.tensor_parallel_size {tp} spans more than one scale-up domain of {gpu.name} "
                            f"({gpu.scaleup_world_size} GPUs): tensor parallelism across servers is not modelled; use "
                            f"at most {gpu.scaleup_world_size} and more replicas")
    if model.num_attention_heads % tp:
        # vLLM's own check (vllm/config/model.py `ModelConfig.verify_with_parallel_config`): every rank holds a whole
        # number of attention heads
        sizes = ", ".join(str(n) for n in range(1, gpu.scaleup_world_size + 1) if model.num_attention_heads % n == 0)
        raise CapacityError(f"{d.model} has {model.num_attention_heads} attention heads, which "
                            f"deployment.tensor_parallel_size {tp} does not divide (vLLM refuses it); use one of {sizes}")
    if d.expert_parallel and not model.num_moe_layers:
        raise CapacityError(f"deployment.expert_parallel is set but {d.model} has no MoE layers; remove it "
                            "(expert parallelism only applies to mixture-of-experts models)")
    kv_split = 1 if model.uses_mla else tp
    if speculation is None:
        speculation = build_speculation(scenario.speculative.model_dump(), gpu, model, tp, model_runner=e.model_runner,
                                        engine_limits=(e.max_num_seqs, e.max_num_batched_tokens,
                                                       e.max_cudagraph_capture_size))
        _share_draft_memo(speculation)
    extra_weights = speculation.weight_bytes
    weights_per_gpu = (model.weight_bytes_total + extra_weights) / tp
    usable = gpu.runtime_memory_bytes() * e.gpu_memory_utilization
    reserve = (e.activation_reserve_gb * 1e9 if e.activation_reserve_gb is not None
               else memory.reserve_bytes(model, e.max_num_batched_tokens, e.max_num_seqs, tp))
    kv_budget = usable - weights_per_gpu - reserve
    per_token = (model.kv_bytes_per_token or model.swa_kv_bytes_per_token) + speculation.extra_kv_bytes_per_token
    block_bytes = e.block_size * per_token / kv_split
    memory_gb = {
        "hbm_per_gpu_gb": gpu.hbm_capacity_gb,
        "usable_per_gpu_gb": usable / 1e9,
        "weights_per_gpu_gb": weights_per_gpu / 1e9,
        "activation_reserve_per_gpu_gb": reserve / 1e9,
        "kv_cache_per_gpu_gb": max(kv_budget, 0) / 1e9,
    }
    where = f"{model.name} ({model.weight_precision}) on {tp}× {gpu.name}"
    if kv_budget <= 0:
        raise CapacityError(
            f"{where} does not fit: {weights_per_gpu / 1e9:.1f} GB of weights per GPU vs "
            f"{usable / 1e9:.1f} GB usable ({e.gpu_memory_utilization:.0%} of {gpu.runtime_memory_bytes() / 1e9:.1f} GB) "
            f"minus {reserve / 1e9:.1f} GB for vLLM's profiling run; raise deployment.tensor_parallel_size or use a "
            "smaller precision")
    num_blocks = int(kv_budget // block_bytes)
    # vLLM turns async scheduling off for a drafter that runs on the CPU (n-gram; vllm/config/vllm.py)
    async_scheduling = e.async_scheduling and getattr(speculation.method, "kind", None) != "cpu"
    limits = EngineLimits(
        max_num_batched_tokens=e.max_num_batched_tokens, max_num_seqs=e.max_num_seqs,
        block_size=e.block_size, num_gpu_blocks=num_blocks,
        long_prefill_token_threshold=e.long_prefill_token_threshold,
        enable_chunked_prefill=e.enable_chunked_prefill,
        enable_prefix_caching=e.enable_prefix_caching, async_scheduling=async_scheduling)
    memory_gb["kv_cache_tokens"] = num_blocks * e.block_size
    cost = _shared(StepCostModel(gpu, model, tp, model_runner=e.model_runner, expert_parallel=d.expert_parallel,
                                 async_scheduling=async_scheduling,
                                 quick_reduce_quantization=e.quick_reduce_quantization,
                                 attention_backend=e.attention_backend, moe_backend=e.moe_backend,
                                 int4_tiles=e.int4_moe_tiles,
                                 graph_max_tokens=cudagraph_max_tokens(e.max_num_seqs, speculation.num_speculative_tokens,
                                                                       e.max_num_batched_tokens,
                                                                       e.max_cudagraph_capture_size)))
    return Deployed(gpu, model, cost, limits, kv_split, block_bytes, memory_gb, speculation,
                    drop_last_cached_block=uses_target_hidden_states(speculation.method))


# --------------------------------------------------------------------------------------------------
# Exact price memos shared by simulations of the same deployment (a sweep runs many)
# --------------------------------------------------------------------------------------------------

_SHARED: "OrderedDict[str, Any]" = OrderedDict()   # fingerprint -> a StepCostModel or a steps memo
_SHARED_MAX = 16   # entries kept: two per deployment (its StepCostModel; its drafter memo, 2-8 MB)
# caches, not inputs: StepCostModel.tables (attention tables filled as contexts grow) and _shape_memo, and a
# DraftCost's memos
_DERIVED = frozenset({"tables", "_shape_memo"}) | DraftCost.MEMO_ATTRIBUTES
_SHARED_LOCK = threading.Lock()                     # a sweep may simulate in threads


class _Unfit(Exception):
    """An attribute the fingerprint cannot vouch for (a function, a handle): do not share."""


def _fingerprint(obj: Any) -> str | None:
    """Every input of a pricing object as text: numbers (repr, exact), strings, containers, and
    the attributes of nested objects, skipping the caches derived from them (_DERIVED). Two objects
    with the same fingerprint price every step alike (the pricing code is the same in a process).
    None when an attribute is not plain data."""
    out: list[str] = []
    seen: dict[int, int] = {}

    def walk(x: Any, depth: int) -> None:
        if x is None or isinstance(x, (bool, int, float, str, np.integer, np.floating)):
            out.append(f"{type(x).__name__}:{x!r}")
        elif depth > 8:
            raise _Unfit
        elif isinstance(x, np.ndarray):
            out.append(f"array{x.dtype.str}{x.shape}:{x.tobytes().hex()}")
        elif isinstance(x, (list, tuple, frozenset, set)):
            out.append(type(x).__name__ + "[")
            for v in (sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x):
                walk(v, depth + 1)
            out.append("]")
        elif isinstance(x, dict):
            out.append("{")
            for k, v in x.items():
                walk(k, depth + 1)
                walk(v, depth + 1)
            out.append("}")
        elif hasattr(x, "__dict__") and not callable(x):
            if id(x) in seen:                       # the same object again (a GPU profile in every piece)
                out.append(f"@{seen[id(x)]}")
                return
            seen[id(x)] = len(seen)
            out.append(type(x).__module__ + "." + type(x).__qualname__ + "(")
            for k, v in vars(x).items():
                if k not in _DERIVED:
                    out.append(k)
                    walk(v, depth + 1)
            out.append(")")
        else:
            raise _Unfit

    try:
        walk(obj, 0)
    except _Unfit:
        return None
    return "\x1f".join(out)


def _remember(key: str, value: Any) -> Any:
    """The value shared under key (the given one when new), least recently used evicted."""
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = value
            if len(_SHARED) > _SHARED_MAX:
                _SHARED.popitem(last=False)
        else:
            _SHARED.move_to_end(key)
        return shared


def _shared(cost: StepCostModel) -> StepCostModel:
    """An equal StepCostModel already built (its attention tables already filled), else this one."""
    key = _fingerprint(cost)
    return cost if key is None else _remember("cost\x1e" + key, cost)


def _share_draft_memo(speculation: Speculation) -> None:
    """Let the drafter's `steps_time_s` memo (per (batch, tokens, drafts) and block of context sums,
    filled at about 0.5 ms a block) and its memo of linear-layer prices per piece and shape (about
    500 entries in the default scenario, ~30 us each) carry over between simulations of equal
    DraftCosts. Their keys and values depend only on the DraftCost's inputs, so a shared entry holds
    the same bits. The attention tables of the drafter's pieces (`AttentionTables`, filled as contexts
    grow: some 40 table builds, ~6 ms, per simulation of the default scenario) carry over likewise
    (`DraftCost.price_memos` / `adopt_price_memos`)."""
    cost = speculation.draft_cost
    key = None if cost is None else _fingerprint(cost)
    if key is not None:
        cost.adopt_price_memos(_remember("draft\x1e" + key, cost.price_memos()))


def has_request_delay(efficiency: dict[str, float]) -> bool:
    """Whether a request waits in the serving stack before reaching a scheduler (`request_delays_s`)."""
    return any(float(efficiency.get(k, 0.0) or 0.0) > 0 for k in ("request_overhead_ms", "prompt_token_overhead_us"))


def request_delays_s(efficiency: dict[str, float], prompt_tokens: np.ndarray) -> np.ndarray:
    """Each request's serving-stack time between being sent and reaching a scheduler (s):
    request_overhead_ms plus prompt_token_overhead_us per prompt token."""
    return (efficiency["request_overhead_ms"] * 1e-3
            + efficiency.get("prompt_token_overhead_us", 0.0) * 1e-6 * np.asarray(prompt_tokens, dtype=float))


# the llm-d endpoint picker's scorer weights for the prefix_aware router (Cluster._prefix_aware)
PREFIX_WEIGHT = 3.0
QUEUE_WEIGHT = 2.0


class Cluster:
    """Replicas behind a router; open-loop arrivals, a closed loop of `concurrency` users, or
    conversations (a session's next turn is sent when its previous answer is complete, plus the
    user's think time: `RequestStream.follows` / `think_s`)."""

    def __init__(self, env: simpy.Environment, deployed: Deployed, stream: RequestStream,
                 replicas: int, router: str, rng: np.random.Generator, rejected: np.ndarray | None = None):
        self.env = env
        self.stream = stream
        self.table = RequestTable(stream.prompt_tokens, stream.output_tokens, stream.arrival_s)
        # requests the server refuses (longer than max_model_len): sent, answered with an error, never scheduled
        self.rejected = np.zeros(len(stream), dtype=bool) if rejected is None else np.asarray(rejected, dtype=bool)
        self.router = router
        self._rr = 0
        self._next = 0
        self._next_arrival_s: float | None = None   # when the open loop's pending arrival fires
        self._done = 0
        self.all_done = env.event()
        # serving-stack time before a sent request reaches a scheduler, per request: a constant (HTTP, request
        # handling) and a part per prompt token (the API server tokenises the prompt text it was sent)
        eff = deployed.gpu.efficiency
        self.request_delay_s: list[float] = request_delays_s(eff, self.table.prompt).tolist()
        self.block_size = deployed.limits.block_size
        self.prefix_keys = stream.prefix_keys if deployed.limits.enable_prefix_caching else None
        self._affinity: dict[int, Replica] = {}     # session -> the replica its first turn went to
        rngs = rng.spawn(replicas)
        self.replicas = [
            Replica(env, i, self.table, deployed.cost, deployed.limits, deployed.kv_blocks_for,
                    self._finished, rngs[i], deployed.speculation, prefix_keys=self.prefix_keys,
                    drop_last_hit=deployed.drop_last_cached_block)
            for i in range(replicas)]
        follows = stream.follows
        self._next_turn: np.ndarray | None = None
        first_sent = np.arange(len(stream))
        if follows is not None and (follows >= 0).any():
            later = np.flatnonzero(follows >= 0)
            self._next_turn = np.full(len(stream), -1, dtype=np.int64)
            self._next_turn[follows[later]] = later
            first_sent = np.flatnonzero(follows < 0)
        if stream.concurrency is None:
            if self._next_turn is None:
                for r in self.replicas:
                    r.next_arrival = self.next_arrival_for
            env.process(self._open_loop(first_sent))
        else:
            for _ in range(min(stream.concurrency, len(stream))):
                self._dispatch_next()

    # ------------------------------------------------------------------ routing
    def _pick(self, rid: int) -> Replica:
        router = self.router
        if router == "round_robin":
            r = self.replicas[self._rr % len(self.replicas)]
            self._rr += 1
            return r
        if router == "session_affinity" and self.stream.session is not None:
            session = int(self.stream.session[rid])
            if session >= 0:
                r = self._affinity.get(session)
                if r is None:
                    r = self._affinity[session] = self._least_outstanding()
                return r
        if router == "prefix_aware" and self.prefix_keys is not None and len(self.replicas) > 1:
            return self._prefix_aware(rid)
        return self._least_outstanding()

    def _least_outstanding(self) -> Replica:
        return min(self.replicas, key=lambda r: r.outstanding)  # ties: lowest index

    def _prefix_aware(self, rid: int) -> Replica:
        """llm-d's endpoint picker with its prefix-cache and queue scorers: score = 3 x (share of the
        prompt cached on the replica) + 2 x (max waiting - waiting) / (max waiting - min waiting)
        (1 when all queues are equal), the highest score wins, ties to the least outstanding.
        Weights: the Red Hat OpenShift AI default profile (prefix cache 3, queue depth 2), as quoted in
        the llm-d / OpenShift AI scheduler docs; the prefix score as the share of the prompt's blocks
        cached there is assumed (llm-d's precise scorer counts matched blocks; the normalisation by the
        prompt is ours); the queue score is the Gateway API Inference
        Extension's queue scorer (kubernetes-sigs/gateway-api-inference-extension,
        pkg/epp/scheduling/framework/plugins/scorer/queue.go @ffea263, lines 81-95)."""
        keys = self.prefix_keys.block_keys(rid, self.block_size)
        prompt = int(self.table.prompt[rid])
        cached = [r.cached_prefix_tokens(keys, prompt) for r in self.replicas]
        waiting = [len(r.waiting) for r in self.replicas]
        low, high = min(waiting), max(waiting)
        best, best_key = None, None
        for r, c, w in zip(self.replicas, cached, waiting):
            score = PREFIX_WEIGHT * c / prompt + QUEUE_WEIGHT * ((high - w) / (high - low) if high > low else 1.0)
            key = (-score, r.outstanding, r.index)
            if best_key is None or key < best_key:
                best, best_key = r, key
        return best

    # ------------------------------------------------------------------ sending
    def _dispatch_next(self) -> None:
        """Closed loop: send the next request now."""
        rid = self._next
        self._next += 1
        self.table.arrival[rid] = self.env.now
        self._send(rid, delayed=self.request_delay_s[rid] > 0)

    def _send(self, rid: int, delayed: bool = False) -> None:
        """The request reaches the router (after the serving stack's delay when `delayed`)."""
        if self.rejected[rid]:
            self._pick(rid)         # the load balancer still sends it (a round-robin turn), the replica refuses it
            self._refused(rid)
            return
        if delayed:
            self.env.timeout(self.request_delay_s[rid]).callbacks.append(lambda _ev, rid=rid: self._pick(rid).submit(rid))
            return
        self._pick(rid).submit(rid)

    def _open_loop(self, order: np.ndarray):
        """Sends the requests in `order` (by send time); each reaches the router after its own delay, so
        a long prompt sent first can reach it after a short one sent just after it."""
        arrivals = self.table.arrival
        delay = self.request_delay_s
        reach = arrivals[order] + np.asarray(delay, dtype=float)[order]
        for rid in order[np.argsort(reach, kind="stable")].tolist():
            wait = arrivals[rid] + delay[rid] - self.env.now
            if wait > 0:
                self._next_arrival_s = self.env.now + wait    # the timeout's time, as SimPy computes it
                yield self.env.timeout(wait)
            self._send(rid)
        self._next_arrival_s = None

    def _next_turns(self, ids: np.ndarray) -> None:
        """The users whose answers just finished send their next turns after their think time."""
        think = self.stream.think_s
        for rid in ids.tolist():
            nxt = int(self._next_turn[rid])
            if nxt < 0:
                continue
            wait = float(think[nxt]) if think is not None else 0.0
            self.table.arrival[nxt] = self.env.now + wait
            self.env.timeout(wait + self.request_delay_s[nxt]).callbacks.append(lambda _ev, nxt=nxt: self._send(nxt))

    def next_arrival_for(self, replica: Replica) -> float | None:
        """When the open loop's next request arrives, if it will go to `replica` (the only replica, or
        its turn in round robin), else None. Lets a decode run end at that arrival without being
        interrupted (Replica._decode_run)."""
        n = len(self.replicas)
        if n == 1 or (self.router == "round_robin" and self.replicas[self._rr % n] is replica):
            return self._next_arrival_s
        return None

    def _refused(self, rid: int) -> None:
        """A refused request is done without a scheduler: a closed-loop user gets the error after the
        serving stack's delay and sends the next request (an event, not a call: a run of refused
        requests must not recurse)."""
        if self.stream.concurrency is not None:
            self.env.timeout(self.request_delay_s[rid]).callbacks.append(lambda _ev: self._finished(np.array([rid])))
        else:
            self._finished(np.array([rid]))

    def _finished(self, ids: np.ndarray) -> None:
        self._done += len(ids)
        if self.stream.concurrency is not None:
            for _ in range(len(ids)):
                if self._next < len(self.stream):
                    self._dispatch_next()
        if self._next_turn is not None:
            self._next_turns(ids)
        if self._done >= len(self.stream) and not self.all_done.triggered:
            self.all_done.succeed()

    def prefix_cache_counters(self) -> list[HitCounters] | None:
        """Each replica's prefix-cache hit counters, None with caching off."""
        if self.replicas[0].counters is None:
            return None
        return [r.counters for r in self.replicas]


@dataclass
class SimulationResult:
    scenario: Scenario
    deployed: Deployed
    request_columns: metrics.Columns                      # one row per request (`requests`: as a DataFrame)
    metrics: dict[str, Any]
    step_breakdown_s: dict[str, float]
    num_steps: int
    sim_time_s: float
    wall_time_s: float
    extras: dict[str, Any] = field(default_factory=dict)   # extra JSON-able sections for the payload
    cluster: Cluster | None = None                        # the simulated cluster (per-step records)
    comparison: "SimulationResult | None" = None          # the same traffic without speculation

    @functools.cached_property
    def requests(self) -> "pd.DataFrame":
        """One row per request (`_request_columns`), as a pandas DataFrame (built on first use)."""
        return self.request_columns.to_frame()

    @property
    def stable(self) -> bool:
        return bool(self.metrics["stable"])

    @property
    def num_gpus(self) -> int:
        d = self.scenario.deployment
        return d.tensor_parallel_size * d.replicas


@contextlib.contextmanager
def _without_cyclic_gc():
    """The cyclic garbage collector off while the engine runs: a simulation makes almost no cyclic
    garbage (a dozen objects in 3,000 requests on 8 replicas, measured with the collector off), so
    its collections, triggered by the many short-lived objects of every step, would only scan live
    ones. Reference counting still frees everything else; the collector is turned back on after
    (unless it was off already)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def run(scenario: Scenario, speculation: Speculation | None = None,
        stream: RequestStream | None = None) -> SimulationResult:
    """Simulate a scenario. Deterministic for a given scenario (its seed included)."""
    wall0 = time.perf_counter()
    deployed = deploy(scenario, speculation)
    seeds = np.random.SeedSequence(scenario.simulation.seed).spawn(2)
    traffic_rng, engine_rng = np.random.default_rng(seeds[0]), np.random.default_rng(seeds[1])
    if stream is None:
        stream = build_requests(scenario.traffic, traffic_rng)
    if len(stream) == 0:
        raise CapacityError("the traffic produced no requests: set traffic.num_requests or traffic.duration_s")
    # vLLM refuses a request whose prompt + output exceed max_model_len (the server's input check);
    # `vllm bench serve` counts it as failed and leaves it out of every statistic
    lengths = stream.prompt_tokens + stream.output_tokens
    max_model_len = scenario.engine.max_model_len or deployed.model.max_position_embeddings
    rejected = lengths > max_model_len if max_model_len else np.zeros(len(stream), dtype=bool)
    if rejected.all():
        raise CapacityError(f"every request is longer than max_model_len {max_model_len:,} tokens (prompt + output "
                            f"up to {int(lengths.max()):,}); shorten the requests or raise engine.max_model_len "
                            f"within the model's context window")
    longest = int(lengths[~rejected].max())
    need = int(deployed.kv_blocks_for(np.array([longest]))[0])
    if need > deployed.limits.num_gpu_blocks:
        raise CapacityError(
            f"the KV cache holds {deployed.memory['kv_cache_tokens']:,} tokens per replica but a request needs {longest:,}: "
            "raise deployment.tensor_parallel_size, engine.gpu_memory_utilization or shorten the requests")
    env = simpy.Environment()
    d = scenario.deployment
    cluster = Cluster(env, deployed, stream, d.replicas, d.router, engine_rng, rejected)
    open_loop = stream.concurrency is None
    last_arrival = float(np.nanmax(stream.arrival_s)) if open_loop else 0.0
    horizon = scenario.simulation.max_sim_time_s or (last_arrival * 1.5 + 300.0 + _longest_think_s(stream)
                                                     if open_loop else None)
    with _without_cyclic_gc():
        if horizon is None:
            env.run(until=cluster.all_done)
        else:
            env.run(until=env.any_of([cluster.all_done, env.timeout(horizon)]))
    for r in cluster.replicas:
        r.flush()                                   # requests still running at the horizon
    requests = _request_columns(cluster, stream)
    rec = [r.recorder for r in cluster.replicas]
    itl = np.concatenate([c for r in rec for c in r.itl_chunks]) if any(r.itl_chunks for r in rec) else np.zeros(0)
    # per-replica step series, merged in time order (statistics are per replica, time-weighted)
    t_series = np.concatenate([np.asarray(r.t) for r in rec])
    order = np.argsort(t_series, kind="stable")
    series = {name: np.concatenate([np.asarray(getattr(r, name), dtype=float) for r in rec])[order]
              for name in ("waiting", "running", "kv_used")}
    sent = cluster.table.arrival                    # conversations' later turns are stamped when sent
    run_info = metrics.RunInfo(
        start_s=float(np.nanmin(sent)),
        end_s=float(env.now),
        num_gpus=d.tensor_parallel_size * d.replicas,
        offered_rate_rps=_offered_rate(sent[~np.isnan(sent)]) if open_loop else None,
        arrival_window_end_s=float(np.nanmax(sent)) if open_loop else None,
        t_s=t_series[order],
        waiting=series["waiting"],
        running=series["running"],
        kv_used_fraction=series["kv_used"],
    )
    slos = metrics.parse_slos(scenario.slo) if scenario.slo else None
    summary = metrics.summarize(requests, itl, run_info, slos)
    counters = cluster.prefix_cache_counters()
    if counters is not None:
        summary.update(_prefix_cache_metrics(counters))
    breakdown: dict[str, float] = {}
    for r in rec:
        for k, v in r.parts.items():
            breakdown[k] = breakdown.get(k, 0.0) + v
    return SimulationResult(
        scenario=scenario, deployed=deployed, request_columns=requests, metrics=summary,
        step_breakdown_s=breakdown, num_steps=sum(r.num_steps for r in rec), sim_time_s=float(env.now),
        wall_time_s=time.perf_counter() - wall0, cluster=cluster)


def _prefix_cache_metrics(counters: list[HitCounters]) -> dict[str, Any]:
    """vLLM's prefix-cache counters: the hit rate of new requests (prefix_cache_hits /
    prefix_cache_queries, in tokens) overall and per replica, resumed (preempted) requests apart."""
    total = HitCounters()
    for c in counters:
        total = total.add(c)
    overall = total.summary()
    return {
        "prefix_cache_hit_rate": overall["prefix_cache_hit_rate"],
        "prefix_cache": {**overall, "per_replica": [c.summary() for c in counters]},
    }


def _longest_think_s(stream: RequestStream) -> float:
    """The most think time one conversation spends between its turns (0 without sessions): the
    open-loop horizon is stretched by it, since later turns are sent after the last session starts."""
    if stream.session is None or stream.think_s is None or not len(stream):
        return 0.0
    session = np.asarray(stream.session)
    own = session >= 0
    if not own.any():
        return 0.0
    return float(np.bincount(session[own], weights=np.asarray(stream.think_s, dtype=float)[own]).max())


def _offered_rate(a: np.ndarray) -> float:
    span = float(a.max() - a.min())
    return (len(a) - 1) / span if span > 0 else float("inf")


def _request_columns(cluster: Cluster, stream: RequestStream) -> metrics.Columns:
    t = cluster.table
    return metrics.Columns({
        "request_id": np.arange(len(t)),
        "class_name": np.asarray(stream.class_names, dtype=object)[stream.class_index] if stream.class_names else "",
        "replica": t.replica,
        "arrival_s": t.arrival,
        "first_scheduled_s": t.first_scheduled,
        "first_token_s": t.first_token,
        "finish_s": t.finish,
        "prompt_tokens": t.prompt,
        "output_tokens": t.target,
        "num_chunks": t.num_chunks,
        "num_preemptions": t.num_preemptions,
        "spec_drafted": t.spec_drafted,
        "spec_accepted": t.spec_accepted,
        "spec_steps": t.spec_steps,
        "rejected": cluster.rejected,
        **({"cached_tokens": t.cached_tokens} if cluster.replicas[0].counters is not None else {}),
        # conversations: the session of each request and the previous turn it follows (-1: a first turn)
        **({"session": np.asarray(stream.session), "follows": np.asarray(stream.follows)}
           if stream.session is not None else {}),
    })
