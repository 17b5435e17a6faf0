"""Drafting methods and their per-step cost, against independent truth.

Expected drafting times are rebuilt here from the method's cost structure (methods.yaml / vLLM's
proposers): the pieces are toy architectures built in this file and priced with separate
StepCostModel calls, or memory-bound rooflines worked out by hand (bytes / bandwidth). Nothing is
copied from spec/decoding.py's output.
"""

from __future__ import annotations

import numpy as np
import pytest

from capacity.spec.decoding import SpeculativeDecoding, build_speculation, resolve_draft
from capacity.spec.draft_cost import DraftCost
from capacity.spec.methods import get_method, list_methods, methods_table
from capacity.errors import CapacityError
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import DraftInfo, ModelArch, load_model
from capacity.spec.policies import OffAbovePolicy, StaticPolicy
from capacity.spec.interface import NoSpeculation
from capacity.cost.step_cost import StepCostModel, StepFeatures, StepTime

EFF = {"gemm": 0.5, "hbm": 0.8, "attention": 0.5, "allreduce": 0.7, "step_overhead_ms": 1.0,
       "per_seq_overhead_us": 0.0}


@pytest.fixture(scope="module")
def gpu():
    # efficiencies pinned so the regime tests do not depend on calibration of the shipped profile
    return load_gpu("MI300X").with_overrides(efficiency=EFF)


def toy(name: str, *, layers: int, hidden: int = 64, vocab: int = 5000, layer_params: float = 200_000,
        extra_params: float = 0.0, lm_params: float | None = None, emb_params: float = 0.0, heads: int = 8,
        kv_heads: int = 2, head_dim: int = 16, role: str = "target", draft: DraftInfo | None = None,
        native_mtp: int = 0, mtp_params: int = 0) -> ModelArch:
    """A dense bf16 toy model: `layers` identical full-attention layers of `layer_params` linear
    weights, `extra_params` outside the layers (fc), an LM head of `lm_params` (default vocab·hidden)."""
    lm = float(vocab * hidden if lm_params is None else lm_params)
    linear = layers * layer_params + extra_params
    kv = layers * 2.0 * kv_heads * head_dim * 2.0
    return ModelArch(
        name=name, model_type="toy", role=role, num_layers=layers, hidden_size=hidden, vocab_size=vocab,
        num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        num_full_attention_layers=layers, num_sliding_attention_layers=0, sliding_window=None,
        num_linear_attention_layers=0, uses_mla=False,
        params_total=int(linear + lm + emb_params), params_active=int(linear + lm), params_embedding=int(emb_params),
        params_lm_head=int(lm), num_moe_layers=0, num_experts=0, experts_per_token=0, num_shared_experts=0,
        params_per_expert=0, weight_precision="bf16", compute_weight_dtype="bf16",
        bytes_per_param={"dense": 2.0, "expert": 2.0, "embedding": 2.0, "other": 2.0},
        weight_bytes_total=2.0 * (linear + lm + emb_params), dense_weight_bytes=2.0 * (linear + lm),
        expert_weight_bytes=0.0, dense_flops_per_token=2.0 * (linear + lm), expert_flops_per_token=0.0,
        kv_dtype="bf16", kv_bytes_per_token=kv, swa_kv_bytes_per_token=0.0, state_bytes_per_seq=0.0,
        attn_flops_per_token_per_ctx=layers * 4.0 * heads * head_dim, swa_attn_flops_per_token_per_ctx=0.0,
        linear_attn_flops_per_token=0.0, native_mtp_layers=native_mtp, draft=draft, source="test",
        params_native_mtp=mtp_params, mtp_kv_bytes_per_token=native_mtp * 2.0 * kv_heads * head_dim * 2.0)


def priced(gpu, arch: ModelArch, tokens, seqs, sampled, attn=0.0, kv=0.0, tp: int = 1) -> float:
    parts = StepCostModel(gpu, arch, tp).time_parts(StepFeatures(tokens, seqs, sampled, attn, kv), with_overhead=False)
    return float(sum(parts.values()))


def memory_bound_s(gpu, nbytes: float) -> float:
    return nbytes / (gpu.hbm_bandwidth_tb_s * 1e12 * EFF["hbm"])


def layer_kernels_s(gpu, kernels: int) -> float:
    """Fixed time of `kernels` layer kernels: the profile's layer_overhead_us is a dense layer's, which runs
    kernels_per_dense_layer of them (9 on MI300X), so each kernel costs layer_overhead_us / 9."""
    return gpu.efficiency["layer_overhead_us"] * 1e-6 * kernels / gpu.kernels_per_dense_layer


TARGET = "toy/target"


# --------------------------------------------------------------------------------------------------
# methods.yaml
# --------------------------------------------------------------------------------------------------

def test_every_seed_method_is_described_with_sources():
    names = [m.name for m in list_methods()]
    assert names == ["mtp", "gemma4_mtp", "eagle3", "dflash", "dspark", "draft_model", "ngram"]
    for m in list_methods():
        for p in m.parameters.values():
            assert p.basis and p.source
        assert m.lookahead_source
    rows = methods_table()
    assert {r["name"] for r in rows} == set(names)
    assert all(r["passes_per_step"] and r["cost_structure"] for r in rows)


def test_seed_article_default_drafts():
    # seed_article_notes.md §2.2 serve commands
    assert get_method("gemma4_mtp").default_draft("google/gemma-4-31B-it") == "google/gemma-4-31B-it-assistant"
    assert get_method("eagle3").default_draft("google/gemma-4-31B-it") == "RedHatAI/gemma-4-31B-it-speculator.eagle3"
    assert get_method("dflash").default_draft("google/gemma-4-31B-it") == "z-lab/gemma-4-31B-it-DFlash"
    assert get_method("dspark").default_draft("google/gemma-4-31B-it") == "RedHatAI/gemma-4-31B-it-speculator.dspark"
    assert get_method("eagle3").default_draft("Qwen/Qwen3-8B") == "RedHatAI/Qwen3-8B-Thinking-speculator.eagle3"
    assert get_method("dflash").default_draft("qwen/qwen3-8b") == "z-lab/Qwen3-8B-DFlash-b16"
    assert get_method("dspark").default_draft("Qwen/Qwen3-8B") == "deepseek-ai/dspark_qwen3_8b_block7"
    assert get_method("eagle3").default_draft("moonshotai/Kimi-K2.5") == "lightseekorg/kimi-k2.5-eagle3-mla"
    assert get_method("eagle3").default_draft("MiniMaxAI/MiniMax-M3-MXFP8") == "Inferact/MiniMax-M3-EAGLE3"
    # every shipped default loads and was trained for its target
    for m in list_methods():
        for target, draft in m.default_drafts.items():
            if draft != "built-in":
                info = load_model(draft).draft
                assert info is not None and info.method == m.name and info.target == target


def test_lookahead_follows_vllm_scheduler():
    # vLLM scheduler: num_lookahead_tokens = N when use_eagle() (eagle, eagle3, mtp, dflash, dspark)
    # or uses_draft_model(); 0 otherwise (ngram)
    lookahead = {m.name: m.reserves_lookahead for m in list_methods()}
    assert lookahead == {"mtp": True, "gemma4_mtp": True, "eagle3": True, "dflash": True, "dspark": True,
                         "draft_model": True, "ngram": False}


# --------------------------------------------------------------------------------------------------
# Cost structure on toy architectures
# --------------------------------------------------------------------------------------------------

def eagle_pair():
    hidden, dvocab, layer = 64, 1000, 300_000
    fc = 3 * hidden * hidden
    target = toy(TARGET, layers=4, hidden=hidden)
    draft = toy("toy/eagle3", layers=1, hidden=hidden, layer_params=layer, extra_params=fc,
                lm_params=dvocab * hidden, emb_params=5000 * hidden, role="draft",
                draft=DraftInfo(method="eagle3", target=TARGET, target_layer_ids=(0, 1, 2), draft_vocab_size=dvocab))
    return target, draft, layer, fc, dvocab * hidden


@pytest.mark.parametrize("tp", [1, 2])
def test_eagle3_is_one_pass_over_target_tokens_then_single_token_passes(gpu, tp):
    target, draft, layer, fc, lm = eagle_pair()
    N, B, c = 3, 4, 100.0
    T = B * (N + 1)
    dc = DraftCost("eagle3", gpu, target, draft, tp, N)
    # pieces built here: layer + fc (first pass), layer alone (later passes), LM head alone
    first = toy("first", layers=1, hidden=64, layer_params=layer, extra_params=fc, lm_params=0)
    later = toy("later", layers=1, hidden=64, layer_params=layer, lm_params=0)
    head = toy("head", layers=0, hidden=64, layer_params=0, lm_params=lm)
    a = 4.0 * 8 * 16                      # attention FLOPs per query per context token, one layer
    k = 2.0 * 2 * 16 * 2                  # KV bytes per context token, one layer
    q = T / B
    t_first = priced(gpu, first, T, B, B, B * a * (q * c - q * (q - 1) / 2), B * k * c, tp)
    t_later = priced(gpu, later, B, B, B, B * a * c, B * k * c, tp)
    t_head = priced(gpu, head, B, B, B, tp=tp)
    # each pass also runs its one dense layer's kernels, at the target's fixed time per kernel
    overhead = get_method("eagle3").parameters["draft_pass_overhead_us"].value * 1e-6 + layer_kernels_s(gpu, 9)
    expected = t_first + (N - 1) * t_later + N * t_head + N * overhead
    assert dc.time_s(B, T, B * c, N) == pytest.approx(expected, rel=1e-9)
    parts = dc.parts(B, T, B * c, N)
    assert sum(parts.values()) == pytest.approx(expected, rel=1e-12)
    assert parts["overhead"] == pytest.approx(N * overhead)


def test_a_drafter_layer_costs_the_fixed_time_of_a_target_layer(gpu):
    """A one-layer drafter's pass pays the fixed kernel time of one of the target's (identical) layers: the
    target's whole-step kernel time (its "overhead" part without host time) divided by its layer count."""
    target = toy(TARGET, layers=6, hidden=64, native_mtp=1, mtp_params=200_000)
    no_host = gpu.with_overrides(efficiency={"step_overhead_ms": 0.0, "per_seq_overhead_us": 0.0})
    f = StepFeatures(num_tokens=1.0, num_seqs=1.0, num_sampled=1.0, attn_flops=0.0, kv_read_bytes=0.0)
    per_layer = StepCostModel(no_host, target, 1).time_parts(f)["overhead"] / 6
    dc = DraftCost("mtp", no_host, target, None, 1, 3, {"draft_pass_overhead_us": 0.0})
    assert dc.parts(1, 4, 100, 3)["overhead"] == pytest.approx(3 * per_layer, rel=1e-12)


def test_eagle3_weights_and_kv(gpu):
    target, draft, layer, fc, lm = eagle_pair()
    dc = DraftCost("eagle3", gpu, target, draft, 1, 3)
    # embedding shared with the target (vLLM drops an identical copy): layer + fc + LM head, bf16
    assert dc.weight_bytes == pytest.approx(2.0 * (layer + fc + lm))
    assert DraftCost("eagle3", gpu, target, draft, 1, 3, {"shares_target_embedding": 0}).weight_bytes == \
        pytest.approx(2.0 * (layer + fc + lm + 5000 * 64))
    assert dc.extra_kv_bytes_per_token == 2 * 2 * 16 * 2     # one layer, K and V, 2 kv heads x 16, bf16


def test_mtp_grows_linearly_in_n_by_one_layer_plus_head(gpu):
    P = 250_000
    target = toy(TARGET, layers=6, hidden=64, native_mtp=1, mtp_params=P)
    dc = DraftCost("mtp", gpu, target, None, 1, 7)
    B, T, c = 8, 40, 500.0
    t = [dc.time_s(B, T, B * c, n) for n in range(1, 8)]
    steps = np.diff(t)
    assert np.allclose(steps, steps[0], rtol=1e-12)
    layer = toy("mtp layer", layers=1, hidden=64, layer_params=P, lm_params=0)
    head = toy("head", layers=0, hidden=64, layer_params=0, lm_params=5000 * 64)
    step = (priced(gpu, layer, B, B, B, B * 4.0 * 8 * 16 * c, B * 2 * 2 * 16 * 2 * c)
            + priced(gpu, head, B, B, B) + get_method("mtp").parameters["draft_pass_overhead_us"].value * 1e-6
            + layer_kernels_s(gpu, 9))                       # the MTP module: one dense layer's kernels
    assert steps[0] == pytest.approx(step, rel=1e-9)
    assert dc.weight_bytes == pytest.approx(2.0 * P)
    assert dc.extra_kv_bytes_per_token == 2 * 2 * 16 * 2


def test_ngram_costs_cpu_time_only(gpu):
    target = toy(TARGET, layers=4)
    dc = DraftCost("ngram", gpu, target, None, 1, 5)
    us = get_method("ngram").parameters["cpu_us_per_seq"].value
    parts = dc.parts(32, 32 * 6, 32 * 1000, 5)
    assert parts["cpu"] == pytest.approx(32 * us * 1e-6)
    assert sum(v for k, v in parts.items() if k != "cpu") == 0.0
    assert dc.weight_bytes == 0.0 and dc.extra_kv_bytes_per_token == 0.0
    assert DraftCost("ngram", gpu, target, None, 1, 5, {"cpu_us_per_seq": 7.0}).time_s(10, 60, 1e4, 5) == \
        pytest.approx(10 * 7e-6)


def test_no_drafting_when_n_or_batch_is_zero(gpu):
    target, draft, *_ = eagle_pair()
    dc = DraftCost("eagle3", gpu, target, draft, 1, 3)
    assert dc.time_s(8, 8, 800, 0) == 0.0
    assert dc.time_s(0, 0, 0, 3) == 0.0


# --------------------------------------------------------------------------------------------------
# Shipped pairs: regimes and hand arithmetic
# --------------------------------------------------------------------------------------------------

def test_dflash_is_one_pass_nearly_flat_in_n_at_small_batch(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    dc = DraftCost("dflash", gpu, t, d, 1, 15)
    small = [dc.time_s(1, n + 1, 2000 + n + 1, n) for n in (1, 7, 15)]
    assert small[-1] / small[0] < 1.15                       # weights read once, whatever N
    # one block pass, whatever N: its own overhead and its 5 Qwen3 layers' kernels (a dense layer's 9 plus
    # q_norm and k_norm: vllm/model_executor/models/qwen3.py Qwen3Attention)
    per_pass = get_method("dflash").parameters["draft_pass_overhead_us"].value * 1e-6 + layer_kernels_s(gpu, 5 * 11)
    assert all(dc.parts(1, n + 1, 2000, n)["overhead"] == pytest.approx(per_pass) for n in (1, 7, 15))
    # the LM head (the target's, borrowed) is read once per step: memory-bound at B = 1
    lm_head = memory_bound_s(gpu, t.vocab_size * t.hidden_size * 2.0)
    assert dc.parts(1, 8, 2008, 7)["lm_head"] == pytest.approx(lm_head, rel=1e-9)
    big = [dc.time_s(256, 256 * (n + 1), 256 * 2000, n) for n in (1, 15)]
    assert big[1] / big[0] > 3                               # compute-bound: B·(N+1) query tokens


def test_dflash_weights_exclude_the_borrowed_lm_head(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    dc = DraftCost("dflash", gpu, t, d, 1, 7)
    # research README: 1.05B derived drafter params (5 layers + fc), no embedding or LM head, bf16
    assert dc.weight_bytes == pytest.approx(2 * 1.05e9, rel=0.01)
    assert dc.extra_kv_bytes_per_token == 5 * 2 * 8 * 128 * 2   # 5 layers x K,V x 8 kv heads x 128 x bf16


def test_dspark_markov_head_is_n_sequential_rank_r_gemvs(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("deepseek-ai/dspark_qwen3_8b_block7")
    dc = DraftCost("dspark", gpu, t, d, 1, 7)
    # B = 1 is memory-bound: each of the N steps reads W2 (vocab x rank 256, bf16) once
    per_step = memory_bound_s(gpu, 151936 * 256 * 2.0)
    assert dc.parts(1, 8, 1000, 7)["markov"] == pytest.approx(7 * per_step, rel=1e-9)
    per_pass = get_method("dspark").parameters["draft_pass_overhead_us"].value * 1e-6 + layer_kernels_s(gpu, 5 * 11)
    assert dc.parts(1, 8, 1000, 7)["overhead"] == pytest.approx(per_pass + 7 * 15e-6)


def test_gemma4_assistant_reads_the_target_kv_and_holds_none(gpu):
    t, d = load_model("google/gemma-4-31B-it"), load_model("google/gemma-4-31B-it-assistant")
    dc = DraftCost("gemma4_mtp", gpu, t, d, 2, 3)
    assert dc.extra_kv_bytes_per_token == 0.0
    assert dc.weight_bytes == pytest.approx(0.47e9 * 2, rel=0.01)   # research README: 0.47B params
    # attention at long context is KV-read bound: per pass the assistant's 1 full layer reads one target
    # full layer (4 kv heads x 512, K and V, bf16) and its 3 sliding layers one target sliding layer
    # each (16 x 256, capped at the 1024 window)
    B, c, N = 1, 100_000.0, 2
    per_seq = 2 * 4 * 512 * 2 * c + 3 * 2 * 16 * 256 * 2 * 1024
    kv_s = per_seq / (gpu.hbm_bandwidth_tb_s * 1e12 * EFF["hbm"]) / 2      # KV heads split over TP = 2
    assert dc.parts(B, B, B * c, N)["attention"] == pytest.approx(N * kv_s, rel=0.02)


def test_mtp_module_of_qwen35_matches_research_size(gpu):
    t = load_model("Qwen/Qwen3.5-27B")
    dc = DraftCost("mtp", gpu, t, None, 2, 3)
    assert dc.weight_bytes == pytest.approx(0.43e9 * 2, rel=0.02)   # README: MTP 0.43B params, bf16
    assert dc.extra_kv_bytes_per_token == 2 * 4 * 256 * 2          # one full layer: 4 kv heads x 256


@pytest.mark.parametrize("target,method,tp", [
    ("Qwen/Qwen3-8B", "dflash", 1), ("Qwen/Qwen3-8B", "eagle3", 1), ("Qwen/Qwen3-8B", "dspark", 1),
    ("google/gemma-4-31B-it", "gemma4_mtp", 2), ("Qwen/Qwen3.5-122B-A10B", "mtp", 4),
    ("zai-org/GLM-5", "mtp", 8), ("Qwen/Qwen3-8B", "ngram", 1), ("moonshotai/Kimi-K2.5", "eagle3", 4)])
def test_vectorised_time_equals_scalar_elementwise(gpu, target, method, tp):
    t = load_model(target)
    m = get_method(method)
    dc = DraftCost(m, gpu, t, resolve_draft(m, t, None), tp, 3)
    B = np.array([0, 1, 7, 64, 64, 3])
    T = np.array([0, 4, 900, 256, 9000, 12])
    C = np.array([0, 1000, 9000, 64000, 70000, 300000])
    N = np.array([3, 3, 2, 3, 0, 1])
    vec = dc.time_s(B, T, C, N)
    assert vec.shape == B.shape
    assert np.allclose(vec, [dc.time_s(int(b), float(x), float(c), int(n)) for b, x, c, n in zip(B, T, C, N)],
                       rtol=1e-12, atol=0)


def test_per_request_pricing_equals_sums_for_uniform_decode(gpu):
    # full-attention drafter, every request at the same context: the mean-based and exact paths agree
    t, d = load_model("Qwen/Qwen3-8B"), load_model("RedHatAI/Qwen3-8B-Thinking-speculator.eagle3")
    dc = DraftCost("eagle3", gpu, t, d, 1, 4)
    new, ctx = np.full(16, 5.0), np.full(16, 3000.0)
    assert dc.step_time_s(new, ctx, 4) == pytest.approx(dc.time_s(16, 80, 16 * 3000, 4), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

def test_dflash_n_cannot_fill_more_than_the_block(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    DraftCost("dflash", gpu, t, d, 1, 15)
    with pytest.raises(CapacityError, match=r"<= 15"):
        DraftCost("dflash", gpu, t, d, 1, 16)


def test_unknown_method_lists_the_known_ones():
    with pytest.raises(CapacityError) as e:
        get_method("medusa")
    assert "eagle3" in str(e.value) and "dflash" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("target,method,draft,n,match", [
    ("Qwen/Qwen3-8B", "mtp", None, 3, "no native MTP"),
    ("google/gemma-4-31B-it", "mtp", None, 3, "gemma4_mtp"),
    ("Qwen/Qwen3-8B", "gemma4_mtp", "google/gemma-4-31B-it-assistant", 3, "Gemma 4 targets"),
    ("google/gemma-4-31B-it", "dflash", "z-lab/Qwen3-8B-DFlash-b16", 3, "trained for Qwen/Qwen3-8B"),
    ("Qwen/Qwen3-8B", "eagle3", "z-lab/Qwen3-8B-DFlash-b16", 3, "dflash drafter"),
    ("MiniMaxAI/MiniMax-M3-MXFP8", "mtp", None, 8, "multiple of 7"),
    ("Qwen/Qwen3-8B", "draft_model", "meta-llama/Llama-3.1-8B", 3, "vocabulary"),
])
def test_bad_pairs_raise_one_line_errors(gpu, target, method, draft, n, match):
    t = load_model(target)
    d = load_model(draft) if draft else None
    with pytest.raises(CapacityError, match=match) as e:
        DraftCost(method, gpu, t, d, 1, n)
    assert "\n" not in str(e.value)


def test_mtp_module_reuse_allows_multiples():
    gpu = load_gpu("MI300X")
    t = load_model("MiniMaxAI/MiniMax-M3-MXFP8")
    for n in (1, 7, 14):
        DraftCost("mtp", gpu, t, None, 8, n)


def test_unknown_override_is_rejected(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    with pytest.raises(CapacityError, match="draft_pass_overhead_us"):
        DraftCost("dflash", gpu, t, d, 1, 7, {"pass_overhead": 3})


# --------------------------------------------------------------------------------------------------
# The engine's Speculation
# --------------------------------------------------------------------------------------------------

class StubAcceptance:
    """Every draft accepted with probability `a`, independently (S_j = a^j)."""

    def __init__(self, a: float):
        self.a = a

    def survival(self, n: int) -> np.ndarray:
        return self.a ** np.arange(1, n + 1)

    def expected_tokens(self, n: int) -> float:
        return 1.0 + float(self.survival(n).sum())

    def sample(self, ids, num_spec, rng):
        return np.minimum(np.asarray(num_spec), 1)

    def sample_steps(self, ids, num_spec, num_steps, rng):
        return np.zeros((num_steps, len(ids)), dtype=np.int64)


def test_speculative_decoding_protocol(gpu):
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    dc = DraftCost("dflash", gpu, t, d, 1, 7)
    spec = SpeculativeDecoding(get_method("dflash"), dc, StubAcceptance(0.5), OffAbovePolicy(7, 40), 7)
    assert spec.num_spec_tokens(40) == 7 and spec.num_spec_tokens(41, 1000.0) == 0
    assert spec.lookahead_tokens(7) == 7 and spec.lookahead_tokens(0) == 7   # vLLM reserves the configured N
    assert spec.weight_bytes == dc.weight_bytes and spec.extra_kv_bytes_per_token == dc.extra_kv_bytes_per_token
    ids = np.arange(3)
    new, ctx, ns = np.array([8, 8, 500]), np.array([1000, 2000, 500]), np.array([7, 7, 0])
    out = spec.draft_time(ids, new, ctx, ns)
    assert isinstance(out, StepTime) and set(out.parts_s) == {"draft"}
    assert out.parts_s["draft"] == pytest.approx(dc.step_time_s(new, ctx, 7))
    # a step of prefills only still drafts (requests whose prompt completes): N from the policy
    assert spec.draft_time(ids, new, ctx, np.zeros(3, dtype=int)).total_s == pytest.approx(dc.step_time_s(new, ctx, 7))
    accepted = spec.sample_accepted(ids, np.array([7, 7, 2]), np.random.default_rng(0))
    assert accepted.tolist() == [1, 1, 1]
    ngram = SpeculativeDecoding(get_method("ngram"), DraftCost("ngram", gpu, t, None, 1, 3), StubAcceptance(0.5),
                                StaticPolicy(3), 3)
    assert ngram.lookahead_tokens(3) == 0


def test_build_speculation_off_and_wired(gpu, monkeypatch):
    t = load_model("Qwen/Qwen3-8B")
    assert isinstance(build_speculation({"method": "none", "num_speculative_tokens": 3}, gpu, t, 1), NoSpeculation)
    assert isinstance(build_speculation({"method": "dflash", "num_speculative_tokens": 0}, gpu, t, 1), NoSpeculation)
    seen = {}

    def acceptance_from_config(cfg, *, method, target, dataset=None, temperature=0.0, draft_sampling="argmax"):
        seen.update(method=method, target=target, dataset=dataset)
        return StubAcceptance(0.0)

    monkeypatch.setattr("capacity.spec.decoding.acceptance_from_config", acceptance_from_config)
    spec = build_speculation({"method": "dflash", "num_speculative_tokens": 7, "acceptance": {"dataset": "gsm8k"},
                              "policy": {"kind": "goodput", "max_n": 7}}, gpu, t, 1)
    assert seen == {"method": "dflash", "target": "Qwen/Qwen3-8B", "dataset": "gsm8k"}
    assert spec.draft_cost.draft.name == "z-lab/Qwen3-8B-DFlash-b16"      # the seed article's default
    assert spec.num_spec_tokens(8, 1000.0) == 0                           # nothing is ever accepted
    assert spec.lookahead_tokens(0) == 7
    with pytest.raises(CapacityError, match="<= 15"):
        build_speculation({"method": "dflash", "num_speculative_tokens": 16}, gpu, t, 1)
    with pytest.raises(CapacityError, match="no default"):
        build_speculation({"method": "draft_model", "num_speculative_tokens": 3}, gpu, t, 1)
    gemma = load_model("google/gemma-4-31B-it")
    spec = build_speculation({"method": "mtp", "num_speculative_tokens": 2, "draft": "google/gemma-4-31B-it-assistant"},
                             gpu, gemma, 2)
    assert spec.method.name == "gemma4_mtp"                               # vLLM: method mtp + model


def test_every_spelling_of_a_method_is_one_vocabulary():
    """methods.yaml is the one table of method names: each method's name, label and aliases resolve to
    it in get_method and in the acceptance profiles, and no spelling belongs to two methods."""
    from capacity.spec.acceptance import profile_rates
    from capacity.spec.methods import canonical_name

    seen: dict[str, str] = {}
    for m in list_methods():
        for spelling in (m.name, m.label, *m.aliases):
            assert seen.setdefault(spelling.lower(), m.name) == m.name, spelling
            assert get_method(spelling).name == canonical_name(spelling.upper()) == m.name
    assert get_method("EAGLE-3").name == "eagle3"                  # refused before the aliases moved here
    rates, _ = profile_rates("EAGLE-3", "Qwen/Qwen3-8B", "GSM8K")   # the acceptance table reads the same names
    np.testing.assert_array_equal(rates, profile_rates("eagle3", "Qwen/Qwen3-8B", "GSM8K")[0])
    with pytest.raises(CapacityError, match="unknown speculative method 'medusa'"):
        get_method("medusa")
