"""The engine's view of speculative decoding: how many tokens to draft, what drafting costs,
how many drafts survive verification, and what the drafter holds in memory.

The engine (capacity/sim/engine.py), the deployment (capacity/sim/simulate.py) and the studies only
talk to this interface; `capacity.spec.decoding.SpeculativeDecoding` implements it from a method,
a `DraftCost`, an acceptance model and a policy. `NoSpeculation` is plain decoding: it drafts
nothing, holds nothing and draws no random numbers, so a run with speculation off is byte-identical
to one with N = 0.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from capacity.cost.step_cost import StepTime
from capacity.spec.acceptance import AcceptanceModel
from capacity.spec.draft_cost import ArrayLike, DraftCost
from capacity.spec.methods import DraftMethod


class Speculation(Protocol):
    # what is configured (None / 0 for plain decoding)
    method: DraftMethod | None              # the drafting method
    num_speculative_tokens: int             # the configured maximum N per request and step
    draft_cost: DraftCost | None            # prices the drafter's work
    acceptance: AcceptanceModel | None      # how many drafts survive verification

    @property
    def supports_runs(self) -> bool:
        """Decode runs may be fast-forwarded (the acceptance model keeps no per-request state)."""

    # memory the drafter takes from the KV budget
    @property
    def weight_bytes(self) -> float:
        """Draft weights held in HBM, all TP ranks together."""

    @property
    def extra_kv_bytes_per_token(self) -> float:
        """Drafter KV cache per context token, all TP ranks (full-attention layers)."""

    def extra_kv_cache_bytes(self, context_tokens: ArrayLike) -> np.ndarray:
        """Drafter cache bytes per sequence (all TP ranks) at each context length, sliding layers capped."""

    # per engine step
    def num_spec_tokens(self, batch_size: int, mean_context: float | None = None) -> int:
        """Draft tokens per decoding request for this step (the policy may depend on load)."""

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        """Extra KV slots vLLM reserves per running request (`num_lookahead_tokens`)."""

    def draft_time(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                   num_spec: np.ndarray) -> StepTime:
        """Time of the drafter's work in this step (component 'draft')."""

    def sample_accepted(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts per request (0..num_spec[i]), left to right."""

    # per decode run (only when supports_runs)
    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts for `num_steps` consecutive steps of the same requests (steps × requests)."""

    def skip_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> None:
        """Advance `rng` exactly as `sample_steps` with these arguments would, without the samples."""

    def draft_time_steps(self, num_seqs: int, target_tokens: np.ndarray, context_sum: np.ndarray,
                         num_spec: int) -> np.ndarray:
        """Drafting time of many identical-shape decode steps at once (one value per step)."""


class NoSpeculation:
    """Plain autoregressive decoding."""

    method = None
    num_speculative_tokens = 0
    draft_cost = None
    acceptance = None
    supports_runs = True
    weight_bytes = 0.0
    extra_kv_bytes_per_token = 0.0

    def extra_kv_cache_bytes(self, context_tokens) -> np.ndarray:
        return np.zeros(np.shape(context_tokens))

    def num_spec_tokens(self, batch_size: int, mean_context: float | None = None) -> int:
        return 0

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        return 0

    def draft_time(self, ids, new_tokens, context_tokens, num_spec) -> StepTime:
        return StepTime({})

    def sample_accepted(self, ids, num_spec, rng) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.int64)

    def sample_steps(self, ids, num_spec, num_steps, rng) -> np.ndarray:
        return np.zeros((num_steps, len(ids)), dtype=np.int64)

    def skip_steps(self, ids, num_spec, num_steps, rng) -> None:
        return None

    def draft_time_steps(self, num_seqs, target_tokens, context_sum, num_spec) -> np.ndarray:
        return np.zeros(np.shape(target_tokens))
