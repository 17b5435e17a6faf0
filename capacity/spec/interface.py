"""The engine's view of speculative decoding: how many tokens to draft, what drafting costs,
how many drafts survive verification.

The engine only talks to this interface; drafting methods, acceptance models and policies
implement it (see capacity/spec_decode/ when present). `NoSpeculation` is plain decoding: it
drafts nothing and draws no random numbers, so a run with speculation off is byte-identical to
one with N = 0.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from capacity.cost.step_cost import StepTime


class Speculation(Protocol):
    supports_runs: bool   # decode runs may be fast-forwarded (acceptance has no per-request state)

    def num_spec_tokens(self, batch_size: int, mean_context: float | None = None) -> int:
        """Draft tokens per decoding request for this step (the policy may depend on load)."""

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        """Extra KV slots vLLM reserves per running request (`num_lookahead_tokens`)."""

    def draft_time(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                   num_spec: np.ndarray) -> StepTime:
        """Time of the drafter's work in this step (component 'draft')."""

    def sample_accepted(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts per request (0..num_spec[i]), left to right."""

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts for `num_steps` consecutive steps of the same requests (steps × requests)."""

    def skip_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> None:
        """Advance `rng` exactly as `sample_steps` with these arguments would, without the samples."""

    def draft_time_steps(self, num_seqs: int, target_tokens: np.ndarray, context_sum: np.ndarray,
                         num_spec: int) -> np.ndarray:
        """Drafting time of many identical-shape decode steps at once (one value per step)."""


class NoSpeculation:
    """Plain autoregressive decoding."""

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
