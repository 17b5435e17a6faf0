"""One vLLM-v1 replica as a SimPy process: one event per engine step, vectorised with numpy.

Each step follows vLLM v1's `Scheduler.schedule()` (vllm/v1/core/sched/scheduler.py):

1. RUNNING requests first, in order. Each asks for `num_tokens_with_spec - num_computed_tokens`
   tokens (the rest of a prefill chunk, 1 decode token, or 1 + N with speculation), capped by
   the remaining token budget (`max_num_batched_tokens`) and `long_prefill_token_threshold`.
   KV blocks are allocated for computed + new + lookahead tokens; when the free pool runs out,
   the LAST running request is preempted (all its blocks freed, recomputed later) until the
   allocation fits or the request itself was preempted, which ends this loop.
2. If nothing was preempted, WAITING requests FCFS while the budget lasts and fewer than
   `max_num_seqs` run: a new (or resumed) request gets a chunk of its prompt (chunked prefill
   fills the remaining budget); the first request whose blocks do not fit stops admission.
3. One forward pass over all scheduled tokens (a `StepCost`: StepCostModel), plus the drafter's work.
4. Update (`update_from_output`): requests whose known tokens are all computed emit tokens —
   1 without speculation, A + 1 with it (A accepted drafts, rejected ones rolled back) — as one
   streamed chunk; finished requests free their blocks.

The per-request state lives in a RequestTable (struct of arrays shared by all replicas of a
cluster); a replica keeps the ids of its running requests (in vLLM's order) and a FCFS deque of
waiting ids. While a request runs, its counts (its RequestTable.ints row) are kept by the replica
as a Python list, updated in place every step, and written back to the table when the request
leaves the batch (finished or preempted) or at `Replica.flush()` (the end of a simulation).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import chain
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
import simpy

from capacity.sim.prefix_cache import HitCounters, PrefixCache, RequestBlocks
from capacity.spec.interface import NoSpeculation, Speculation
from capacity.cost.interface import StepCost
from capacity.cost.step_cost import (NUM_FEATURES, StepFeatures, StepTime, TokenTable, all_true, float_sum,
                                 int_min, int_sum)


@dataclass(frozen=True)
class EngineLimits:
    """vLLM engine arguments that shape scheduling (names as in `vllm serve`)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    # vLLM's async scheduling (`--async-scheduling`) schedules step k+1 when step k starts, so a request
    # that arrives while a step runs first waits for the step already scheduled behind it (Replica._schedule)
    async_scheduling: bool = False


# columns of RequestTable.ints: the counts the engine reads and updates together
PROMPT, TARGET, OUT, COMPUTED, BLOCKS, CHUNKS, DRAFTED, ACCEPTED, SPEC_STEPS = range(9)


class RequestTable:
    """Per-request state of one simulation, as numpy arrays indexed by request id.

    The counts the engine updates every step share one 2-D array, `ints` (one row per request,
    columns PROMPT, TARGET, ...); the named attributes (`prompt`, `out`, ...) are views of its
    columns. A running request's row is stale until its replica writes it back (Replica.flush)."""

    def __init__(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray):
        n = len(prompt_tokens)
        self.ints = np.zeros((n, 9), dtype=np.int64)
        self.prompt = self.ints[:, PROMPT]
        self.target = self.ints[:, TARGET]
        self.prompt[:] = np.asarray(prompt_tokens, dtype=np.int64)
        self.target[:] = np.asarray(output_tokens, dtype=np.int64)
        self.arrival = np.array(arrival_s, dtype=np.float64)
        self.out = self.ints[:, OUT]                    # output tokens emitted so far
        self.computed = self.ints[:, COMPUTED]          # tokens whose KV is computed
        self.blocks = self.ints[:, BLOCKS]              # KV blocks held
        self.replica = np.full(n, -1, dtype=np.int64)
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last_emit = np.full(n, np.nan)
        self.num_chunks = self.ints[:, CHUNKS]
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)   # prompt tokens found in the prefix cache at first admission
        self.spec_drafted = self.ints[:, DRAFTED]
        self.spec_accepted = self.ints[:, ACCEPTED]
        self.spec_steps = self.ints[:, SPEC_STEPS]
        # engine-step indices (per replica) of arrival, first token and finish, for re-pricing
        # a recorded schedule (fidelity/calibrate.py)
        self.arrival_step = np.full(n, -1, dtype=np.int64)
        self.first_token_step = np.full(n, -1, dtype=np.int64)
        self.finish_step = np.full(n, -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.prompt)


class StepRecorder:
    """What a replica records per step for metrics: ITL gaps and a few per-step series.

    Steps come one at a time or as runs of steps (arrays). They are kept as they come and joined
    into the per-step series (numpy arrays) and the per-component totals when read, each series on
    its own and with one numpy call, not one per record (most records are a handful of steps).
    Totals add up in step order, as if each step had been recorded on arrival.
    """

    _SERIES = ("t", "waiting", "running", "kv_used", "batch_tokens", "draft_s", "features")

    def __init__(self) -> None:
        self.itl_chunks: list[np.ndarray] = []
        self.num_steps = 0
        # one entry per record (a step or a run), in step order
        self._counts: list[int] = []                     # steps
        self._t: list[np.ndarray | float] = []           # end times (a run's array holds exactly its steps)
        self._waiting: list[int] = []
        self._running: list[int] = []
        self._kv: list[float] = []
        self._tokens: list[np.ndarray | float] = []      # tokens in the forward pass
        self._draft: list[np.ndarray | float] = []
        self._features: list[StepFeatures] = []
        self._parts_in: list[tuple[dict, np.ndarray | float]] = []  # (parts, a run's durations or a step's)
        self._series: dict[str, list[np.ndarray]] = {name: [] for name in self._SERIES}
        self._parts: dict[str, float] = {}
        self._busy_s = 0.0
        self._copies: dict[tuple[float, int], float] = {}   # the sum of k copies of a constant part
        self._done: dict[str, int] = {}                  # records joined into each series so far
        self._parts_done = 0                             # ... and into the totals

    def add_run(self, ends: np.ndarray, durations: np.ndarray, running: int, kv_used: float,
                parts: dict[str, np.ndarray | float], features: StepFeatures, k: int,
                draft_s: np.ndarray | None) -> None:
        """k identical-shape decode steps at once (see Replica._decode_run). `ends` and `durations`
        hold the k steps; `parts`, `features` and `draft_s` one value per step (arrays, which may run
        past k) or one for every step."""
        self.num_steps += k
        self._counts.append(k)
        self._t.append(ends)
        self._waiting.append(0)
        self._running.append(running)
        self._kv.append(kv_used)
        self._tokens.append(features.num_tokens)
        self._draft.append(0.0 if draft_s is None else draft_s)
        self._features.append(features)
        self._parts_in.append((parts, durations))

    def add_step(self, t: float, dt: float, waiting: int, running: int, kv_used: float,
                 batch_tokens: int, cost: StepTime, features: StepFeatures) -> None:
        self.num_steps += 1
        self._counts.append(1)
        self._t.append(t)
        self._waiting.append(waiting)
        self._running.append(running)
        self._kv.append(kv_used)
        self._tokens.append(batch_tokens)
        self._draft.append(cost.parts_s.get("draft", 0.0))
        self._features.append(features)
        self._parts_in.append((cost.parts_s, dt))

    def _join_parts(self) -> None:
        """Add the records not yet counted to the totals by component (in step order)."""
        start = self._parts_done
        if start == len(self._counts):
            return
        parts, copies, busy_s = self._parts, self._copies, self._busy_s
        for (step_parts, durations), k in zip(self._parts_in[start:], self._counts[start:]):
            if type(durations) is not np.ndarray:       # one step
                busy_s += durations
                for key, v in step_parts.items():
                    parts[key] = parts.get(key, 0.0) + v
                continue
            busy_s += _float_sum(durations, k)
            for key, v in step_parts.items():
                if isinstance(v, np.ndarray) and v.ndim:
                    total = _float_sum(v, k)
                else:
                    total = copies.get((v, k))
                    if total is None:
                        total = copies[(v, k)] = float_sum([float(v)] * k)   # np.full(k, v).sum()'s bits
                parts[key] = parts.get(key, 0.0) + total
        self._busy_s = busy_s
        self._parts_done = len(self._counts)

    def _joined(self, name: str) -> np.ndarray:
        """One series, joining the records added since it was last read (each series on its own:
        a simulation's summary reads only a few of them)."""
        start, end = self._done.get(name, 0), len(self._counts)
        if start < end:
            def new(records: list) -> list:
                return records if start == 0 else records[start:]
            counts = new(self._counts)
            if name == "features":
                columns = zip(*(f.as_tuple() for f in new(self._features)))
                values = np.column_stack([_column(c, counts) for c in columns])
            elif name == "batch_tokens":
                values = _column(new(self._tokens), counts).astype(int)
            elif name in ("t", "draft_s"):
                values = _column(new(self._t if name == "t" else self._draft), counts)
            else:                                        # one value per record
                records = {"waiting": self._waiting, "running": self._running, "kv_used": self._kv}[name]
                values = np.repeat(np.asarray(new(records)), counts)
            self._series[name] = [np.concatenate(self._series[name] + [values])]
            self._done[name] = end
        chunks = self._series[name]
        return chunks[0] if chunks else (np.zeros((0, NUM_FEATURES)) if name == "features" else np.zeros(0))

    @property
    def t(self) -> np.ndarray:
        """End time of each step."""
        return self._joined("t")

    @property
    def waiting(self) -> np.ndarray:
        return self._joined("waiting")

    @property
    def running(self) -> np.ndarray:
        return self._joined("running")

    @property
    def kv_used(self) -> np.ndarray:
        return self._joined("kv_used")

    @property
    def batch_tokens(self) -> np.ndarray:
        return self._joined("batch_tokens")

    @property
    def draft_s(self) -> np.ndarray:
        return self._joined("draft_s")

    @property
    def features(self) -> np.ndarray:
        """StepFeatures.as_tuple() of each step, one row per step."""
        return self._joined("features")

    @property
    def parts(self) -> dict[str, float]:
        """Seconds by component, summed over the steps."""
        self._join_parts()
        return self._parts

    @property
    def busy_s(self) -> float:
        self._join_parts()
        return self._busy_s


_add_reduce = np.add.reduce   # what ndarray.sum() calls, without its Python wrapper (the same sums)


def _float_sum(x: np.ndarray, k: int) -> float:
    """float(x[:k].sum()), bit for bit. numpy sums fewer than 8 floats one after the other from
    0.0 (its pairwise summation only splits longer arrays: numpy/_core/src/umath/loops_utils.h.src,
    `pairwise_sum`), so a short run is summed in plain Python, in the same order."""
    if k >= 8:
        return float(_add_reduce(x[:k]))
    total = 0.0
    for v in x[:k].tolist():
        total += v
    return total


def _column(values: list | tuple, counts: list[int]) -> np.ndarray:
    """One series as floats from one value per record: an array holding (at least) the record's
    steps, or one number for all of them. Numbers in a row are gathered into one list, so the
    series is one np.concatenate call however many records there are."""
    if not any(isinstance(x, np.ndarray) and x.ndim for x in values):
        return np.repeat(np.asarray(values, dtype=float), counts)
    pieces: list = []
    numbers: list = []
    for x, k in zip(values, counts):
        if isinstance(x, np.ndarray) and x.ndim:
            if numbers:
                pieces.append(numbers)
                numbers = []
            pieces.append(x[:k])
        elif k == 1:
            numbers.append(x)
        else:
            numbers.extend([x] * k)
    if numbers:
        pieces.append(numbers)
    return np.concatenate(pieces, dtype=float)


def _int_rows(rows: list[list[int]]) -> np.ndarray:
    """Rows of RequestTable.ints from lists (np.fromiter: faster than converting nested lists)."""
    return np.fromiter(chain.from_iterable(rows), dtype=np.int64, count=len(rows) * 9).reshape(len(rows), 9)


def _per_request(x: np.ndarray | list[int] | int, n: int) -> list[int]:
    """Tokens per scheduled request as a list, from an array, a list or one whole number for all n."""
    if type(x) is int:
        return [x] * n
    return x if type(x) is list else x.tolist()


def _first(x: np.ndarray | float) -> float:
    """The first step's value of a feature (an array over steps, or one value for all)."""
    if type(x) is float:
        return x
    return float(x.flat[0]) if isinstance(x, np.ndarray) else float(x)


def _decode_parts(cost: StepCost, context_tokens: np.ndarray, tokens_per_seq: int) -> tuple[StepFeatures, dict]:
    """(features, time parts) of a run of decode steps of one batch, for a StepCost without
    `decode_parts` (StepCostModel.decode_parts gives the same, faster): the features that are the
    same in every step as one value (the batch is fixed, so only attention changes)."""
    features = cost.decode_features(context_tokens, tokens_per_seq)
    if type(features.num_tokens) is float and type(features.num_seqs) is float \
            and type(features.num_sampled) is float and type(features.verify_seqs) is float:
        step = features                                              # one value for all steps already
    else:
        step = StepFeatures(_first(features.num_tokens), _first(features.num_seqs), _first(features.num_sampled),
                            features.attn_flops, features.kv_read_bytes, _first(features.verify_seqs))
    return step, cost.time_parts(step)


def _advance(r: list[int], got: int, n: int, k: int, blocks: int) -> int:
    """Apply n decode steps (k drafts each) that emitted `got` tokens to one request's counts `r`, its KV
    now `blocks`; returns the blocks it grew by. Output is capped at the target (the request then finishes)."""
    grown = 0
    if blocks > r[BLOCKS]:
        grown = blocks - r[BLOCKS]
        r[BLOCKS] = blocks
    r[OUT] = min(r[OUT] + got, r[TARGET])
    r[COMPUTED] += got
    r[CHUNKS] += n
    if k:
        r[DRAFTED] += k * n
        r[ACCEPTED] += got - n                                       # got: n steps of 1 + accepted drafts
        r[SPEC_STEPS] += n
    return grown


class Replica:
    """One serving instance (TP GPUs running one vLLM engine)."""

    def __init__(self, env: simpy.Environment, index: int, table: RequestTable,
                 cost: StepCost, limits: EngineLimits, kv_blocks_for: Callable[[np.ndarray], np.ndarray],
                 on_finish: Callable[[np.ndarray], None], rng: np.random.Generator,
                 speculation: Speculation | None = None, prefix_keys=None, drop_last_hit: bool = False):
        self.env = env
        self.index = index
        self.table = table
        self.cost = cost
        decode_parts = getattr(cost, "decode_parts", None)
        self._decode_parts = decode_parts if decode_parts is not None else partial(_decode_parts, cost)
        self.limits = limits
        self.kv_blocks_for = kv_blocks_for
        self._blocks = TokenTable(kv_blocks_for)   # kv_blocks_for, exact, without numpy's per-call cost
        self._blocks_list: list[int] = []          # the same values as a list, for a few requests at a time
        self.on_finish = on_finish
        self.rng = rng
        self.spec = speculation or NoSpeculation()
        self.running = np.zeros(0, dtype=np.int64)
        self._rows: list[list[int]] = []           # the running requests' counts (ints rows), in order
        self.waiting: deque[int] = deque()
        self.free_blocks = limits.num_gpu_blocks
        self.recorder = StepRecorder()
        # prefix caching (vLLM's enable_prefix_caching; sim/prefix_cache.py): None when off. `prefix_keys`
        # gives block identities (traffic.PrefixKeys); requests without them hold anonymous blocks.
        # With caching on but no identities every look-up misses: only the counters are kept.
        self.cache: PrefixCache | None = None
        self.counters: HitCounters | None = None
        self.prefix_keys = prefix_keys
        self._cached: dict[int, RequestBlocks] = {}   # running requests' blocks in the cache
        if limits.enable_prefix_caching:
            if prefix_keys is not None:
                self.cache = PrefixCache(limits.num_gpu_blocks, limits.block_size, self._blocks, drop_last_hit)
                self.counters = self.cache.counters
            else:
                self.counters = HitCounters()
        self._wakeup: simpy.Event | None = None
        # requests at the tail of `waiting` that arrived while a step ran, since the last _schedule: with
        # async scheduling the next step was already scheduled without them (EngineLimits.async_scheduling)
        self._unseen = 0
        self._in_run = False                       # in a decode run that an arrival must interrupt
        # when the next arrival comes, if it is known ahead to come to this replica (else None); set by
        # the Cluster for an open loop (Cluster.next_arrival_for)
        self.next_arrival: Callable[[Replica], float | None] | None = None
        self.fast_forward = True
        self.max_run_steps = 512
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ entry
    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def flush(self) -> None:
        """Write the running requests' counts back to the table (they are kept in self._rows)."""
        if self._rows:
            self.table.ints[self.running] = _int_rows(self._rows)

    def _leave(self, ids: np.ndarray, gone: list[list[int]]) -> None:
        """Finished requests (`ids`, their rows `gone`) leave the batch: their counts are written back."""
        rows = self._rows
        if len(gone) == 1:
            row = gone[0]
            self.table.ints[ids[0]] = row
            i = next(i for i, r in enumerate(rows) if r is row)
            self.running = np.concatenate((self.running[:i], self.running[i + 1:]))
            self._rows = rows[:i] + rows[i + 1:]
            return
        self.table.ints[ids] = _int_rows(gone)
        gone_ids = {id(r) for r in gone}
        keep = [i for i, r in enumerate(rows) if id(r) not in gone_ids]
        self.running = self.running[keep]
        self._rows = [rows[i] for i in keep]

    def submit(self, request_id: int) -> None:
        self.table.replica[request_id] = self.index
        self.table.arrival_step[request_id] = self.recorder.num_steps
        self.waiting.append(request_id)
        if self._wakeup is not None:                 # idle: the engine schedules it at once
            if not self._wakeup.triggered:
                self._wakeup.succeed()
            return
        if self.limits.async_scheduling:
            self._unseen += 1
        if self._in_run:
            self._in_run = False
            self.process.interrupt("arrival")  # end the decode run after the step in progress

    def _run(self):
        env = self.env
        while True:
            if len(self.running) == 0 and not self.waiting:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            ids, rows, new_tokens, num_spec, decode_k = self._schedule()
            if len(ids) == 0:
                raise RuntimeError("scheduler made no progress")  # guarded by the KV-fit check
            if decode_k is not None and self.fast_forward and self.spec.supports_runs and not self.waiting:
                if self.runs_past_finish:
                    yield from self._decode_run(decode_k)
                else:
                    yield from self._decode_run_to_first_finish(decode_k)
                continue
            # a step's few requests as Python lists of whole numbers (priced in plain Python)
            new_tokens, num_spec = _per_request(new_tokens, len(ids)), _per_request(num_spec, len(ids))
            context_end = [r[COMPUTED] + q for r, q in zip(rows, new_tokens)]
            features = self.cost.features(new_tokens, context_end, num_sampled=float(len(ids) + sum(num_spec)),
                                          num_spec=num_spec)
            parts = {k: float(v) for k, v in self.cost.time_parts(features).items()}
            for k, v in self.spec.draft_time(ids, new_tokens, context_end, num_spec).parts_s.items():
                parts[k] = parts.get(k, 0.0) + v                     # StepTime.__add__ (v + 0.0 is v)
            cost = StepTime(parts)
            dt = float(sum(parts.values()))                          # cost.total_s
            yield env.timeout(dt)
            self._update(ids, rows, new_tokens, num_spec)
            self.recorder.add_step(env.now, dt, len(self.waiting), len(self.running),
                                   1.0 - self.free_blocks / self.limits.num_gpu_blocks,
                                   sum(new_tokens), cost, features)

    # ------------------------------------------------------------------ decode runs
    # A decode run continues past the completions inside it (the finished requests leave the batch at
    # the end of their last step, the others go on); False: it ends at the first completion, as
    # before (the same distributions, another draw order: tests/test_decode_run_distribution.py).
    runs_past_finish = True
    # (step, request) cells a run draws at most beyond the steps to its first completion (and at
    # most max_run_steps of those): bounds the draws an arrival makes useless when it cuts the run.
    # Each segment of a run (the same batch) holds at most max_run_steps steps.
    run_cells = 512

    def _decode_run(self, k: int):
        """A run of decode steps of the running requests (1 + k tokens each) that goes on past
        their completions.

        When every running request is decoding and nobody waits, the next steps are determined
        until the KV pool runs out or a request arrives: each step every request of the batch emits
        1 + accepted drafts (drawn ahead with the acceptance model, one (steps × requests) draw for
        the run) and its context grows by them; a request whose output is complete leaves the batch
        at the end of that step (vLLM's update_from_output: its blocks are freed, `on_finish` is
        called at that time) and the others go on with the smaller batch, without a new schedule
        or a new draw. The steps from one completion to the next (a segment: the same batch) are
        priced with one vectorised call when the segment starts, waited for with one event and
        applied at its end, as a run that ended at a completion was before. The run ends before a step that would need more KV blocks than are free (counting
        no block freed inside the run: vLLM would not preempt), when `on_finish` brought a request
        to this replica, when the speculation policy would pick another k for the smaller batch,
        at the last step sampled, or at an arrival: an arrival interrupts the run (or, when it is
        known ahead to come here, cuts it when it is set up: `next_arrival`); the step in progress
        completes, as in vLLM, and the scheduler resumes after it. The first step's KV blocks were
        allocated by _schedule(). The batch is every running request (self.running, their counts
        self._rows)."""
        t, env = self.table, self.env
        ids, counts = self.running, self._rows
        B = len(ids)
        c0k = np.array([r[COMPUTED] + k for r in counts], dtype=np.int64)   # context before the run, + k
        remaining = [r[TARGET] - r[OUT] for r in counts]
        low, high = min(remaining), max(remaining)
        if k:           # at least 1 token a step, usually >= 2: the first finish comes by step low // 2 + 1
            K = min(high, max(min(low // 2 + 1, self.max_run_steps), self.run_cells // B))
            rem = np.array(remaining, dtype=np.int64)
            accepted = self.spec.sample_steps(ids, k, K, self.rng)
            emitted = (accepted + 1).cumsum(axis=0)                  # tokens out by the end of step j (uncapped)
            finish = _add_reduce(emitted < rem, 0).tolist()          # the step each request finishes in (K: later)
            last = max(finish)
            if last < K - 1:                                         # everybody finishes by step `last`
                K = last + 1
                accepted, emitted = accepted[:K], emitted[:K]
            ctx = emitted - accepted                                 # context at the end of step j: c0 + k + this
            ctx += c0k
        else:                                                        # one token per step: request i finishes at rem_i - 1
            # (nothing drawn: a run as long as its longest request unless that makes a large matrix)
            K = high if high * B <= 128 * self.run_cells else min(high, max(min(low, self.max_run_steps),
                                                                             128 * self.run_cells // B))
            finish = [x - 1 for x in remaining]
            emitted = np.arange(1, K + 1)[:, None]
            ctx = c0k + emitted
        look = self.spec.lookahead_tokens(k)
        # KV blocks: a request needs the blocks of its context + lookahead up to its last step in the
        # run. Without prefix caching a finished request's blocks are free for the steps after its
        # last; with it they are not counted (a shared block stays held; a run that fits without
        # them fits with them)
        held = [r[BLOCKS] for r in counts]
        if min(finish) >= K - 1:                                     # nobody leaves before the last step
            last_ctx = ctx[-1].tolist()
        else:
            last_ctx = ctx[np.minimum(finish, K - 1), np.arange(B)].tolist()
        grow = [b - h for b, h in zip(self._kv_blocks(last_ctx, look), held) if b > h]
        if K > 1 and sum(grow) > self.free_blocks:
            # blocks needed grow step by step (a finished request's as at its last step): stop before
            # the first step that would preempt
            later = ctx[1:]
            held_a = np.array(held, dtype=np.int64)
            leaves = min(finish) < K - 1
            if leaves:
                fin = np.array(finish, dtype=np.int64)
                later = ctx[np.minimum(np.arange(1, K)[:, None], fin), np.arange(B)]
            extra = np.maximum(self._blocks[later + look] - held_a, 0)
            need = _add_reduce(extra, 1)
            if leaves and self.cache is None:                         # all the blocks of those gone are free
                gone = np.arange(1, K)[:, None] > fin
                need -= _add_reduce((extra + held_a) * gone, 1)
            fits = need <= self.free_blocks
            if not fits.all():
                K = 1 + int(np.argmin(fits))
                emitted, ctx = emitted[:K], ctx[:K]
        # the segments of the run: steps [s, e) with the same batch, e - 1 a completion (or the run's
        # last step), at most max_run_steps each, each priced when it starts (an arrival makes the
        # later ones useless)
        ends_at = []
        s = 0
        for e in sorted({f + 1 for f in finish if f < K - 1}) + [K]:
            while e - s > self.max_run_steps:
                s += self.max_run_steps
                ends_at.append(s)
            ends_at.append(e)
            s = e
        rec = self.recorder
        s = 0
        cols = list(range(B))                                        # positions of the batch still in it
        prev = [0] * B                                               # tokens applied so far per request
        for e in ends_at:
            b = len(cols)
            part = ctx[s:e] if b == B else ctx[s:e, cols]
            step, parts = self._decode_parts(part, 1 + k)
            if k:
                parts["draft"] = self.spec.draft_time_steps(b, step.num_tokens, _add_reduce(part, 1), k)
            durations = sum(parts.values())
            n = e - s
            if not isinstance(durations, np.ndarray) or durations.ndim == 0:
                durations = np.full(n, float(durations))
            start = env.now
            ends = durations.cumsum()
            ends += start
            # An arrival known ahead to come here ends the run after the step in progress, as its
            # interrupt would, without one. The run then ends at start + (end - start), the
            # interrupted one at arrival + (end - arrival): both exactly `end` when start >= end / 2
            # (Sterbenz), so only then; otherwise the arrival interrupts.
            arrival = self.next_arrival(self) if self.next_arrival is not None else None
            self._in_run = True
            priced = n
            if arrival is not None and arrival < ends[-1]:
                cut = min(n, int(ends.searchsorted(arrival, side="right")) + 1)
                if start >= 0.5 * ends[cut - 1]:
                    n = cut
                    self._in_run = False
            try:
                yield env.timeout(ends[n - 1] - start)
            except simpy.Interrupt:
                n = min(n, int(ends.searchsorted(env.now, side="right")) + 1)   # finish the step in progress
                if ends[n - 1] > env.now:
                    yield env.timeout(ends[n - 1] - env.now)
            self._in_run = False
            if n < priced:                                           # cut short by an arrival
                e = s + n
                K = e
                ends, durations = ends[:n], durations[:n]
            # apply steps [s, e), request by request in plain Python (a handful of integers each)
            emitted_l = emitted[e - 1].tolist() if k else None
            blocks = self._kv_blocks(ctx[e - 1].tolist(), look)
            grown = 0
            done: list[int] = []                                     # positions in the batch
            for i in cols:
                r = counts[i]
                if k:
                    got = emitted_l[i] - prev[i]
                    prev[i] = emitted_l[i]
                else:
                    got = n
                grown += _advance(r, got, n, k, blocks[i])
                if r[OUT] >= r[TARGET]:
                    done.append(i)
            self.free_blocks -= grown
            seg_ids = ids if b == B else ids[cols]
            rec.add_run(ends, durations, b, 1.0 - self.free_blocks / self.limits.num_gpu_blocks, parts, step, n,
                        parts["draft"] if k else None)
            rec.itl_chunks.append(ends[0] - t.last_emit[seg_ids])
            if n > 1:
                rec.itl_chunks.append(durations[1:].repeat(b))
            t.last_emit[seg_ids] = ends[-1]
            if done:
                gone = [counts[i] for i in done]
                for i, r in zip(done, gone):                         # finished requests free their blocks
                    self.free_blocks += r[BLOCKS] if self.cache is None else self._release(int(ids[i]), r)
                    r[BLOCKS] = 0
                d_ids = ids[done]
                t.finish[d_ids] = ends[-1]
                t.finish_step[d_ids] = rec.num_steps - 1
                self._leave(d_ids, gone)
                self.on_finish(d_ids)
                gone_set = set(done)
                cols = [i for i in cols if i not in gone_set]
            if e >= K or not cols or self.waiting:
                return
            # the scheduler would now pick k for the smaller batch: go on only with the same k
            if self._decode_k(len(cols), sum([counts[i][COMPUTED] for i in cols]) / len(cols)) != k:
                return
            s = e

    def _decode_k(self, batch: int, mean_context: float) -> int:
        """The drafts per request _schedule gives a decode step of `batch` requests (the policy's k,
        capped by long_prefill_token_threshold as _schedule_decodes caps it)."""
        k = self.spec.num_spec_tokens(batch, mean_context)
        threshold = self.limits.long_prefill_token_threshold
        if threshold > 0:
            k = min(k, max(min(1 + k, threshold) - 1, 0))
        return k

    def _decode_run_to_first_finish(self, k: int):
        """A run of identical-shape decode steps, priced and applied at once, ending at the first
        completion (the engine before runs went on past completions: `runs_past_finish` False).

        When every running request is decoding (1 + k tokens each) and nobody waits, the next
        steps are fully determined until a request finishes, the KV pool runs out or a request
        arrives: the batch stays the same and each context grows by the tokens the step emits
        (1 + accepted drafts, drawn ahead with the acceptance model). This prices up to
        `max_run_steps` such steps with one vectorised call and waits for them with one event.
        An arrival interrupts the run (or, when it is known ahead to come here, cuts it when it is
        set up: `next_arrival`); the step in progress completes, as in vLLM, and the scheduler
        resumes after it. The first step's KV blocks were allocated by _schedule().
        The batch is every running request (self.running, their counts self._rows).
        """
        t, env = self.table, self.env
        ids, counts = self.running, self._rows
        B = len(ids)
        c0k = np.array([r[COMPUTED] + k for r in counts], dtype=np.int64)   # context before the run, + k
        remaining = [r[TARGET] - r[OUT] for r in counts]
        K = min(self.max_run_steps, min(remaining))
        if k:
            # The run's K steps' samples are one stream of draws, taken in two parts: the steps where the
            # first request usually finishes (at >= 2 tokens a step), then the rest, sampled only when
            # nobody finished in the first part and otherwise skipped (drawn and dropped, the same stream).
            head = min(K, min(remaining) // 2 + 1)
            rem = np.array(remaining, dtype=np.int64)
            accepted = self.spec.sample_steps(ids, k, head, self.rng)
            emitted = (accepted + 1).cumsum(axis=0)                  # tokens out by the end of step j (uncapped)
            first = int_min(_add_reduce(emitted < rem, 0))           # steps before the first finish
            if head < K:
                if first < head:
                    self.spec.skip_steps(ids, k, K - head, self.rng)
                else:
                    accepted = np.concatenate([accepted, self.spec.sample_steps(ids, k, K - head, self.rng)])
                    emitted = (accepted + 1).cumsum(axis=0)
                    first = int_min(_add_reduce(emitted < rem, 0))
            K = min(K, first + 1)
            accepted, emitted = accepted[:K], emitted[:K]
            ctx = emitted - accepted                                 # context at the end of step j: c0 + k + this
            ctx += c0k
        else:                                                        # one token per step: the shortest finishes at K
            emitted = np.arange(1, K + 1)[:, None]
            ctx = c0k + emitted
        look = self.spec.lookahead_tokens(k)
        last_blocks = self._kv_blocks(ctx[-1].tolist(), look)
        if K > 1 and sum([b - r[BLOCKS] for b, r in zip(last_blocks, counts) if b > r[BLOCKS]]) > self.free_blocks:
            # blocks needed grow step by step: stop before the first step that would preempt
            held = np.array([r[BLOCKS] for r in counts], dtype=np.int64)
            need = np.maximum(self._blocks[ctx[1:] + look] - held, 0).sum(axis=1)
            K = 1 + int(np.argmin(need <= self.free_blocks))
            emitted, ctx = emitted[:K], ctx[:K]
            last_blocks = None
        step, parts = self._decode_parts(ctx, 1 + k)
        if k:
            parts["draft"] = self.spec.draft_time_steps(B, step.num_tokens, _add_reduce(ctx, 1), k)
        durations = sum(parts.values())
        if not isinstance(durations, np.ndarray) or durations.ndim == 0:
            durations = np.full(K, float(durations))
        start = env.now
        ends = durations.cumsum()
        ends += start
        priced = K
        # An arrival known ahead to come here ends the run after the step in progress, as its
        # interrupt would, without one. The run then ends at start + (end - start), the interrupted
        # one at arrival + (end - arrival): both exactly `end` when start >= end / 2 (Sterbenz), so
        # only then; otherwise the arrival interrupts.
        arrival = self.next_arrival(self) if self.next_arrival is not None else None
        self._in_run = True
        if arrival is not None and arrival < ends[-1]:
            cut = min(K, int(ends.searchsorted(arrival, side="right")) + 1)
            if start >= 0.5 * ends[cut - 1]:
                K = cut
                self._in_run = False
        try:
            yield env.timeout(ends[K - 1] - start)
        except simpy.Interrupt:
            K = min(K, int(ends.searchsorted(env.now, side="right")) + 1)   # finish the step in progress
            if ends[K - 1] > env.now:
                yield env.timeout(ends[K - 1] - env.now)
        self._in_run = False
        if K < priced:                                               # cut short by an arrival
            emitted, ctx, ends, durations = emitted[:K], ctx[:K], ends[:K], durations[:K]
            last_blocks = None
        # apply K steps, request by request in plain Python (a handful of integers each: numpy's
        # per-call cost would dwarf the additions)
        if last_blocks is None:
            last_blocks = self._kv_blocks(ctx[-1].tolist(), look)
        emitted_l = emitted[-1].tolist() if k else [K] * B            # tokens out per request
        grown = 0
        done: list[int] = []                                         # positions in the batch
        for i, (r, e, b) in enumerate(zip(counts, emitted_l, last_blocks)):
            grown += _advance(r, e, K, k, b)
            if r[OUT] >= r[TARGET]:
                done.append(i)
        self.free_blocks -= grown
        rec = self.recorder
        first_step = rec.num_steps
        rec.add_run(ends, durations, B, 1.0 - self.free_blocks / self.limits.num_gpu_blocks, parts, step, K,
                    parts["draft"] if k else None)
        gone = [counts[i] for i in done]
        for i, r in zip(done, gone):                                 # finished requests free their blocks
            self.free_blocks += r[BLOCKS] if self.cache is None else self._release(int(ids[i]), r)
            r[BLOCKS] = 0
        gaps = [ends[0] - t.last_emit[ids]]
        if K > 1:
            gaps.append(durations[1:].repeat(B))
        rec.itl_chunks.extend(gaps)
        t.last_emit[ids] = ends[-1]
        if done:
            d_ids = ids[done]
            t.finish[d_ids] = ends[-1]
            t.finish_step[d_ids] = first_step + K - 1
            self._leave(d_ids, gone)
            self.on_finish(d_ids)

    # ------------------------------------------------------------------ schedule
    def _schedule(self) -> tuple[np.ndarray, list[list[int]], np.ndarray, np.ndarray, int | None]:
        """Returns (scheduled ids, their counts rows, tokens per id, speculative tokens per id) in vLLM
        order, and the drafts per request k when the step is a decode step of every running request
        (1 + k tokens each, nobody preempted or admitted: a run can start), else None."""
        lim = self.limits
        budget = lim.max_num_batched_tokens
        run = self.running
        preempted = False
        decode_k = None
        fast = None
        sched_rows = counts = self._rows
        if len(run):
            # known tokens not computed yet (>= 1): 1 for a decoding request
            n_decoding = [r[PROMPT] + r[OUT] - r[COMPUTED] for r in counts].count(1)
            computed = [r[COMPUTED] for r in counts]
            k = self.spec.num_spec_tokens(len(run), sum(computed) / len(run)) if n_decoding else 0
            if n_decoding == len(run):
                fast = self._schedule_decodes(counts, computed, k, budget)
        if fast is not None:                                 # the usual step: every running request decodes
            ids, new_tokens, num_spec, decode_k, budget = fast
        elif len(run):
            rows = _int_rows(counts)
            computed, out = rows[:, COMPUTED], rows[:, OUT]
            need = rows[:, PROMPT] + out - computed
            all_decoding = n_decoding == len(run)
            decoding = need == 1
            spec = decoding * k
            if k:
                need = need + spec
            threshold = lim.long_prefill_token_threshold
            if threshold > 0:
                need = np.minimum(need, threshold)
            total = int_sum(need)
            fits_budget = total <= budget                    # then every request gets all it asks for
            sched = need if fits_budget else np.clip(budget - (need.cumsum() - need), 0, need)
            lookahead = self.spec.lookahead_tokens(k)
            want_blocks = self._blocks[computed + sched + lookahead * (computed > 0) if lookahead else computed + sched]
            extra = np.maximum(want_blocks - rows[:, BLOCKS], 0)
            keep = None
            if not fits_budget:
                keep = sched > 0
                extra *= keep
            grow_blocks = int_sum(extra)
            if grow_blocks > self.free_blocks:
                keep, preempted = self._allocate_with_preemption(sched, extra)
                run = self.running
                sched, spec, want_blocks, extra = sched[: len(run)], spec[: len(run)], want_blocks[: len(run)], extra[: len(run)]
                extra = extra * keep
                grow_blocks = int_sum(extra)
            if grow_blocks:
                self.free_blocks -= grow_blocks
                for i in np.flatnonzero(extra).tolist():
                    self._rows[i][BLOCKS] = int(want_blocks[i])
            if keep is None:
                ids, new_tokens, sched_rows = run, sched, self._rows
                num_spec = spec if threshold == 0 else np.minimum(spec, np.maximum(sched - 1, 0))
                budget -= total
            else:
                ids, new_tokens = run[keep], sched[keep]
                sched_rows = [self._rows[i] for i in np.flatnonzero(keep).tolist()]
                num_spec = np.minimum(spec[keep], np.maximum(new_tokens - 1, 0))
                budget -= int_sum(new_tokens)
            if all_decoding and keep is None and all_true(out > 0):
                decode_k = int(num_spec[0])   # every request got the same 1 + k tokens
        else:
            ids = new_tokens = num_spec = np.zeros(0, dtype=np.int64)
        held: list[int] = []
        if self._unseen:
            # async scheduling: this step was scheduled when the one before it started, without the requests
            # that arrived since (vllm/v1/engine/core.py step_with_batch_queue); they join the next. With no
            # running request to carry, that step had nothing and the engine takes them at once.
            if len(ids):
                held = [self.waiting.pop() for _ in range(self._unseen)]
            self._unseen = 0
        if not preempted and self.waiting:
            scheduled = (ids, sched_rows, new_tokens) if self.cache is not None and len(ids) else None
            adm_ids, adm_tokens, adm_rows = self._admit(budget, scheduled)
            if adm_ids:
                decode_k = None
                n = len(ids)
                new_tokens = _per_request(new_tokens, n) + adm_tokens
                num_spec = _per_request(num_spec, n) + [0] * len(adm_ids)
                if ids is self.running:                      # every running request was scheduled
                    ids = self.running = np.array(ids.tolist() + adm_ids, dtype=np.int64)
                    sched_rows = self._rows = self._rows + adm_rows
                else:
                    a_ids = np.array(adm_ids, dtype=np.int64)
                    self.running = np.concatenate([self.running, a_ids])
                    ids = np.concatenate([ids, a_ids])
                    self._rows = self._rows + adm_rows
                    sched_rows = sched_rows + adm_rows
        if held:
            self.waiting.extend(reversed(held))
        return ids, sched_rows, new_tokens, num_spec, decode_k

    def _schedule_decodes(self, counts: list[list[int]], computed: list[int], k: int, budget: int) -> tuple | None:
        """_schedule's running loop when every running request decodes (`counts`: their rows,
        `computed`: their COMPUTED column) and
        asks for 1 + k tokens, in plain Python for the few requests of a batch. Returns (ids, tokens
        per request, drafts per request, decode_k, budget left), the numbers per request as one int
        for all, or None when the step is not that simple (the budget is short or a request would be
        preempted), for the general loop to handle. Changes nothing before it knows it succeeds."""
        lim, run = self.limits, self.running
        n = len(run)
        sched = 1 + k
        threshold = lim.long_prefill_token_threshold
        if threshold > 0:
            sched = min(sched, threshold)
        total = n * sched
        if total > budget:
            return None
        lookahead = self.spec.lookahead_tokens(k)
        if lookahead and min(computed) > 0:
            want = self._kv_blocks(computed, sched + lookahead)
        elif lookahead:
            want = self._kv_blocks([c + lookahead if c > 0 else c for c in computed], sched)
        else:
            want = self._kv_blocks(computed, sched)
        held = [r[BLOCKS] for r in counts]
        grow = 0
        for w, h in zip(want, held):
            if w > h:
                grow += w - h
        if grow > self.free_blocks:
            return None
        if grow:
            self.free_blocks -= grow
            for r, w, h in zip(counts, want, held):
                if w > h:
                    r[BLOCKS] = w
        num_spec = k if threshold == 0 else min(k, max(sched - 1, 0))
        decode_k = num_spec if min([r[OUT] for r in counts]) > 0 else None
        return run, sched, num_spec, decode_k, budget - total

    def _kv_blocks(self, tokens: list[int], extra: int = 0) -> list[int]:
        """KV blocks held at each token count + extra (self._blocks, exact), in plain Python."""
        table = self._blocks_list
        try:
            return [table[c + extra] for c in tokens]
        except IndexError:
            self._blocks[max(tokens) + extra]                       # grows the TokenTable
            table = self._blocks_list = self._blocks.values.tolist()
            return [table[c + extra] for c in tokens]

    def _allocate_with_preemption(self, sched: np.ndarray, extra: np.ndarray) -> tuple[np.ndarray, bool]:
        """vLLM's running loop when blocks run out: preempt the last running request and retry."""
        keep = np.zeros(len(sched), dtype=bool)
        preempted = False
        i = 0
        n = len(self.running)
        free = self.free_blocks
        while i < n:
            if sched[i] == 0:
                i += 1
                continue
            while extra[i] > free:
                last, row = int(self.running[n - 1]), self._rows[n - 1]
                free += row[BLOCKS] if self.cache is None else self._release(last, row)
                self._preempt(last, row)
                n -= 1
                preempted = True
                if n == i:  # the request itself was preempted
                    break
            if n == i:
                break
            keep[i] = True
            free -= int(extra[i])
            i += 1
        self.running = self.running[:n]
        self._rows = self._rows[:n]
        # blocks are committed by the caller; here only the freed ones are returned to the pool
        self.free_blocks = free + int(extra[:n][keep[:n]].sum())
        return keep[:n], preempted

    def _preempt(self, rid: int, row: list[int]) -> None:
        """Back to the queue: its counts (`row`, leaving the batch) are written back to the table."""
        t = self.table
        row[COMPUTED] = 0
        row[BLOCKS] = 0
        t.ints[rid] = row
        t.num_preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _admit(self, budget: int, scheduled: tuple | None = None) -> tuple[list[int], list[int], list[list[int]]]:
        """Admit waiting requests FCFS (chunked prefill fills the remaining budget). Returns their ids,
        tokens and counts rows (which the replica keeps from now on). With prefix caching a new or
        resumed request starts at its longest cached prefix (sim/prefix_cache.py); `scheduled` is
        this step's (ids, rows, tokens) of running requests, whose blocks are cached first, as vLLM
        caches them when it schedules them."""
        t, lim = self.table, self.limits
        ids: list[int] = []
        tokens: list[int] = []
        rows: list[list[int]] = []
        room = lim.max_num_seqs - len(self.running)
        cache = self.cache
        if cache is not None:
            self._cache_running(scheduled)
        while self.waiting and budget > 0 and len(ids) < room:
            rid = self.waiting[0]
            row = t.ints[rid].tolist()
            hit = 0
            if cache is not None and row[COMPUTED] == 0:
                cache.take(self.free_blocks)                 # allocations since the last look
                state = self._cached.get(rid)
                if state is None:
                    state = self._cached[rid] = RequestBlocks(self._block_keys(rid))
                known = row[PROMPT] + row[OUT]
                hit_blocks = cache.hit_blocks(state.keys, known)
                hit = hit_blocks * lim.block_size
            n = row[PROMPT] + row[OUT] - row[COMPUTED] - hit
            if lim.long_prefill_token_threshold > 0:
                n = min(n, lim.long_prefill_token_threshold)
            if not lim.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            if hit:
                at_hit, blocks = self._kv_blocks([hit, hit + n])
                evictable = cache.evictable_units(state.keys[:hit_blocks])
                if blocks - at_hit + evictable > self.free_blocks:
                    break
            else:
                blocks = self._kv_blocks([row[COMPUTED]], n)[0]
                if blocks > self.free_blocks:
                    break
            self.waiting.popleft()
            if cache is not None and row[COMPUTED] == 0:
                if hit:
                    self.free_blocks -= cache.touch(state, hit_blocks) + blocks - at_hit
                    row[COMPUTED] = hit
                else:
                    self.free_blocks -= blocks
                preempted = t.num_preemptions[rid] > 0
                if not preempted:
                    t.cached_tokens[rid] = hit
                cache.counters.record(known, hit, preempted)
                cache.cache(state, (hit + n) // lim.block_size)   # the chunk's full blocks (hit + n <= known)
            else:
                self.free_blocks -= blocks
                if self.counters is not None and row[COMPUTED] == 0:    # caching on, nothing to find
                    self.counters.record(row[PROMPT] + row[OUT], 0, t.num_preemptions[rid] > 0)
            row[BLOCKS] = blocks
            if math.isnan(t.first_scheduled[rid]):
                t.first_scheduled[rid] = self.env.now
            ids.append(rid)
            tokens.append(n)
            rows.append(row)
            budget -= n
        return ids, tokens, rows

    # ------------------------------------------------------------------ prefix caching
    def _block_keys(self, rid: int) -> list[int]:
        keys = self.prefix_keys
        return [] if keys is None else keys.block_keys(rid, self.limits.block_size)

    def _cache_running(self, scheduled: tuple | None) -> None:
        """Cache the full blocks of running requests: up to what this step computes for the
        scheduled ones (`scheduled`: ids, rows, tokens), else up to what they have computed."""
        cache, bs, states = self.cache, self.limits.block_size, self._cached
        if scheduled is not None:
            ids, rows, tokens = scheduled
            for rid, r, q in zip(ids.tolist(), rows, _per_request(tokens, len(ids))):
                state = states[rid]
                full = min(r[COMPUTED] + q, r[PROMPT] + r[OUT]) // bs
                if full > state.num_cached:
                    cache.cache(state, full)
        else:
            for rid, r in zip(self.running.tolist(), self._rows):
                state = states[rid]
                full = min(r[COMPUTED], r[PROMPT] + r[OUT]) // bs
                if full > state.num_cached:
                    cache.cache(state, full)

    def _release(self, rid: int, row: list[int]) -> int:
        """A request leaves the batch (finished or preempted): its blocks go back; returns the
        units freed (with prefix caching, blocks other requests hold stay held)."""
        if self.cache is None:
            return row[BLOCKS]
        state = self._cached.pop(rid)
        cache = self.cache
        cache.cache(state, min(row[COMPUTED], row[PROMPT] + row[OUT]) // self.limits.block_size)
        return cache.free(state, row[BLOCKS])

    def cached_prefix_tokens(self, keys: list[int], prompt_tokens: int) -> int:
        """Tokens of a new request (its block keys, its prompt length) this replica's cache holds
        now, for a cache-aware router (vLLM's look-up, without taking the blocks)."""
        cache = self.cache
        if cache is None or not keys:
            return 0
        self._cache_running(None)
        cache.take(self.free_blocks)
        return cache.hit_blocks(keys, prompt_tokens) * self.limits.block_size

    # ------------------------------------------------------------------ update
    def _update(self, ids: np.ndarray, counts: list[list[int]], new_tokens: list[int], num_spec: list[int]) -> None:
        """After a step: the scheduled requests (`counts`: their rows, updated in place) computed
        `new_tokens` each; those whose known tokens are all computed sample (A + 1 tokens after
        verifying num_spec drafts). Request by request in plain Python (a batch is a handful of
        requests)."""
        t, now = self.table, self.env.now
        spec = num_spec
        emits: list[int] = []                                        # positions that sample tokens
        drafted: list[int] = []                                      # ... after verifying drafts
        for i, (r, n) in enumerate(zip(counts, new_tokens)):
            c = r[COMPUTED] + n
            r[COMPUTED] = c
            if c >= r[PROMPT] + r[OUT]:                              # all known tokens computed
                emits.append(i)
                if spec[i] > 0:
                    drafted.append(i)
        accepted = [0] * len(counts)
        if drafted:
            d_ids = ids if len(drafted) == len(ids) else ids[drafted]
            d_spec = np.array(spec if len(drafted) == len(ids) else [spec[i] for i in drafted], dtype=np.int64)
            sampled = self.spec.sample_accepted(d_ids, d_spec, self.rng).tolist()
            for i, a in zip(drafted, sampled):
                r = counts[i]
                r[DRAFTED] += spec[i]
                r[ACCEPTED] += a
                r[SPEC_STEPS] += 1
                r[COMPUTED] += a - spec[i]                           # rejected drafts are rolled back
                accepted[i] = a
        if not emits:
            return
        first: list[int] = []                                        # positions emitting their first token
        later: list[int] = []
        done: list[int] = []
        for i in emits:
            r = counts[i]
            out = r[OUT]
            (later if out else first).append(i)
            out = min(out + accepted[i] + 1, r[TARGET])
            r[OUT] = out
            r[CHUNKS] += 1
            if out >= r[TARGET]:
                done.append(i)
        freed = 0
        gone = [counts[i] for i in done]
        if self.cache is None:
            for r in gone:
                freed += r[BLOCKS]
                r[BLOCKS] = 0
        else:
            for i, r in zip(done, gone):
                freed += self._release(int(ids[i]), r)
                r[BLOCKS] = 0
        step = self.recorder.num_steps  # this step's index (recorded right after _update)
        if first:
            f_ids = ids[first]
            t.first_token[f_ids] = now
            t.first_token_step[f_ids] = step
        if later:
            self.recorder.itl_chunks.append(now - t.last_emit[ids if len(later) == len(ids) else ids[later]])
        t.last_emit[ids if len(emits) == len(ids) else ids[emits]] = now
        if done:
            d_ids = ids[done]
            t.finish[d_ids] = now
            t.finish_step[d_ids] = step
            self.free_blocks += freed
            self._leave(d_ids, gone)
            self.on_finish(d_ids)
