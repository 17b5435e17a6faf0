"""What the engine (capacity/sim/engine.py) and the speculation policies (capacity/spec/policies.py)
use of a step pricer: the `StepCost` protocol, implemented by `capacity.cost.step_cost.StepCostModel`.

A step is described by its `StepFeatures` (tokens, sequences, sampled rows, attention FLOPs, KV
bytes read, verifying sequences) and priced by component in seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from capacity.cost.step_cost import StepFeatures

if TYPE_CHECKING:
    from capacity.inputs.models import ModelArch


class StepCost(Protocol):
    model: ModelArch   # the architecture priced (policies read its attention FLOPs and KV bytes)

    def features(self, new_tokens: np.ndarray, context_tokens: np.ndarray,
                 num_sampled: float | None = None, num_spec: np.ndarray | None = None) -> StepFeatures:
        """Features of one forward pass: `new_tokens[i]` tokens of sequence i ending at context
        `context_tokens[i]`, `num_spec[i]` of them drafts to verify (None: no speculation)."""

    def decode_features(self, context_tokens: np.ndarray, tokens_per_seq: int = 1) -> StepFeatures:
        """Features of many decode steps at once (context_tokens: steps × sequences)."""

    def time_parts(self, f: StepFeatures, efficiency: dict[str, float] | None = None,
                   with_overhead: bool = True) -> dict[str, np.ndarray | float]:
        """Seconds per component of the step(s) `f` (scalars or arrays of many steps)."""
