"""The object the engine talks to for speculative decoding (`SpeculativeDecoding`, the
`capacity.spec.interface.Speculation` protocol) and `build_speculation`, which assembles it from a
scenario's `speculative` section: the method (`capacity.spec.methods`), the drafter's price
(`capacity.spec.draft_cost`), the acceptance model (`capacity.spec.acceptance`) and the policy that
picks N per step (`capacity.spec.policies`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from capacity.errors import CapacityError
from capacity.inputs.models import ModelArch, load_model
from capacity.spec.acceptance import AcceptanceModel, acceptance_from_config
from capacity.spec.draft_cost import ArrayLike, DraftCost
from capacity.spec.interface import NoSpeculation, Speculation
from capacity.spec.methods import NO_SPECULATION, DraftMethod, get_method, max_num_speculative_tokens
from capacity.spec.policies import SpeculationPolicy, StaticPolicy, policy_from_config
from capacity.cost.step_cost import AttentionTables, StepCostModel, StepTime, cudagraph_max_tokens, int_sum

if TYPE_CHECKING:
    from capacity.inputs.hardware import GpuProfile


# --------------------------------------------------------------------------------------------------
# The engine's Speculation
# --------------------------------------------------------------------------------------------------

class SpeculativeDecoding:
    """Speculative decoding as the engine sees it (`capacity.spec.interface.Speculation`): a policy
    picks N per step, the DraftCost prices the drafter, the acceptance model draws accepted drafts.

    `lookahead_tokens` returns the configured maximum N for methods that reserve lookahead slots,
    whatever this step's N: vLLM's scheduler passes the constant `num_lookahead_tokens` =
    num_speculative_tokens to every allocate_slots call (methods.yaml [sched]).
    """

    def __init__(self, method: DraftMethod, draft_cost: DraftCost, acceptance: AcceptanceModel,
                 policy: SpeculationPolicy, num_speculative_tokens: int):
        self.method = method
        self.draft_cost = draft_cost
        self.acceptance = acceptance
        self.policy = policy
        self.num_speculative_tokens = int(num_speculative_tokens)
        self._last_mean_context = 0.0

    @property
    def weight_bytes(self) -> float:
        """Draft weights held in HBM, all TP ranks together."""
        return self.draft_cost.weight_bytes

    @property
    def extra_kv_bytes_per_token(self) -> float:
        """Drafter KV cache per context token (full-attention layers; see `extra_kv_cache_bytes`)."""
        return self.draft_cost.extra_kv_bytes_per_token

    def extra_kv_cache_bytes(self, context_tokens: ArrayLike) -> np.ndarray:
        """Drafter cache bytes per sequence (all TP ranks) at each context length, sliding layers capped."""
        return self.draft_cost.extra_kv_cache_bytes(context_tokens)

    def num_spec_tokens(self, batch_size: int, mean_context: float | None = None) -> int:
        """Draft tokens per decoding request this step. `mean_context` defaults to the mean context of
        the last step priced by `draft_time`."""
        ctx = self._last_mean_context if mean_context is None else float(mean_context)
        return int(self.policy.num_spec_tokens(int(batch_size), ctx))

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        return self.num_speculative_tokens if self.method.reserves_lookahead else 0

    def draft_time(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                   num_spec: np.ndarray) -> StepTime:
        """The drafter runs over every scheduled request (vLLM's padded drafter batch). Its N is this
        step's verification width when any request verifies drafts, else what the policy picks for
        this batch (a step of prefills still drafts for the requests whose prompt completes)."""
        if len(ids) == 0:
            return StepTime({})
        few = len(ids) <= AttentionTables.MAX_ROWS
        if not (few and type(context_tokens) is list and type(new_tokens) is list):   # lists: whole numbers
            context_tokens = np.asarray(context_tokens)
            new_tokens = np.asarray(new_tokens)
            few = few and context_tokens.dtype.kind in "iu" and new_tokens.dtype.kind in "iu"
            if few:
                context_tokens, new_tokens = context_tokens.tolist(), new_tokens.tolist()
        if few:                                 # the engine's steps: Python lists, priced in plain Python
            self._last_mean_context = sum(context_tokens) / len(context_tokens)
        else:
            whole = context_tokens.dtype.kind in "iu"
            self._last_mean_context = int_sum(context_tokens) / len(context_tokens) if whole \
                else float(context_tokens.mean())   # the same number, faster
        if type(num_spec) is list or isinstance(num_spec, np.ndarray):
            n = max(num_spec if type(num_spec) is list else num_spec.tolist(), default=0)
        else:
            n = int(np.max(num_spec, initial=0))
        if n <= 0:
            n = self.num_spec_tokens(len(ids), self._last_mean_context)
        if n <= 0:
            return StepTime({})
        return StepTime({"draft": self.draft_cost.step_time_s(new_tokens, context_tokens, n)})

    def sample_accepted(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.acceptance.sample(ids, num_spec, rng), dtype=np.int64)

    @property
    def supports_runs(self) -> bool:
        """Decode runs can be fast-forwarded when acceptance keeps no per-request state (sampling
        several steps ahead then costs nothing in fidelity)."""
        return self.acceptance.supports_runs

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.acceptance.sample_steps(ids, num_spec, num_steps, rng), dtype=np.int64)

    def skip_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> None:
        self.acceptance.skip_steps(ids, num_spec, num_steps, rng)   # (runs need a stateless model: supports_runs)

    def draft_time_steps(self, num_seqs: int, target_tokens: np.ndarray, context_sum: np.ndarray,
                         num_spec: int) -> np.ndarray:
        if num_spec > 0 and isinstance(num_seqs, (int, np.integer)) and isinstance(target_tokens, (float, int)) \
                and isinstance(context_sum, np.ndarray) and context_sum.dtype.kind in "iu":
            return self.draft_cost.steps_time_s(num_seqs, target_tokens, context_sum, num_spec)  # the engine's runs
        shape = np.broadcast_shapes(np.shape(target_tokens), np.shape(context_sum))
        if num_spec <= 0:
            return np.zeros(shape)
        seqs = np.broadcast_to(np.asarray(num_seqs, dtype=float), shape)
        return np.asarray(self.draft_cost.time_s(seqs, target_tokens, context_sum, num_spec), dtype=float)


def _as_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):
        return dict(cfg.model_dump())
    if not isinstance(cfg, Mapping):
        raise CapacityError("the speculative section must be a mapping with method and num_speculative_tokens")
    return dict(cfg)


def resolve_draft(method: DraftMethod, target: ModelArch, draft: str | None) -> ModelArch | None:
    """The draft architecture for `method` on `target`: the given id/path or the seed article's default."""
    if method.drafter != "checkpoint":
        return None
    name = draft or method.default_draft(target.name)
    if not name:
        known = ", ".join(method.default_drafts) or "none"
        raise CapacityError(f"no default {method.name} draft for {target.name} (defaults exist for: {known}); "
                            f"set speculative.draft to a draft checkpoint id or a config.json path")
    return load_model(name, kv_dtype=target.kv_dtype)


def build_speculation(spec_cfg: Any, gpu: GpuProfile, target: ModelArch, tp: int,
                      model_runner: str = "v1", allow_n_past_block: bool = False,
                      engine_limits: tuple[int, int, int | None] | None = None) -> Speculation:
    """The engine's Speculation for a scenario's `speculative` section
    {method, num_speculative_tokens, draft, acceptance, policy[, overrides]}.

    method 'none' or N = 0 gives NoSpeculation. `overrides` sets method parameters (e.g.
    {draft_pass_overhead_us: 80}). method 'mtp' with a Gemma 4 assistant draft means gemma4_mtp (as in
    vLLM, where Gemma 4 MTP is method 'mtp' with a model).

    `allow_n_past_block` lets N exceed a block drafter's trained block (block_size - 1), which vLLM
    refuses by default: the seed article ran Kimi-K2.5's block-8 DFlash drafter at N = 11 and 15 and
    measured acceptance at every one of the N positions, so those blocks ran. The drafter is then
    priced with the N asked for (one forward over N + 1 queries) under a static policy.

    `engine_limits` (max_num_seqs, max_num_batched_tokens, the server's max_cudagraph_capture_size or None) give the
    policy's step-time estimate vLLM's graph capture size (`cudagraph_max_tokens`), so it prices a verification batch
    too large for a graph as the simulation does; None: every step is priced as graph-replayed."""
    cfg = _as_dict(spec_cfg)
    if allow_n_past_block:
        n = int(cfg.get("num_speculative_tokens") or 0)
        name = str(cfg.get("method") or "none").strip().lower()
        if n > 0 and name not in NO_SPECULATION:
            method = get_method(name)
            limit = None
            if method.max_n_rule == "block_size_minus_1":
                limit = max_num_speculative_tokens(method, target, resolve_draft(method, target, cfg.get("draft")))
            if limit is not None and n > limit:
                base = build_speculation({**cfg, "num_speculative_tokens": limit}, gpu, target, tp, model_runner,
                                         engine_limits=engine_limits)
                return SpeculativeDecoding(base.method, base.draft_cost, base.acceptance, StaticPolicy(n), n)
    name = str(cfg.get("method") or "none").strip().lower()
    n = int(cfg.get("num_speculative_tokens") or 0)
    if n < 0:
        raise CapacityError(f"speculative.num_speculative_tokens is {n}; use 0 (off) or a positive number")
    if name in NO_SPECULATION or n == 0:
        return NoSpeculation()
    method = get_method(name)
    draft_name = cfg.get("draft")
    if method.name == "mtp" and draft_name:
        method = get_method("gemma4_mtp")
    draft = resolve_draft(method, target, str(draft_name) if draft_name else None)
    policy_cfg = cfg.get("policy")
    n_max = n
    if isinstance(policy_cfg, Mapping) and str(policy_cfg.get("kind", "")).lower() == "goodput" \
            and policy_cfg.get("max_n") is not None:
        n_max = int(policy_cfg["max_n"])
    overrides = cfg.get("overrides") or cfg.get("method_overrides")
    draft_cost = DraftCost(method, gpu, target, draft, tp, max(n, n_max), overrides)

    acc_cfg = cfg.get("acceptance")
    acc_dict = acc_cfg if isinstance(acc_cfg, Mapping) else {}
    kwargs: dict[str, Any] = {}
    if acc_dict.get("dataset") is not None:
        kwargs["dataset"] = acc_dict["dataset"]
    if acc_dict.get("temperature") is not None:
        kwargs["temperature"] = float(acc_dict["temperature"])
    acceptance = acceptance_from_config(acc_cfg, method=method.name, target=target.name, **kwargs)
    graph_max_tokens = None if engine_limits is None else cudagraph_max_tokens(engine_limits[0], n, *engine_limits[1:])
    target_cost = StepCostModel(gpu, target, tp, model_runner=model_runner, graph_max_tokens=graph_max_tokens)
    policy = policy_from_config(policy_cfg, n, target_cost=target_cost, draft_cost=draft_cost,
                                acceptance=acceptance)
    return SpeculativeDecoding(method, draft_cost, acceptance, policy, policy.max_num_spec_tokens)
