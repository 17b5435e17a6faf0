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

from capacity.step_cost import StepTime


class Speculation(Protocol):
    def num_spec_tokens(self, batch_size: int) -> int:
        """Draft tokens per decoding request for this step (the policy may depend on load)."""

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        """Extra KV slots vLLM reserves per running request (`num_lookahead_tokens`)."""

    def draft_time(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                   num_spec: np.ndarray) -> StepTime:
        """Time of the drafter's work in this step (component 'draft')."""

    def sample_accepted(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Accepted drafts per request (0..num_spec[i]), left to right."""


class NoSpeculation:
    """Plain autoregressive decoding."""

    def num_spec_tokens(self, batch_size: int) -> int:
        return 0

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        return 0

    def draft_time(self, ids, new_tokens, context_tokens, num_spec) -> StepTime:
        return StepTime({})

    def sample_accepted(self, ids, num_spec, rng) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.int64)
