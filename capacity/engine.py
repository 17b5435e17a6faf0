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
3. One forward pass over all scheduled tokens (StepCostModel), plus the drafter's work.
4. Update (`update_from_output`): requests whose known tokens are all computed emit tokens —
   1 without speculation, A + 1 with it (A accepted drafts, rejected ones rolled back) — as one
   streamed chunk; finished requests free their blocks.

The per-request state lives in a RequestTable (struct of arrays shared by all replicas of a
cluster); a replica only keeps the ids of its running requests (in vLLM's order) and a FCFS
deque of waiting ids.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np
import simpy

from capacity.speculation import NoSpeculation, Speculation
from capacity.step_cost import StepCostModel, StepFeatures, StepTime


@dataclass(frozen=True)
class EngineLimits:
    """vLLM engine arguments that shape scheduling (names as in `vllm serve`)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_gpu_blocks: int
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True


class RequestTable:
    """Per-request state of one simulation, as numpy arrays indexed by request id."""

    def __init__(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray):
        n = len(prompt_tokens)
        self.prompt = np.asarray(prompt_tokens, dtype=np.int64)
        self.target = np.asarray(output_tokens, dtype=np.int64)
        self.arrival = np.array(arrival_s, dtype=np.float64)
        self.out = np.zeros(n, dtype=np.int64)          # output tokens emitted so far
        self.computed = np.zeros(n, dtype=np.int64)     # tokens whose KV is computed
        self.blocks = np.zeros(n, dtype=np.int64)       # KV blocks held
        self.replica = np.full(n, -1, dtype=np.int64)
        self.first_scheduled = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last_emit = np.full(n, np.nan)
        self.num_chunks = np.zeros(n, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.spec_drafted = np.zeros(n, dtype=np.int64)
        self.spec_accepted = np.zeros(n, dtype=np.int64)
        self.spec_steps = np.zeros(n, dtype=np.int64)
        # engine-step indices (per replica) of arrival, first token and finish, for re-pricing
        # a recorded schedule (calibrate.py)
        self.arrival_step = np.full(n, -1, dtype=np.int64)
        self.first_token_step = np.full(n, -1, dtype=np.int64)
        self.finish_step = np.full(n, -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.prompt)


class StepRecorder:
    """What a replica records per step for metrics: ITL gaps and a few time series."""

    def __init__(self) -> None:
        self.features: list[tuple[float, ...]] = []  # StepFeatures.as_tuple() per step
        self.draft_s: list[float] = []
        self.itl_chunks: list[np.ndarray] = []
        self.t: list[float] = []
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.kv_used: list[float] = []
        self.batch_tokens: list[int] = []
        self.parts: dict[str, float] = {}
        self.num_steps = 0
        self.busy_s = 0.0

    def add_run(self, ends: np.ndarray, durations: np.ndarray, running: int, kv_used: float,
                parts: dict[str, float], features: StepFeatures, k: int, draft_s: np.ndarray) -> None:
        """K identical-shape decode steps at once (see Replica._decode_run)."""
        self.num_steps += k
        self.busy_s += float(durations.sum())
        self.t.extend(ends.tolist())
        self.waiting.extend([0] * k)
        self.running.extend([running] * k)
        self.kv_used.extend([kv_used] * k)
        self.batch_tokens.extend(np.asarray(features.num_tokens, dtype=int).tolist())
        self.draft_s.extend(np.asarray(draft_s, dtype=float).tolist())
        self.features.extend(zip(*(np.broadcast_to(np.asarray(x, dtype=float), (k,)).tolist()
                                   for x in features.as_tuple())))
        for key, v in parts.items():
            self.parts[key] = self.parts.get(key, 0.0) + v

    def add_step(self, t: float, dt: float, waiting: int, running: int, kv_used: float,
                 batch_tokens: int, cost: StepTime, features: StepFeatures) -> None:
        self.num_steps += 1
        self.features.append(features.as_tuple())
        self.draft_s.append(cost.parts_s.get("draft", 0.0))
        self.busy_s += dt
        self.t.append(t)
        self.waiting.append(waiting)
        self.running.append(running)
        self.kv_used.append(kv_used)
        self.batch_tokens.append(batch_tokens)
        for k, v in cost.parts_s.items():
            self.parts[k] = self.parts.get(k, 0.0) + v


class Replica:
    """One serving instance (TP GPUs running one vLLM engine)."""

    def __init__(self, env: simpy.Environment, index: int, table: RequestTable,
                 cost: StepCostModel, limits: EngineLimits, kv_blocks_for: Callable[[np.ndarray], np.ndarray],
                 on_finish: Callable[[np.ndarray], None], rng: np.random.Generator,
                 speculation: Speculation | None = None):
        self.env = env
        self.index = index
        self.table = table
        self.cost = cost
        self.limits = limits
        self.kv_blocks_for = kv_blocks_for
        self.on_finish = on_finish
        self.rng = rng
        self.spec = speculation or NoSpeculation()
        self.running = np.zeros(0, dtype=np.int64)
        self.waiting: deque[int] = deque()
        self.free_blocks = limits.num_gpu_blocks
        self.recorder = StepRecorder()
        self._wakeup: simpy.Event | None = None
        self._in_run = False
        self.fast_forward = True
        self.max_run_steps = 512
        self.process = env.process(self._run())

    # ------------------------------------------------------------------ entry
    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, request_id: int) -> None:
        self.table.replica[request_id] = self.index
        self.table.arrival_step[request_id] = self.recorder.num_steps
        self.waiting.append(request_id)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        elif self._in_run:
            self._in_run = False
            self.process.interrupt("arrival")  # end the decode run after the step in progress

    def _run(self):
        env = self.env
        while True:
            if len(self.running) == 0 and not self.waiting:
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
            ids, new_tokens, num_spec = self._schedule()
            if len(ids) == 0:
                raise RuntimeError("scheduler made no progress")  # guarded by the KV-fit check
            t = self.table
            k = int(num_spec[0]) if len(num_spec) else 0
            if (self.fast_forward and self.spec.supports_runs and not self.waiting and len(ids) == len(self.running)
                    and len(ids) > 0 and np.all(num_spec == k) and np.all(new_tokens == 1 + k)
                    and np.all(t.out[ids] >= 1) and np.all(t.computed[ids] == t.prompt[ids] + t.out[ids] - 1)):
                yield from self._decode_run(ids, k)
                continue
            context_end = t.computed[ids] + new_tokens
            features = self.cost.features(new_tokens, context_end, num_sampled=float(len(ids) + num_spec.sum()),
                                          num_spec=num_spec)
            cost = StepTime({k: float(v) for k, v in self.cost.time_parts(features).items()})
            cost = cost + self.spec.draft_time(ids, new_tokens, context_end, num_spec)
            dt = cost.total_s
            yield env.timeout(dt)
            self._update(ids, new_tokens, num_spec)
            self.recorder.add_step(env.now, dt, len(self.waiting), len(self.running),
                                   1.0 - self.free_blocks / self.limits.num_gpu_blocks,
                                   int(new_tokens.sum()), cost, features)

    # ------------------------------------------------------------------ decode runs
    def _decode_run(self, ids: np.ndarray, k: int):
        """A run of identical-shape decode steps, priced and applied at once.

        When every running request is decoding (1 + k tokens each) and nobody waits, the next
        steps are fully determined until a request finishes, the KV pool runs out or a request
        arrives: the batch stays the same and each context grows by the tokens the step emits
        (1 + accepted drafts, drawn ahead with the acceptance model). This prices up to
        `max_run_steps` such steps with one vectorised call and waits for them with one event.
        An arrival interrupts the run; the step in progress completes, as in vLLM, and the
        scheduler resumes after it. The first step's KV blocks were allocated by _schedule().
        """
        t, env = self.table, self.env
        B = len(ids)
        c0, o0, held = t.computed[ids], t.out[ids], t.blocks[ids]
        remaining = t.target[ids] - o0
        K = int(min(self.max_run_steps, remaining.min()))
        accepted = self.spec.sample_steps(ids, k, K, self.rng) if k else np.zeros((K, B), dtype=np.int64)
        emitted = np.cumsum(accepted + 1, axis=0)                   # tokens out by the end of step j (uncapped)
        finishing = emitted >= remaining[None, :]
        K = int(min(K, np.argmax(finishing.any(axis=1)) + 1 if finishing.any() else K))
        accepted, emitted = accepted[:K], emitted[:K]
        before = c0[None, :] + np.vstack([np.zeros((1, B), dtype=np.int64), emitted[:-1]])  # computed before step j
        ctx = before + 1 + k                                        # context at the end of step j
        if K > 1:
            look = self.spec.lookahead_tokens(k)
            need = np.maximum(self.kv_blocks_for((ctx[1:] + look).ravel()).reshape(K - 1, B) - held[None, :], 0).sum(axis=1)
            fits = need <= self.free_blocks
            if not fits.all():
                K = 1 + int(np.argmin(fits))                       # stop before the step that would preempt
                accepted, emitted, ctx = accepted[:K], emitted[:K], ctx[:K]
        features = self.cost.decode_features(ctx, 1 + k)
        parts = {key: np.broadcast_to(np.asarray(v, dtype=float), (K,)) for key, v in self.cost.time_parts(features).items()}
        if k:
            parts["draft"] = self.spec.draft_time_steps(B, features.num_tokens, ctx.sum(axis=1).astype(float), k)
        durations = sum(parts.values())
        start = env.now
        ends = start + np.cumsum(durations)
        self._in_run = True
        try:
            yield env.timeout(ends[-1] - start)
        except simpy.Interrupt:
            done = int(np.searchsorted(ends, env.now, side="right"))
            K = min(done + 1, K)                                     # finish the step in progress
            if ends[K - 1] > env.now:
                yield env.timeout(ends[K - 1] - env.now)
        self._in_run = False
        accepted, emitted, ctx, ends, durations = accepted[:K], emitted[:K], ctx[:K], ends[:K], durations[:K]
        parts = {key: v[:K] for key, v in parts.items()}
        features = features.first(K)
        # apply K steps
        look = self.spec.lookahead_tokens(k)
        new_blocks = np.maximum(self.kv_blocks_for(ctx[-1] + look), held)
        self.free_blocks -= int((new_blocks - held).sum())
        t.blocks[ids] = new_blocks
        t.computed[ids] = c0 + emitted[-1]
        t.out[ids] = np.minimum(o0 + emitted[-1], t.target[ids])
        t.num_chunks[ids] += K
        if k:
            t.spec_drafted[ids] += k * K
            t.spec_accepted[ids] += accepted.sum(axis=0)
            t.spec_steps[ids] += K
        gaps = [ends[0] - t.last_emit[ids]]
        if K > 1:
            gaps.append(np.repeat(durations[1:], B))
        self.recorder.itl_chunks.extend(gaps)
        t.last_emit[ids] = ends[-1]
        rec = self.recorder
        first_step = rec.num_steps
        rec.add_run(ends, durations, B, 1.0 - self.free_blocks / self.limits.num_gpu_blocks,
                    {key: float(v.sum()) for key, v in parts.items()}, features, K,
                    parts.get("draft", np.zeros(K)))
        done_mask = t.out[ids] >= t.target[ids]
        if done_mask.any():
            d_ids = ids[done_mask]
            t.finish[d_ids] = ends[-1]
            t.finish_step[d_ids] = first_step + K - 1
            self.free_blocks += int(t.blocks[d_ids].sum())
            t.blocks[d_ids] = 0
            self.running = self.running[~np.isin(self.running, d_ids)]
            self.on_finish(d_ids)

    # ------------------------------------------------------------------ schedule
    def _schedule(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns (scheduled ids, tokens per id, speculative tokens per id) in vLLM order."""
        t, lim = self.table, self.limits
        budget = lim.max_num_batched_tokens
        run = self.running
        preempted = False
        if len(run):
            known = t.prompt[run] + t.out[run]
            decoding = t.computed[run] == known - 1
            k = self.spec.num_spec_tokens(len(run), float(t.computed[run].mean())) if decoding.any() else 0
            spec = np.where(decoding, k, 0)
            need = known + spec - t.computed[run]
            if lim.long_prefill_token_threshold > 0:
                need = np.minimum(need, lim.long_prefill_token_threshold)
            before = np.cumsum(need) - need
            sched = np.clip(budget - before, 0, need)
            lookahead = np.where(t.computed[run] > 0, self.spec.lookahead_tokens(k), 0)
            want_blocks = self.kv_blocks_for(t.computed[run] + sched + lookahead)
            extra = np.where(sched > 0, np.maximum(want_blocks - t.blocks[run], 0), 0)
            if extra.sum() <= self.free_blocks:
                keep = sched > 0
            else:
                keep, preempted = self._allocate_with_preemption(sched, extra)
                run = self.running
                sched, spec, want_blocks, extra = sched[: len(run)], spec[: len(run)], want_blocks[: len(run)], extra[: len(run)]
            grow = keep & (extra > 0)
            self.free_blocks -= int(extra[grow].sum())
            t.blocks[run[grow]] = want_blocks[grow]
            ids, new_tokens = run[keep], sched[keep]
            num_spec = np.minimum(spec[keep], np.maximum(new_tokens - 1, 0))
            budget -= int(new_tokens.sum())
        else:
            ids = new_tokens = num_spec = np.zeros(0, dtype=np.int64)
        if not preempted and self.waiting:
            adm_ids, adm_tokens = self._admit(budget)
            if adm_ids:
                a_ids = np.array(adm_ids, dtype=np.int64)
                self.running = np.concatenate([self.running, a_ids])
                ids = np.concatenate([ids, a_ids])
                new_tokens = np.concatenate([new_tokens, np.array(adm_tokens, dtype=np.int64)])
                num_spec = np.concatenate([num_spec, np.zeros(len(adm_ids), dtype=np.int64)])
        return ids, new_tokens, num_spec

    def _allocate_with_preemption(self, sched: np.ndarray, extra: np.ndarray) -> tuple[np.ndarray, bool]:
        """vLLM's running loop when blocks run out: preempt the last running request and retry."""
        t = self.table
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
                victim = self.running[n - 1]
                free += int(t.blocks[victim])
                self._preempt(victim)
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
        # blocks are committed by the caller; here only the freed ones are returned to the pool
        self.free_blocks = free + int(extra[:n][keep[:n]].sum())
        return keep[:n], preempted

    def _preempt(self, rid: int) -> None:
        t = self.table
        t.computed[rid] = 0
        t.blocks[rid] = 0
        t.num_preemptions[rid] += 1
        self.waiting.appendleft(int(rid))

    def _admit(self, budget: int) -> tuple[list[int], list[int]]:
        """Admit waiting requests FCFS (chunked prefill fills the remaining budget)."""
        t, lim = self.table, self.limits
        ids: list[int] = []
        tokens: list[int] = []
        room = lim.max_num_seqs - len(self.running)
        while self.waiting and budget > 0 and len(ids) < room:
            rid = self.waiting[0]
            n = int(t.prompt[rid] + t.out[rid] - t.computed[rid])
            if lim.long_prefill_token_threshold > 0:
                n = min(n, lim.long_prefill_token_threshold)
            if not lim.enable_chunked_prefill and n > budget:
                break
            n = min(n, budget)
            blocks = int(self.kv_blocks_for(np.array([t.computed[rid] + n]))[0])
            if blocks > self.free_blocks:
                break
            self.waiting.popleft()
            self.free_blocks -= blocks
            t.blocks[rid] = blocks
            if np.isnan(t.first_scheduled[rid]):
                t.first_scheduled[rid] = self.env.now
            ids.append(rid)
            tokens.append(n)
            budget -= n
        return ids, tokens

    # ------------------------------------------------------------------ update
    def _update(self, ids: np.ndarray, new_tokens: np.ndarray, num_spec: np.ndarray) -> None:
        t, now = self.table, self.env.now
        computed = t.computed[ids] + new_tokens
        known = t.prompt[ids] + t.out[ids]
        emits = computed >= known  # all known tokens computed: the step samples new tokens
        accepted = np.zeros(len(ids), dtype=np.int64)
        drafted = emits & (num_spec > 0)
        if drafted.any():
            accepted[drafted] = self.spec.sample_accepted(ids[drafted], num_spec[drafted], self.rng)
            t.spec_drafted[ids[drafted]] += num_spec[drafted]
            t.spec_accepted[ids[drafted]] += accepted[drafted]
            t.spec_steps[ids[drafted]] += 1
            computed = computed - (num_spec - accepted) * drafted  # rejected drafts are rolled back
        t.computed[ids] = computed
        e_ids = ids[emits]
        if len(e_ids) == 0:
            return
        emitted = np.minimum(accepted[emits] + 1, t.target[e_ids] - t.out[e_ids])
        first = t.out[e_ids] == 0
        t.first_token[e_ids[first]] = now
        step = self.recorder.num_steps  # this step's index (recorded right after _update)
        t.first_token_step[e_ids[first]] = step
        later = e_ids[~first]
        if len(later):
            self.recorder.itl_chunks.append(now - t.last_emit[later])
        t.last_emit[e_ids] = now
        t.out[e_ids] += emitted
        t.num_chunks[e_ids] += 1
        done = t.out[e_ids] >= t.target[e_ids]
        if done.any():
            d_ids = e_ids[done]
            t.finish[d_ids] = now
            t.finish_step[d_ids] = step
            self.free_blocks += int(t.blocks[d_ids].sum())
            t.blocks[d_ids] = 0
            self.running = self.running[~np.isin(self.running, d_ids)]
            self.on_finish(d_ids)
