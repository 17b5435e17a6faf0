"""The price of the drafter's work per engine step: `DraftCost`.

`DraftCost` prices one step's drafting with the SAME roofline as the target: `StepCostModel`
  (same GPU, same TP) on architectures built from the drafter, split into the pieces vLLM runs:

  - ``sequential`` (mtp, gemma4_mtp, eagle3, draft_model; vLLM llm_base_proposer): a first draft
    forward over every token of the target forward (T; + one slot per request for draft models),
    logits at one row per request, then N − 1 forwards over the B requests; N LM-head calls of B
    rows; the drafter's attention over each request's context in every pass; N × (the pass's layer kernels +
    pass overhead).
    EAGLE-3's fc over the target features runs in the first pass only.
  - ``parallel_block`` (dflash, dspark): a context-K/V projection of the T target tokens (fc over
    the target features + one fused K/V GEMM for all layers), ONE forward of the drafter layers over
    B·(N + 1) (DFlash) or B·N (DSpark) query positions attending c_i + block keys, the LM head on
    B·N rows, and for DSpark N sequential Markov-head steps (rank-r GEMV over the draft vocabulary for
    B rows each); 1 × (the drafter layers' kernels + pass overhead) (+ N × Markov-step overhead).
  - ``cpu`` (ngram): B × cpu_us_per_seq.

  A pass's layer kernels cost what the target's do per kernel: the GPU profile's `layer_overhead_us` per
  dense layer's worth of kernels (StepCostModel.layer_kernels_s on the pass's layers), the fixed time a
  forward pass's priced pieces (`with_overhead=False`) leave out; `draft_pass_overhead_us` is the rest of
  a pass (LM-head and sampling launches, input preparation, un-graphed kernels; docs/seed_validation.md §36).

  B = all requests scheduled in the step (vLLM drafts over the whole padded batch, partial prefills
  included), T = tokens in the target forward, C = Σ context of the B requests. With only the sums
  known (`time_s`), each request is taken to hold T/B new tokens at context C/B: exact for
  full-attention layers in decode steps, an approximation for sliding-window layers and for mixed
  prefill steps. `SpeculativeDecoding.draft_time` has the per-request arrays and prices attention

native MTP module built from the target (one decoder layer — a MoE layer for MoE targets — with the
target's per-layer attention, fc 2H→H, the target's LM head; `ModelArch.params_native_mtp`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import numpy as np

from capacity.errors import CapacityError
from capacity.inputs.models import ModelArch
from capacity.spec.methods import DraftMethod, check_num_speculative_tokens, check_pairing, get_method
from capacity.cost.step_cost import AttentionTables, StepCostModel, StepFeatures, fast_maximum, int_sum

if TYPE_CHECKING:
    from capacity.inputs.hardware import GpuProfile

PART_KEYS = ("passes", "lm_head", "attention", "markov", "cpu", "overhead")
"""Keys of `DraftCost.parts`; they sum to `DraftCost.time_s`."""


# --------------------------------------------------------------------------------------------------
# Architectures of the drafter's pieces
# --------------------------------------------------------------------------------------------------

def _linear_only(base: ModelArch, name: str, params: float, bytes_per_param: float, *,
                 per_sampled_row: bool, dtype: str = "bf16") -> ModelArch:
    """A weight matrix priced on its own: `params` weights read once per pass, 2·params FLOPs per
    token (per_sampled_row=False) or per sampled row (an LM head / Markov head)."""
    params = float(params)
    return dataclasses.replace(
        base, name=name, num_layers=0, params_lm_head=int(round(params)) if per_sampled_row else 0,
        dense_flops_per_token=2.0 * params, dense_weight_bytes=params * bytes_per_param,
        num_moe_layers=0, num_experts=0, experts_per_token=0, expert_flops_per_token=0.0, expert_weight_bytes=0.0,
        dense_weight_dtype=dtype, compute_weight_dtype=dtype, uses_mla=False)


def _without(arch: ModelArch, name: str, *, drop_lm_head: bool = True, drop_linear: float = 0.0) -> ModelArch:
    """`arch` without its LM head and without `drop_linear` dense linear weights (fc, Markov head)."""
    lm = arch.params_lm_head if drop_lm_head else 0
    return dataclasses.replace(
        arch, name=name, params_lm_head=arch.params_lm_head - lm,
        dense_flops_per_token=arch.dense_flops_per_token - 2.0 * lm - 2.0 * drop_linear,
        dense_weight_bytes=(arch.dense_weight_bytes - lm * arch.bytes_per_param["embedding"]
                            - drop_linear * arch.bytes_per_param["dense"]))


def _taps(draft: ModelArch, default: int) -> int:
    ids = draft.draft.target_layer_ids if draft.draft is not None else None
    return len(ids) if ids else default


def build_mtp_module(target: ModelArch) -> ModelArch:
    """One native MTP module as a one-layer ModelArch (LM head = the target's).

    Parameters: ModelArch.params_native_mtp / modules (attention + fc 2H→H + norms + MLP or the full
    MoE block); FLOPs 2 × (module − routed experts + LM head) per token, routed experts as in one
    target MoE layer. Attention: one target full-attention layer — GQA 4·nq·head_dim per context
    token (inputs/models.py convention), MLA and all-sparse (DSA) targets the average of their full-KV
    layers; KV per token = ModelArch.mtp_kv_bytes_per_token / modules.
    """
    n = int(target.native_mtp_layers)
    if n <= 0:
        raise CapacityError(f"{target.name} has no native MTP module; use eagle3, dflash or ngram")
    module = target.params_native_mtp / n
    routed = target.num_experts * target.params_per_expert if target.num_moe_layers else 0
    dense = module - routed
    lm = target.params_lm_head
    bpp = target.bytes_per_param
    n_kv_layers = max(int(target.num_full_attention_layers), 1)
    kv = target.mtp_kv_bytes_per_token / n
    all_sparse = target.num_sparse_attention_layers and target.num_sparse_attention_layers == target.num_full_attention_layers
    if all_sparse:
        index_kv = target.index_kv_bytes_per_token / n_kv_layers
        attn = dict(attn_flops_per_token_per_ctx=target.attn_flops_per_token_per_ctx / n_kv_layers,
                    mla_decode_flops_per_token_per_ctx=0.0, mla_prefill_flops_per_token_per_ctx=0.0,
                    mla_context_flops_per_token=0.0, num_sparse_attention_layers=1, sparse_kv_bytes_per_token=max(kv - index_kv, 0.0),
                    index_kv_bytes_per_token=index_kv,
                    sparse_attn_flops_per_token_per_ctx=target.sparse_attn_flops_per_token_per_ctx / n_kv_layers)
    else:
        per_ctx = (target.attn_flops_per_token_per_ctx / n_kv_layers if target.uses_mla
                   else 4.0 * target.num_attention_heads * (target.full_head_dim or target.head_dim))
        mla = target.uses_mla and target.mla_prefill_flops_per_token_per_ctx
        attn = dict(attn_flops_per_token_per_ctx=per_ctx, num_sparse_attention_layers=0,
                    mla_decode_flops_per_token_per_ctx=per_ctx if mla else 0.0,
                    mla_prefill_flops_per_token_per_ctx=target.mla_prefill_flops_per_token_per_ctx / n_kv_layers if mla else 0.0,
                    mla_context_flops_per_token=target.mla_context_flops_per_token / n_kv_layers if mla else 0.0,
                    sparse_kv_bytes_per_token=0.0, index_kv_bytes_per_token=0.0,
                    sparse_attn_flops_per_token_per_ctx=0.0, sparse_attention_tokens=None)
    moe = bool(target.num_moe_layers)
    return dataclasses.replace(
        target, name=f"{target.name} [MTP module]", role="draft", num_layers=1,
        num_full_attention_layers=1, num_sliding_attention_layers=0, sliding_window=None,
        num_linear_attention_layers=0, kv_bytes_per_token=kv, swa_kv_bytes_per_token=0.0, state_bytes_per_seq=0.0,
        swa_attn_flops_per_token_per_ctx=0.0, linear_attn_flops_per_token=0.0,
        params_total=int(module), params_active=int(dense + lm + (target.experts_per_token * target.params_per_expert if moe else 0)),
        params_embedding=0, params_lm_head=lm,
        num_moe_layers=1 if moe else 0,
        expert_flops_per_token=target.expert_flops_per_token / target.num_moe_layers if moe else 0.0,
        dense_flops_per_token=2.0 * (dense + lm),
        dense_weight_bytes=dense * bpp["dense"] + lm * bpp["embedding"],
        weight_bytes_total=n * (dense * bpp["dense"] + (target.num_experts * target.expert_weight_bytes if moe else 0.0)),
        native_mtp_layers=0, params_native_mtp=0, mtp_kv_bytes_per_token=0.0, draft=None,
        **attn)


def _reading_target_kv(assistant: ModelArch, target: ModelArch) -> ModelArch:
    """The Gemma 4 assistant as it reads the target's KV: each of its full (sliding) layers reads one
    target full (sliding) layer's cache per context token (sliding ones up to the target window)."""
    full = target.kv_bytes_per_token / target.num_full_attention_layers if target.num_full_attention_layers else 0.0
    swa = (target.swa_kv_bytes_per_token / target.num_sliding_attention_layers
           if target.num_sliding_attention_layers else 0.0)
    return dataclasses.replace(
        assistant, kv_bytes_per_token=assistant.num_full_attention_layers * full,
        swa_kv_bytes_per_token=assistant.num_sliding_attention_layers * swa,
        sliding_window=target.sliding_window or assistant.sliding_window, state_bytes_per_seq=0.0,
        sparse_kv_bytes_per_token=0.0, index_kv_bytes_per_token=0.0)


@dataclass(frozen=True)
class _Piece:
    """One priced part of the drafter: an architecture and its StepCostModel."""

    arch: ModelArch
    cost: StepCostModel


# --------------------------------------------------------------------------------------------------
# DraftCost
# --------------------------------------------------------------------------------------------------

ArrayLike = float | int | np.ndarray


@dataclass(frozen=True)
class PriceMemos:
    """A DraftCost's exact price memos (`DraftCost.price_memos`): the `steps_time_s` blocks, the
    linear-layer prices per piece and shape, and the AttentionTables of each piece, in piece order.
    Their keys and values depend only on the DraftCost's inputs."""

    steps: dict[tuple[int, float, int], dict[int, np.ndarray]]
    linear: dict[tuple[str, float, float, float], float]
    tables: tuple[AttentionTables, ...]


class DraftCost:
    """Prices the drafter's work in one engine step with the same roofline as the target
    (StepCostModel on the draft architecture, same GPU and TP). See the module docstring for the
    per-method cost structure."""

    # memo of `steps_time_s` (sizes measured on the built-in scenario and heavier loads: a block's call
    # costs about 0.4 ms plus 0.1 us per context sum, a run's own call about 0.4 ms)
    _MEMO_BLOCK_PER_SEQ = 512   # context sums per block, per sequence ...
    _MEMO_MAX_BLOCK = 4096      # ... up to this many
    _MEMO_MAX_SEQS = 32         # larger batches are priced directly

    MEMO_ATTRIBUTES: ClassVar[frozenset[str]] = frozenset({"_steps_memo", "_linear_memo"})
    """The instance attributes that hold price memos: caches derived from the inputs, not inputs
    (a fingerprint of the inputs leaves them out; each piece's StepCostModel.tables likewise)."""

    def __init__(self, method: DraftMethod | str, gpu: GpuProfile, target: ModelArch, draft: ModelArch | None,
                 tensor_parallel_size: int, num_speculative_tokens: int, overrides: dict[str, Any] | None = None):
        self.method = get_method(method) if isinstance(method, str) else method
        self.gpu = gpu
        self.target = target
        self.tp = int(tensor_parallel_size)
        self.num_speculative_tokens = int(num_speculative_tokens)
        m = self.method
        if m.drafter != "checkpoint":
            draft = None
        check_pairing(m, target, draft)
        check_num_speculative_tokens(m, target, draft, self.num_speculative_tokens)
        self.draft = draft
        self.params = self._parameters(overrides)
        self._overhead_s = self.params.get("draft_pass_overhead_us", 0.0) * 1e-6
        extra = float(m.cost.get("extra_first_pass_tokens_per_seq", 0))
        self._extra_first_pass_tokens = int(extra) if extra.is_integer() else extra
        self._queries_per_seq_offset = float(m.cost.get("queries_per_seq_offset", 0))
        # (shared between DraftCosts with equal inputs, see price_memos: keys and values must depend
        # on the inputs only)
        self._steps_memo: dict[tuple[int, float, int], dict[int, np.ndarray]] = {}
        self._linear_memo: dict[tuple[str, float, float, float], float] = {}   # keyed by piece name

        self.extra_swa_kv_bytes_per_token = 0.0
        self.extra_sliding_window: int | None = None
        self.extra_state_bytes_per_seq = 0.0
        self.weight_bytes = 0.0
        self.extra_kv_bytes_per_token = 0.0
        self._first = self._later = self._head = self._context = self._markov = None
        self._pass_kernels_s = 0.0
        if m.kind == "cpu":
            return
        if m.drafter == "target_mtp":
            arch = build_mtp_module(target)
            self.weight_bytes = arch.weight_bytes_total
            self.extra_kv_bytes_per_token = float(target.mtp_kv_bytes_per_token)
        else:
            assert draft is not None
            arch = draft
            self.weight_bytes = float(draft.weight_bytes_total)
            if m.name == "eagle3" and self.params.get("shares_target_embedding", 0.0):
                self.weight_bytes -= draft.params_embedding * draft.bytes_per_param["embedding"]
            if not (draft.draft is not None and draft.draft.shares_target_kv):
                self.extra_kv_bytes_per_token = float(draft.kv_bytes_per_token)
                self.extra_swa_kv_bytes_per_token = float(draft.swa_kv_bytes_per_token)
                self.extra_sliding_window = draft.sliding_window
                self.extra_state_bytes_per_seq = float(draft.state_bytes_per_seq)
        self.drafter_arch = arch
        bpp = arch.bytes_per_param
        self._head = self._piece(_linear_only(arch, f"{arch.name} [LM head]", arch.params_lm_head,
                                              bpp["embedding"], per_sampled_row=True))
        if m.kind == "sequential":
            reading = _reading_target_kv(arch, target) if m.flag("reads_target_kv") else arch
            self._first = self._piece(_without(reading, f"{arch.name} [first pass]"))
            fc = 0.0
            if m.flag("fc_first_pass_only"):
                fc = _taps(arch, 3) * float(arch.hidden_size) ** 2      # fc taps·H -> H (inputs/models.py, EAGLE-3)
            self._later = self._piece(_without(reading, f"{arch.name} [pass]", drop_linear=fc))
        else:  # parallel_block
            h = float(arch.hidden_size)
            fc = _taps(arch, arch.num_layers) * h * h                   # fc taps·H -> H (inputs/models.py, DFlash/DSpark)
            n_full, n_swa = arch.num_full_attention_layers, arch.num_sliding_attention_layers
            kv_proj = h * 2.0 * (n_full * (arch.full_num_kv_heads or arch.num_kv_heads) * (arch.full_head_dim or arch.head_dim)
                                 + n_swa * arch.num_kv_heads * arch.head_dim)
            self._context = self._piece(_linear_only(arch, f"{arch.name} [context K/V]", fc + kv_proj, bpp["dense"],
                                                     per_sampled_row=False, dtype=arch.dense_weight_dtype))
            markov = 0.0
            if m.flag("markov_steps"):
                info = arch.draft
                rank = (info.markov_rank if info is not None and info.markov_rank else 0)
                vocab = (info.draft_vocab_size if info is not None and info.draft_vocab_size else arch.vocab_size)
                markov = float(rank) * float(vocab)                     # markov_w2 [V, r] (inputs/models.py)
                self._markov = self._piece(_linear_only(arch, f"{arch.name} [Markov head]", markov, bpp["dense"],
                                                        per_sampled_row=True, dtype=arch.dense_weight_dtype))
            self._later = self._piece(_without(arch, f"{arch.name} [block pass]", drop_linear=fc + markov))
        # the fixed GPU time of the drafter's layer kernels in each pass (N passes sequential, one block pass),
        # at the same time per kernel as the target's layers (the profile's `layer_overhead_us`; module docstring);
        # `draft_pass_overhead_us` is what a pass costs besides them
        self._pass_kernels_s = self._later.cost.layer_kernels_s()

    # ------------------------------------------------------------------ setup helpers
    def _parameters(self, overrides: Mapping[str, Any] | None) -> dict[str, float]:
        values = {k: p.value for k, p in self.method.parameters.items()}
        for key, value in (overrides or {}).items():
            if key not in values:
                known = ", ".join(values) or "none"
                raise CapacityError(f"unknown parameter '{key}' for method {self.method.name}; known: {known}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise CapacityError(f"parameter {key} of method {self.method.name} must be a number >= 0, got {value!r}")
            values[key] = float(value)
        return values

    def _piece(self, arch: ModelArch) -> _Piece:
        return _Piece(arch, StepCostModel(self.gpu, arch, self.tp))

    def _pieces(self) -> list[_Piece]:
        return [p for p in (self._first, self._later, self._head, self._context, self._markov) if p is not None]

    def price_memos(self) -> PriceMemos:
        """This DraftCost's price memos, to share with a DraftCost built from equal inputs
        (`adopt_price_memos`): every later price either fills or reads the same shared tables."""
        return PriceMemos(self._steps_memo, self._linear_memo, tuple(p.cost.tables for p in self._pieces()))

    def adopt_price_memos(self, memos: PriceMemos) -> None:
        """Price from now on with `memos`, the `price_memos()` of a DraftCost with the same inputs
        (e.g. an equal fingerprint of its attributes outside MEMO_ATTRIBUTES and the pieces' tables):
        its entries hold the bits this DraftCost would compute. Adopting its own memos changes nothing."""
        self._steps_memo, self._linear_memo = memos.steps, memos.linear
        for piece, tables in zip(self._pieces(), memos.tables):   # equal inputs: the same pieces, in order
            piece.cost.tables = tables

    def extra_kv_cache_bytes(self, context_tokens: ArrayLike) -> np.ndarray:
        """Drafter cache bytes per sequence at each context length (sliding layers capped at their window)."""
        c = np.asarray(context_tokens, dtype=float)
        swa = c if self.extra_sliding_window is None else np.minimum(c, float(self.extra_sliding_window))
        return self.extra_kv_bytes_per_token * c + self.extra_swa_kv_bytes_per_token * swa + self.extra_state_bytes_per_seq

    # ------------------------------------------------------------------ pricing
    def _gemm(self, piece: _Piece, tokens: ArrayLike, seqs: ArrayLike, sampled: ArrayLike,
              attn_flops: ArrayLike = 0.0, kv_bytes: ArrayLike = 0.0) -> tuple[ArrayLike, ArrayLike]:
        """(linear layers + all-reduce, attention) seconds of one pass; nothing when it has no tokens."""
        on = tokens > 0
        return self._linear(piece, tokens, seqs, sampled) * on, piece.cost.attention_time(attn_flops, kv_bytes) * on

    def _linear(self, piece: _Piece, tokens: ArrayLike, seqs: ArrayLike, sampled: ArrayLike) -> ArrayLike:
        """Seconds of a pass's linear layers and all-reduces (every part but attention), memoised for
        scalar shapes: the drafter sees the same few (tokens, sequences) again and again. Keyed by
        the piece's name (distinct within a DraftCost), so the memo depends on the inputs only."""
        key = (piece.arch.name, tokens, seqs, sampled) if type(tokens) is float and type(seqs) is float \
            and type(sampled) is float else None
        linear = self._linear_memo.get(key) if key else None
        if linear is None:
            f = StepFeatures(num_tokens=tokens, num_seqs=seqs, num_sampled=sampled, attn_flops=0.0, kv_read_bytes=0.0)
            linear = sum(v for k, v in piece.cost.time_parts(f, with_overhead=False).items() if k != "attention")
            if key:
                self._linear_memo[key] = linear
        return linear

    @staticmethod
    def _attention(piece: _Piece, seqs: ArrayLike, queries: ArrayLike, context: ArrayLike,
                   detail: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[ArrayLike, ArrayLike]:
        """(attention FLOPs, KV bytes read) of `seqs` sequences with `queries` new tokens each ending at
        `context`; with `detail` = (queries, context) per sequence, summed exactly (whole-number
        arrays are looked up in the piece's AttentionTables)."""
        arch = piece.arch
        if detail is not None:
            q, c = detail                     # q: per sequence, or one whole number for all
            # a few sequences as Python whole numbers (lists from step_time_s, or small integer arrays):
            # plain Python look-ups, the same bits
            if type(c) is list or (c.dtype.kind in "iu" and len(c) <= piece.cost.tables.MAX_ROWS
                                   and (type(q) is int or (isinstance(q, np.ndarray) and q.dtype.kind in "iu"))):
                cs = c if type(c) is list else c.tolist()
                if type(q) is int:
                    return piece.cost.tables.sums(q, [x if x >= q else q for x in cs])
                qs = q if type(q) is list else q.tolist()
                return piece.cost.tables.sums(qs, [x if x >= y else y for x, y in zip(cs, qs)])
            c = np.maximum(c, q)
            if c.dtype.kind in "iu" and (isinstance(q, int) or q.dtype.kind in "iu"):
                tables = piece.cost.tables
                return float(np.add.reduce(tables.flops(q, c))), float(np.add.reduce(tables.kv[c]))   # .sum(), unwrapped
            q, c = np.broadcast_to(q, c.shape).astype(float), c.astype(float)
            return float(arch.attention_flops(q, c).sum()), float(arch.kv_read_bytes(c).sum())
        q = np.asarray(queries, dtype=float)
        c = np.maximum(np.asarray(context, dtype=float), q)
        flops = seqs * np.where(seqs > 0, arch.attention_flops(np.minimum(q, c), c), 0.0)
        return flops, seqs * np.where(seqs > 0, arch.kv_read_bytes(c), 0.0)

    def _parts(self, B: ArrayLike, T: ArrayLike, C: ArrayLike, N: ArrayLike,
               detail: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, ArrayLike]:
        """Seconds by part. Scalars are priced in Python floats and arrays elementwise (unused parts
        are 0.0): the same arithmetic either way, so a step costs the same bits in both."""
        if not (type(B) is float and type(T) is float and type(C) is float and type(N) is float):   # (a step's)
            B, T, C, N = (_scalar_or_array(x) for x in (B, T, C, N))
        on = (N > 0) & (B > 0)
        parts: dict[str, ArrayLike] = dict.fromkeys(PART_KEYS, 0.0)
        m = self.method
        if m.kind == "cpu":
            parts["cpu"] = self.params["cpu_us_per_seq"] * 1e-6 * B * on
            return parts
        safe_b = fast_maximum(B, 1.0)
        c_mean = C / safe_b
        if m.kind == "sequential":
            head = self._linear(self._head, B, B, B) * (B > 0)      # _gemm's linear part (no attention)
            extra = self._extra_first_pass_tokens
            t1 = T + extra * B
            d1 = dl = None
            if detail is not None:
                d1 = _shifted(detail, extra) if extra else detail
                dl = (1, detail[1])
            a1 = self._attention(self._first, B, t1 / safe_b, c_mean + extra, d1)
            g1, at1 = self._gemm(self._first, t1, B, B, *a1)
            al = self._attention(self._later, B, np.ones_like(B) if isinstance(B, np.ndarray) else 1.0, c_mean, dl)
            gl, atl = self._gemm(self._later, B, B, B, *al)
            later = fast_maximum(N - 1.0, 0.0)
            parts["passes"] = g1 + later * gl
            parts["attention"] = at1 + later * atl
            parts["lm_head"] = N * head
            parts["overhead"] = N * (self._overhead_s + self._pass_kernels_s)
        else:  # parallel_block
            q = N + self._queries_per_seq_offset
            gc, _ = self._gemm(self._context, T, B, 0.0)
            dq = None
            if detail is not None:
                qd = q.flat[0] if isinstance(q, np.ndarray) else q
                qd = int(qd) if float(qd).is_integer() else float(qd)
                c = detail[1]
                dq = (qd, [x + qd for x in c] if type(c) is list and type(qd) is int else np.asarray(c) + qd)
            aq = self._attention(self._later, B, q, c_mean + q, dq)
            gq, atq = self._gemm(self._later, B * q, B, 0.0, *aq)
            rows = B * N
            gh, _ = self._gemm(self._head, rows, B, rows)
            parts["passes"] = gc + gq
            parts["attention"] = atq
            parts["lm_head"] = gh
            parts["overhead"] = self._overhead_s + self._pass_kernels_s
            if self._markov is not None:
                gm, _ = self._gemm(self._markov, B, B, B)
                parts["markov"] = N * gm
                parts["overhead"] = parts["overhead"] + N * self.params.get("markov_step_overhead_us", 0.0) * 1e-6
        return parts if on is True else {k: v * on for k, v in parts.items()}   # (v * True is v)

    def parts(self, num_decode_seqs: ArrayLike, target_tokens: ArrayLike, context_tokens_sum: ArrayLike,
              num_spec: ArrayLike) -> dict[str, float | np.ndarray]:
        """Seconds by part (PART_KEYS: passes = drafter linear layers incl. fc/context projection and
        all-reduces, lm_head, attention, markov, cpu, overhead) for the arguments of `time_s`."""
        args = (num_decode_seqs, target_tokens, context_tokens_sum, num_spec)
        p = self._parts(*args)
        shape = np.broadcast_shapes(*(np.shape(x) for x in args))
        return {k: float(v) for k, v in p.items()} if shape == () else {k: _shaped(v, shape) for k, v in p.items()}

    def time_s(self, num_decode_seqs: ArrayLike, target_tokens: ArrayLike, context_tokens_sum: ArrayLike,
               num_spec: ArrayLike) -> float | np.ndarray:
        """Drafting time of a step: `num_decode_seqs` requests (B) proposing `num_spec` (N) tokens each,
        `target_tokens` (T) tokens in the target forward (prefill included), `context_tokens_sum` (C)
        = Σ context of those requests. 0 when N = 0 or B = 0. Arrays of equal shape price many steps."""
        args = (num_decode_seqs, target_tokens, context_tokens_sum, num_spec)
        total = sum(self._parts(*args).values())
        shape = np.broadcast_shapes(*(np.shape(x) for x in args))
        return float(total) if shape == () else _shaped(total, shape)

    def steps_time_s(self, num_decode_seqs: int, target_tokens: float, context_tokens_sum: np.ndarray,
                     num_spec: int) -> np.ndarray:
        """`time_s` of many steps that differ only in their whole-number context sums C, memoised in
        blocks of C per (B, T, N): runs of decode steps ask for the same few (B, T, N) again and again,
        and one call over a block costs about what one run's call costs. Large batches, whose keys
        rarely come back, are priced directly."""
        key = (int(num_decode_seqs), float(target_tokens), int(num_spec))
        if key[0] > self._MEMO_MAX_SEQS:
            return self.time_s(float(key[0]), key[1], context_tokens_sum.astype(float), float(key[2]))
        size = min(self._MEMO_BLOCK_PER_SEQ * key[0], self._MEMO_MAX_BLOCK)    # C grows with B
        few = context_tokens_sum.tolist() if len(context_tokens_sum) < 32 else None   # a few: plain Python
        lo, hi = (min(few), max(few)) if few else (int(np.minimum.reduce(context_tokens_sum)),   # .min(), .max()
                                                   int(np.maximum.reduce(context_tokens_sum)))
        lo, hi = lo // size, hi // size
        blocks = self._steps_memo.get(key)
        if blocks is None:
            blocks = self._steps_memo[key] = {}
        table = blocks.get(lo) if lo == hi else None                 # the usual case: one block, priced
        if table is None:
            for b in range(lo, hi + 1):
                if b not in blocks:
                    blocks[b] = self.time_s(float(key[0]), key[1], np.arange(b * size, (b + 1) * size, dtype=float),
                                            float(key[2]))
            table = blocks[lo] if lo == hi else np.concatenate([blocks[b] for b in range(lo, hi + 1)])
        return table[context_tokens_sum - lo * size]

    def step_time_s(self, new_tokens: np.ndarray | list[int], context_tokens: np.ndarray | list[int],
                    num_spec: int) -> float:
        """Drafting time of one step from per-request arrays (exact attention per request), or from
        Python lists of whole numbers for a few requests (at most AttentionTables.MAX_ROWS: the engine's
        mixed steps, priced in plain Python without numpy's per-call cost; the same bits)."""
        if type(new_tokens) is list and type(context_tokens) is list:
            if not new_tokens or num_spec <= 0:
                return 0.0
            p = self._parts(float(len(new_tokens)), float(sum(new_tokens)), float(sum(context_tokens)),
                            float(num_spec), detail=(new_tokens, context_tokens))
            return float(sum(p.values()))
        new_tokens = np.asarray(new_tokens)
        context_tokens = np.asarray(context_tokens)
        if len(new_tokens) == 0 or num_spec <= 0:
            return 0.0
        whole = new_tokens.dtype.kind in "iu" and context_tokens.dtype.kind in "iu"
        p = self._parts(len(new_tokens), int_sum(new_tokens) if whole else new_tokens.sum(),
                        int_sum(context_tokens) if whole else context_tokens.sum(), num_spec,
                        detail=(new_tokens, context_tokens))
        return float(sum(p.values()))


def _scalar_or_array(x: ArrayLike) -> float | np.ndarray:
    """A scalar as a Python float, anything else as a float array (see DraftCost._parts)."""
    if type(x) is float:
        return x
    if isinstance(x, np.ndarray):
        return float(x) if x.ndim == 0 else x.astype(float, copy=False)
    return float(x) if isinstance(x, (int, float, np.number)) else np.asarray(x, dtype=float)


def _shifted(detail: tuple, extra: float) -> tuple:
    """Per-request (queries, context) of `DraftCost._parts`' detail with `extra` more of each (Python
    lists stay lists when extra is a whole number)."""
    q, c = detail
    if type(c) is list:
        if type(extra) is not int:
            return np.asarray(q) + extra, np.asarray(c) + extra
        return (q + extra if type(q) is int else [x + extra for x in q]), [x + extra for x in c]
    return q + extra, c + extra


def _shaped(x: ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    return np.array(np.broadcast_to(x, shape), dtype=float)


