"""Rows run with the serve flags their series' benchmark script passed (serve_recipes.yaml): the
KV-cache dtype, the batched-token budget, async scheduling, the memory utilization and max-num-seqs
that the CSV rows do not carry."""

import re

import pandas as pd
import pytest

from capacity.inputs import scenario as scenario_mod
from capacity.inputs.models import load_model
from capacity.measurements.clients import recipe_matches, serve_recipe, serve_recipes
from capacity.measurements.row_scenario import row_scenario
from capacity.measurements.schemas import read_measurements
from capacity.paths import data_dir


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return read_measurements(data_dir() / "measurements" / "serving_vllm.csv")


def test_every_recipe_cites_a_script_at_a_commit_and_matches_shipped_rows(rows):
    records = rows.to_dict("records")
    for entry in serve_recipes():
        assert re.search(r"github\.com/SemiAnalysisAI/InferenceX/blob/[0-9a-f]{12,40}/benchmarks/\S+\.sh$",
                         entry["source"]), entry["source"]
        assert set(entry["match"]) <= set(rows.columns), entry["match"]
        assert entry.get("flags"), "the script's own words"
        hits = [r for r in records if recipe_matches(entry["match"], r)]
        assert hits, f"no shipped row matches {entry['match']}"


def test_recipe_keys_are_scenario_keys(rows):
    """Each `set` is valid on a real row's scenario (pydantic rejects an unknown key or a bad value)."""
    records = rows.to_dict("records")
    for entry in serve_recipes():
        row = next(r for r in records if recipe_matches(entry["match"], r))
        sc, reason = row_scenario(row)
        if sc is None:
            continue
        scenario_mod.from_dict(sc)
        for key, value in {**(entry.get("set") or {}), **(entry.get("inferred") or {})}.items():
            section, field = key.split(".", 1)
            if key == "engine.max_num_seqs" and value == "concurrency":   # --max-num-seqs $CONC
                value = sc["traffic"]["arrival"]["concurrency"]
            assert sc[section][field] == value


def test_inferencex_llama_70b_ran_an_fp8_kv_cache_and_mi300x_a_131k_token_budget(rows):
    """70b_fp8_mi300x_docker.sh passes --kv-cache-dtype=fp8 --max-num-batched-tokens=131072; the H100
    config.yaml kv-cache-dtype: fp8 and 8192 batched tokens (vLLM's default)."""
    sel = rows[(rows.source_id == "inferencex_api_snapshot_2026-05-09") & rows.model.str.startswith("Llama-3.3-70B")]
    mi = row_scenario(sel[sel.gpu == "MI300X"].iloc[0].to_dict())[0]
    h100 = row_scenario(sel[sel.gpu == "H100"].iloc[0].to_dict())[0]
    assert mi["deployment"]["kv_cache_dtype"] == "fp8" and mi["engine"]["max_num_batched_tokens"] == 131072
    # the script exports VLLM_ROCM_QUICK_REDUCE_QUANTIZATION=INT4; the H100 one has no such thing
    assert mi["engine"]["quick_reduce_quantization"] == "int4"
    assert scenario_mod.from_dict(h100).engine.quick_reduce_quantization == "none"
    entry = next(e for e in serve_recipes() if e["match"].get("gpu") == "H100"
                 and e["match"].get("model", "").startswith("Llama-3.3-70B"))
    assert entry["set"]["deployment.kv_cache_dtype"] == "fp8"            # the script's config.yaml
    assert scenario_mod.from_dict(h100).engine.max_num_batched_tokens == 8192
    # an fp8 KV cache holds one byte per value (vLLM --kv-cache-dtype fp8): half of bf16's
    name = mi["deployment"]["model"]
    assert (load_model(name, kv_dtype="fp8").kv_bytes_per_token
            == pytest.approx(load_model(name, kv_dtype="bf16").kv_bytes_per_token / 2))


def test_rows_outside_the_recipes_keep_the_defaults(rows):
    """gpt-oss-120b on MI300X (v0.17.0): the script passes no KV dtype; the MI355X MiniMax rows of
    v0.18.0 run the default, those of v0.19.0 (PR #1003) an fp8 KV cache."""
    ox = rows[(rows.gpu == "MI300X") & (rows.model == "gpt-oss-120b")].iloc[0].to_dict()
    assert "deployment.kv_cache_dtype" not in serve_recipe(ox)
    assert "kv_cache_dtype" not in row_scenario(ox)[0]["deployment"]
    mm = rows[(rows.gpu == "MI355X") & (rows.model == "MiniMax-M2.5") & (rows.precision == "fp8")]
    v18 = mm[mm.framework_version == "vllm/vllm-openai-rocm:v0.18.0"].iloc[0].to_dict()
    v19 = mm[mm.framework_version == "vllm/vllm-openai-rocm:v0.19.0"].iloc[0].to_dict()
    assert "deployment.kv_cache_dtype" not in serve_recipe(v18) and serve_recipe(v19)["deployment.kv_cache_dtype"] == "fp8"


def test_a_recipe_turns_async_scheduling_on_for_a_release_that_predates_its_default(rows):
    """gptoss_fp4_h100.sh on vLLM 0.11.2 writes async-scheduling: true; 0.11.2 alone would run it off."""
    old = rows[(rows.gpu == "H100") & (rows.framework_version == "vllm/vllm-openai:v0.11.2")].iloc[0].to_dict()
    sc = row_scenario(old)[0]
    assert sc.get("engine", {}).get("async_scheduling", True) is True


def test_max_num_seqs_conc_is_the_rows_concurrency_and_memory_utilization_the_scripts(rows):
    """benchmarks/single_node/gptoss_fp4_h200.sh at cec542a9a93c, line 53: `--max-num-seqs $CONC`, line 51:
    `--gpu-memory-utilization 0.9`; benchmarks/single_node/gptoss_fp4_mi300x.sh at 626932a110a2, line 56:
    `--gpu-memory-utilization 0.95` and no --max-num-seqs (vLLM's 1024). An open-loop copy of the H200 row
    has no concurrency to stand for, so it keeps the default."""
    num = {c: pd.to_numeric(rows[c], errors="coerce") for c in ("tp", "isl", "concurrency_or_qps")}
    h200 = rows[(rows.gpu == "H200") & (rows.model == "gpt-oss-120b")
                & (rows.framework_version == "vllm/vllm-openai:v0.18.0")
                & (num["tp"] == 2) & (num["isl"] == 8192) & (num["concurrency_or_qps"] == 32)]
    assert len(h200) == 1
    row = h200.iloc[0].to_dict()
    assert serve_recipe(row)["engine.max_num_seqs"] == "concurrency"
    sc = row_scenario(row)[0]
    assert sc["engine"]["max_num_seqs"] == 32 and sc["engine"]["gpu_memory_utilization"] == 0.9
    assert scenario_mod.from_dict(sc).engine.max_num_seqs == 32
    # the same recipe on an open loop: --max-num-seqs $CONC has no concurrency, the key stays out
    poisson = {**row, "load_type": "poisson", "concurrency_or_qps": "2.0"}
    open_sc = row_scenario(poisson)[0]
    assert "max_num_seqs" not in open_sc.get("engine", {})
    assert scenario_mod.from_dict(open_sc).engine.max_num_seqs == 1024
    mi = rows[(rows.gpu == "MI300X") & (rows.model == "gpt-oss-120b")
              & (rows.framework_version == "vllm/vllm-openai-rocm:v0.17.0") & (rows.date == "2026-04-21")]
    sc = scenario_mod.from_dict(row_scenario(mi.iloc[0].to_dict())[0])
    assert sc.engine.gpu_memory_utilization == 0.95 and sc.engine.max_num_seqs == 1024


def test_a_closed_loop_that_lost_its_requests_is_not_modelled(rows):
    """Little's law, L = lambda W: a closed loop of C users has C requests in flight, so rate x E2E is
    C (the shipped rows: median 0.98 C). Six H100 gpt-oss-120b rows at concurrency 512 hold 21-84 (TTFT
    20-120 s at TPOT 5 ms): their requests failed or timed out. Every other shipped closed loop passes."""
    from capacity.measurements.row_scenario import LITTLE_VIOLATED, little_in_flight
    closed = rows[rows.load_type.astype(str).str.contains("closed")]
    lost = [r for r in closed.to_dict(orient="records") if row_scenario(r)[1] == LITTLE_VIOLATED]
    assert len(lost) == 6 and {(r["gpu"], r["model"], int(float(r["concurrency_or_qps"]))) for r in lost} == {
        ("H100", "gpt-oss-120b", 512)}
    # one by hand: 2 x 343.06 tok/s per GPU over 0.9 x 1024 output tokens, x 29.2 s E2E = 21.7 in flight
    r = next(r for r in lost if float(r["tp"]) == 2 and float(r["osl"]) == 1024 and float(r["isl"]) == 1024)
    assert little_in_flight(r, 0.9 * 1024) == pytest.approx(2 * 343.0583 / (0.9 * 1024) * 29.2011897, rel=1e-3)


def test_expert_parallel_rows_keep_littles_law_with_the_gpus_that_served_them(rows):
    """InferenceX's expert-parallel rows state num_gpus = tp x ep and an output_tok_s_total of per-GPU x
    that, though EP runs over the tp GPUs (row_scenario's replicas rule). With the tp GPUs every such
    closed loop holds about its concurrency in flight; with tp x ep it would hold 4-8x it."""
    from capacity.measurements.row_scenario import little_in_flight
    num = {c: pd.to_numeric(rows[c], errors="coerce") for c in ("num_gpus", "tp", "ep", "osl", "concurrency_or_qps")}
    ep_rows = rows[rows.load_type.astype(str).str.contains("closed") & (num["ep"].fillna(1) > 1)
                   & (num["num_gpus"] == num["tp"] * num["ep"])]
    assert len(ep_rows) > 100
    ratios = [little_in_flight(r, 0.9 * float(r["osl"]), float(r["tp"])) / float(r["concurrency_or_qps"])
              for r in ep_rows.to_dict(orient="records")]
    ratios = [x for x in ratios if x == x]
    assert len(ratios) > 100 and all(0.5 < x < 1.2 for x in ratios)
    # one by hand: H100 MiniMax-M2.5 TP4/EP4, 1k/1k, 4 users: 95.3944 tok/s per GPU x 4 GPUs over 0.9 x 1024
    # output tokens x 9.351 s E2E = 3.87 in flight (15.5 with num_gpus 16)
    r = next(r for r in ep_rows.to_dict(orient="records") if r["gpu"] == "H100" and r["model"] == "MiniMax-M2.5"
             and float(r["isl"]) == 1024 and float(r["osl"]) == 1024 and float(r["concurrency_or_qps"]) == 4)
    assert little_in_flight(r, 0.9 * 1024, 4.0) == pytest.approx(4 * 95.3944 / (0.9 * 1024) * 9.3509562, rel=1e-4)


def test_mi355x_quark_mxfp4_series_run_on_the_matrix_cores_their_activations_name(rows):
    """amd/Kimi-K2.5-MXFP4 and amd/MiniMax-M2.5-MXFP4 quantize the experts' activations to MXFP4 too, which vLLM's
    Quark MoE method runs natively on gfx950 with AITER (quark_moe.py QuarkOCP_MX_MoEMethod; both scripts export
    VLLM_ROCM_USE_AITER=1): FP4 matrix cores. amd/gpt-oss-120b-w-mxfp4-a-fp8 has static FP8 activations
    (QuarkOCP_MX_MoEMethod_OSS, mxfp4_w4a8): FP8. The int4 Kimi series and the 2025 gpt-oss series
    (openai/gpt-oss-120b) stay weight-only: bf16."""
    from capacity.inputs.hardware import load_gpu
    mi355x = load_gpu("MI355X")
    sel = rows[(rows.source_id == "inferencex_api_snapshot_2026-05-09") & (rows.gpu == "MI355X")]

    def expert_compute(model, precision, version=None):
        row = sel[(sel.model == model) & (sel.precision == precision)]
        if version is not None:
            row = row[row.framework_version.fillna("") == version]
        sc = row_scenario(row.iloc[0].to_dict())[0]
        m = load_model(sc["deployment"]["model"], weight_precision=sc["deployment"].get("precision"))
        return mi355x.compute_dtype(m.compute_weight_dtype)

    assert expert_compute("Kimi-K2.5", "fp4") == "fp4"
    assert expert_compute("MiniMax-M2.5", "fp4") == "fp4"
    assert expert_compute("gpt-oss-120b", "fp4", "vllm/vllm-openai-rocm:v0.17.0") == "fp8"
    assert expert_compute("gpt-oss-120b", "fp4", "") == "bf16"
    assert expert_compute("Kimi-K2.5", "int4") == "bf16"


def test_h100_llama_rows_queue_as_a_bf16_kv_cache_does_and_h200s_as_fp8(rows):
    """The `inferred` KV dtype of the H100 Llama-3.3-70B series rests on capacity, not on a fit: at TP2,
    8k/1k and 64 users the measured requests decoding at once (Little's law) match what a bf16 cache of
    the simulator's size holds, not an fp8 one; H200's TP1 rows of the same script, image and checkpoint
    match fp8 (the control). The capacities come from the simulator's memory model (deploy), the
    in-flight counts from the measured rates."""
    from capacity.fidelity.common import decoding_at_once
    from capacity.inputs.scenario import from_dict
    from capacity.sim.simulate import deploy

    def _decoding_at_once(row) -> float:
        return decoding_at_once(row, float(row["tp"]))

    sel = rows[(rows.source_id == "inferencex_api_snapshot_2026-05-09") & rows.model.str.startswith("Llama-3.3-70B")
               & (pd.to_numeric(rows.isl) == 8192) & (pd.to_numeric(rows.osl) == 1024)
               & (pd.to_numeric(rows.concurrency_or_qps, errors="coerce") == 64)]

    def holds(row, kv_dtype) -> float:
        sc = row_scenario(row)[0]
        sc["deployment"]["kv_cache_dtype"] = kv_dtype
        return deploy(from_dict(sc)).memory["kv_cache_tokens"] / (8192 + 1024 / 2)

    tp = pd.to_numeric(sel.tp)
    h100 = sel[(sel.gpu == "H100") & (tp == 2)].iloc[0].to_dict()
    assert holds(h100, "bf16") == pytest.approx(_decoding_at_once(h100), rel=0.15)      # 27.1 vs 27.9
    assert _decoding_at_once(h100) < 0.6 * holds(h100, "fp8")                          # 54
    h200 = sel[(sel.gpu == "H200") & (tp == 1)].iloc[0].to_dict()
    assert holds(h200, "fp8") == pytest.approx(_decoding_at_once(h200), rel=0.15)      # 42.8 vs 45.4
    assert _decoding_at_once(h200) > 1.6 * holds(h200, "bf16")
    assert row_scenario(h100)[0]["deployment"]["kv_cache_dtype"] == "bf16"
    assert row_scenario(h200)[0]["deployment"]["kv_cache_dtype"] == "fp8"


def test_h100_gpt_oss_rows_at_512_users_run_as_a_64_request_cap_does(rows):
    """The `inferred` max_num_seqs of H100's gpt-oss-120b v0.11.2 series rests on capacity, not on a fit: the
    measured requests decoding at once (Little's law on the decode phase) are 62-64 at TP2 and TP4 and at both
    prompt lengths, of 512 users, although TP4's simulated KV cache holds more than twice TP2's; a memory limit
    would scale with it, a cap on requests does not. Each count is within 3 % of 64 and under a third of what
    the cache holds; the rows then run with the cap (the script's --max-num-seqs $CONC is overridden)."""
    from capacity.fidelity.common import decoding_at_once, kv_holds_requests

    num = {c: pd.to_numeric(rows[c], errors="coerce") for c in ("tp", "isl", "osl", "concurrency_or_qps")}
    sel = rows[(rows.gpu == "H100") & (rows.model == "gpt-oss-120b") & (num["concurrency_or_qps"] == 512)
               & rows.framework_version.astype(str).str.endswith("v0.11.2")]
    held = {}
    for row in sel.to_dict("records"):
        sc = row_scenario(row)[0]
        if sc is None:          # TP8 and TP4 8k/1k: requests lost (Little's-law check)
            continue
        decoding = decoding_at_once(row, float(row["tp"]))
        holds = kv_holds_requests(sc, float(row["isl"]) + float(row["osl"]) / 2)
        assert decoding == pytest.approx(64, rel=0.03) and decoding < holds / 3
        assert sc["engine"]["max_num_seqs"] == 64
        held[(int(float(row["tp"])), int(float(row["isl"])))] = holds
    assert set(held) == {(2, 1024), (4, 1024), (2, 8192)}
    assert held[(4, 1024)] > 2 * held[(2, 1024)]


def test_a_load_short_of_what_the_kv_cache_allows_is_flagged(rows):
    """`common.in_flight_ratio` (what `capacity calibrate` warns about): H100's gpt-oss-120b rows at 512 users
    decode about 63 requests at once at every TP size, far under both their users and the cache at the
    script's --max-num-seqs 512, and at 0.99 of the 64-request cap inferred for them; H100's Llama row at
    8k / 1k and 64 users is flagged at its script's fp8 cache and passes at the bf16 one it behaves as (27.9
    decoding, 27.1 held)."""
    from capacity.fidelity.common import IN_FLIGHT_SHORTFALL, in_flight_ratio

    num = {c: pd.to_numeric(rows[c], errors="coerce") for c in ("isl", "osl", "tp", "concurrency_or_qps")}
    gpt = rows[(rows.gpu == "H100") & (rows.model == "gpt-oss-120b") & (num["concurrency_or_qps"] == 512)
               & (num["tp"] == 4) & (num["osl"] == 8192)].iloc[0].to_dict()
    sc = row_scenario(gpt)[0]
    assert in_flight_ratio(gpt, sc, 512, 4, 1024, 8192) > IN_FLIGHT_SHORTFALL
    sc["engine"]["max_num_seqs"] = 512
    assert in_flight_ratio(gpt, sc, 512, 4, 1024, 8192) < 0.2
    llama = rows[(rows.gpu == "H100") & rows.model.str.startswith("Llama-3.3-70B") & (num["tp"] == 2)
                 & (num["isl"] == 8192) & (num["concurrency_or_qps"] == 64)].iloc[0].to_dict()
    sc = row_scenario(llama)[0]
    assert in_flight_ratio(llama, sc, 64, 2, 8192, 1024) > IN_FLIGHT_SHORTFALL
    sc["deployment"]["kv_cache_dtype"] = "fp8"
    assert in_flight_ratio(llama, sc, 64, 2, 8192, 1024) < 0.6


def test_series_whose_script_turns_on_aiter_run_its_fused_moe_and_the_others_vllms_triton_one(rows):
    """VLLM_ROCM_USE_AITER=1 (or the AITER a16w4 fused-MoE variable) in a series' script puts its experts on AITER's
    fused MoE (engine.moe_backend: aiter); MiniMax-M2.5 FP8 8k/1k at TP8/EP8 on 2026-05-06 turned AITER's MoE off
    (VLLM_ROCM_USE_AITER_MOE=0, minimaxm2.5_fp8_mi355x.sh:49); MI300X's 2025-11-02 gpt-oss script sets no AITER
    variable (gptoss_fp4_mi300x_slurm.sh:33-35 set only attention and GEMM ones); no NVIDIA row names one."""
    def backends(**match):
        sel = rows[(rows.source_id == "inferencex_api_snapshot_2026-05-09")]
        for k, v in match.items():
            sel = sel[sel[k].astype(str).str.startswith(str(v))] if isinstance(v, str) else sel[sel[k] == v]
        return {row_scenario(r)[0]["engine"].get("moe_backend", "auto") for r in sel.to_dict("records")
                if row_scenario(r)[0] is not None}

    assert backends(gpu="MI355X", model="Kimi-K2.5", precision="fp4") == {"aiter"}
    assert backends(gpu="MI355X", model="MiniMax-M2.5", precision="fp4") == {"aiter"}
    assert backends(gpu="MI300X", model="MiniMax-M2.5", precision="fp8") == {"aiter"}
    assert backends(gpu="MI355X", model="MiniMax-M2.5", framework_version="vllm/vllm-openai-rocm:v0.19.0",
                    isl="8192", tp="8") == {"auto"}
    assert backends(gpu="MI355X", model="MiniMax-M2.5", framework_version="vllm/vllm-openai-rocm:v0.19.0",
                    isl="8192", tp="4") == {"aiter"}
    assert backends(gpu="MI300X", model="gpt-oss-120b", date="2025-11-02") == {"auto"}
    assert backends(gpu="H200") == {"auto"}


def test_seed_targets_run_aiters_fused_moe_where_their_command_sets_aiter_and_aiter_has_their_experts():
    """The seed article's commands (seed_serve_flags.yaml) set VLLM_ROCM_USE_AITER=1 for Qwen3.6-35B-A3B, Kimi-K2.5
    and MiniMax-M3-MXFP8; Kimi-K2.5's int4 W4A16 experts run vLLM's Triton int4 kernel on ROCm all the same
    (CompressedTensorsWNA16MoEMethod), and the others' commands set no AITER variable."""
    from capacity.measurements.clients import moe_backend
    assert moe_backend({"target": "Qwen/Qwen3.6-35B-A3B"}) == "aiter"
    assert moe_backend({"target": "MiniMaxAI/MiniMax-M3-MXFP8"}) == "aiter"
    assert moe_backend({"target": "moonshotai/Kimi-K2.5"}) == "auto"
    assert moe_backend({"target": "google/gemma-4-26B-A4B-it"}) == "auto"


def _minimax_mi355x_async(isl: int, tp: int, conc: int) -> bool:
    """Async scheduling as benchmarks/single_node/minimaxm2.5_fp8_mi355x.sh at 44a04843b1c0 sets it (lines 33-60, its
    branches transcribed): --no-async-scheduling at 1k/1k TP8/EP8 and CONC <= 128, at 8k/1k TP8/EP8 and CONC <= 64."""
    if isl == 1024:
        return not (tp == 8 or conc <= 128)
    if isl == 8192:
        return not (tp == 8 or conc <= 64)
    return True


def test_minimax_mi355x_v019_runs_async_where_its_script_does(rows):
    """Each MI355X MiniMax-M2.5 FP8 row of vLLM v0.19.0 is simulated with async scheduling on or off as its script's
    branches say; the v0.18.0 series (whose script passes no such flag) keeps vLLM's default, on."""
    num = lambda r, c: int(float(r[c]))
    mm = rows[(rows.gpu == "MI355X") & (rows.model == "MiniMax-M2.5") & (rows.precision == "fp8")]
    v19 = mm[mm.framework_version == "vllm/vllm-openai-rocm:v0.19.0"].to_dict("records")
    assert len(v19) >= 30
    states = set()
    for r in v19:
        want = _minimax_mi355x_async(num(r, "isl"), num(r, "tp"), num(r, "concurrency_or_qps"))
        got = row_scenario(r)[0].get("engine", {}).get("async_scheduling", True)
        assert got is want, (r["isl"], r["tp"], r["concurrency_or_qps"])
        states.add(want)
    assert states == {True, False}
    for r in mm[mm.framework_version == "vllm/vllm-openai-rocm:v0.18.0"].to_dict("records"):
        assert row_scenario(r)[0].get("engine", {}).get("async_scheduling", True) is True

