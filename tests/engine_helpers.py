"""Step-cost stand-ins for engine tests (tests/test_engine.py, tests/test_prefix_cache.py)."""

from __future__ import annotations

import numpy as np
import simpy

from capacity.cost.step_cost import StepFeatures
from capacity.sim.engine import Replica, RequestTable


class ConstantCost:
    """Every step takes `step_s`, whatever the batch."""

    def __init__(self, step_s: float):
        self.step_s = step_s

    def features(self, new_tokens, context_tokens, num_sampled=None, num_spec=None):
        return StepFeatures(float(np.sum(new_tokens)), float(len(new_tokens)), float(len(new_tokens)), 0.0, 0.0)

    def decode_features(self, ctx, tokens_per_seq=1):
        k, b = ctx.shape
        return StepFeatures(np.full(k, float(b)), np.full(k, float(b)), np.full(k, float(b)), np.zeros(k), np.zeros(k))

    def time_parts(self, f):
        return {"overhead": np.full(np.shape(f.num_tokens), self.step_s) if np.ndim(f.num_tokens) else self.step_s}


class LinearCost(ConstantCost):
    """step = a + b · tokens: a decode-heavy step grows with the batch."""

    def __init__(self, a: float, b: float):
        self.a, self.b = a, b

    def time_parts(self, f):
        return {"overhead": self.a + self.b * f.num_tokens}


def blocks_for(block_size: int):
    return lambda tokens: np.ceil(np.asarray(tokens) / block_size).astype(np.int64)


def run_replica(prompt, output, arrival, cost, limits, dispatch_closed=None, **replica_kw):
    """One Replica fed the requests at their arrival times, run to the end: (table, replica, finished ids)."""
    env = simpy.Environment()
    table = RequestTable(np.asarray(prompt), np.asarray(output), np.asarray(arrival, dtype=float))
    finished = []
    replica = Replica(env, 0, table, cost, limits, blocks_for(limits.block_size),
                      lambda ids: finished.extend(ids.tolist()), np.random.default_rng(0), **replica_kw)

    def arrivals():
        for rid in range(len(table)):
            wait = table.arrival[rid] - env.now
            if wait > 0:
                yield env.timeout(wait)
            replica.submit(rid)

    env.process(arrivals())
    env.run()
    return table, replica, finished
