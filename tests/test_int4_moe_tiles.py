"""vLLM's tuned tiles for its Triton int4 (W4A16) MoE kernel on ROCm, and the default tiles a shape without them runs.

Independent truth: vLLM's lookup (vllm/model_executor/layers/fused_moe/fused_moe.py `get_config_file_name` and
`try_get_optimal_moe_config`): the file is `E={E},N={N},device_name={device},dtype=int4_w4a16.json` with E the
experts on this GPU (w2's first dimension) and N the expert width on this GPU (w2's last, doubled back from int4
packing); without it, `get_default_config`. The slowdown is vLLM PR #35093's measurement ("~5-7x perf increase when
running MoE in isolation", Kimi-K2.5's shapes on CDNA4). Kimi-K2.5's shape is its verbatim HF config's
(n_routed_experts 384, moe_intermediate_size 2048)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from capacity.cost import step_cost
from capacity.cost.step_cost import StepCostModel
from capacity.inputs.hardware import INT4_MOE_CONFIGS_FILE, int4_tile_table, load_gpu
from capacity.inputs.models import load_model
from capacity.paths import data_dir

KIMI = "moonshotai/Kimi-K2.5"


def test_each_tuned_entry_names_the_file_vllm_looks_up():
    entries = yaml.safe_load((data_dir() / INT4_MOE_CONFIGS_FILE).read_text())["tuned"]
    assert entries
    for t in entries:
        device = "AMD_Instinct_" + t["gpu"]
        assert t["file"] == f"E={t['experts']},N={t['expert_width']},device_name={device},dtype=int4_w4a16.json"


def test_the_slowdown_is_inside_the_range_vllm_measured():
    assert 5.0 <= int4_tile_table().default_tiles_slowdown <= 7.0


@pytest.mark.parametrize("gpu, tp, expert_parallel, tuned", [
    ("MI355X", 8, False, True),     # E=384, N=2048/8=256: PR #35093's file
    ("MI350X", 8, False, True),     # its MI350X sibling file
    ("MI355X", 4, False, False),    # N=512: no file (PR #38536 closed unmerged)
    ("MI355X", 8, True, False),     # expert parallelism: E=48 whole experts, N=2048
    ("MI300X", 8, False, False),    # no int4_w4a16 file for CDNA3
    ("MI325X", 8, False, False),
])
def test_the_shape_on_one_gpu_picks_the_file(gpu, tp, expert_parallel, tuned):
    cost = StepCostModel(load_gpu(gpu), load_model(KIMI), tp, expert_parallel=expert_parallel)
    assert cost.int4_default_tiles is not tuned


@pytest.mark.parametrize("gpu", ["H100", "H200", "B200"])
def test_cuda_runs_int4_experts_in_marlin_which_the_files_do_not_configure(gpu):
    assert not StepCostModel(load_gpu(gpu), load_model(KIMI), 8).int4_default_tiles


def _decode_moe_s(gpu_name: str, tp: int, monkeypatch, default_tiles: bool) -> float:
    monkeypatch.setattr(step_cost, "INT4_DEFAULT_TILES", default_tiles)
    gpu = load_gpu(gpu_name)
    cost = StepCostModel(gpu, load_model(KIMI), tp)
    f = cost.features(np.ones(16), np.full(16, 1024))
    # `moe` 1: the FLOPs side never binds, and no time per routed token: the step's expert time is the weight stream's
    eff = {**gpu.efficiency, "moe": 1.0, "moe_token_overhead_ns": 0.0, "aiter_moe_token_overhead_ns": 0.0}
    return float(cost.time_parts(f, eff)["moe_gemm"])


@pytest.mark.parametrize("gpu, tp", [("MI300X", 8), ("MI355X", 4)])
def test_default_tiles_stream_the_experts_that_many_times_slower(gpu, tp, monkeypatch):
    slow = _decode_moe_s(gpu, tp, monkeypatch, True)
    fast = _decode_moe_s(gpu, tp, monkeypatch, False)
    assert slow / fast == pytest.approx(int4_tile_table().default_tiles_slowdown, rel=1e-9)


def test_a_tuned_shape_is_priced_at_moe_int4_itself(monkeypatch):
    assert _decode_moe_s("MI355X", 8, monkeypatch, True) == _decode_moe_s("MI355X", 8, monkeypatch, False)


def test_cdna3_and_cdna4_fit_one_tuned_rate():
    """MI300X's rows ran the default tiles and MI355X's the tuned ones; with the slowdown applied, the two fits' tuned
    rates (fractions of each GPU's expert stream bandwidth) agree within the measured range's spread (5-7x: +-17 %),
    where as two separate knobs they differed 5.7x."""
    ratio = load_gpu("MI300X").efficiency["moe_int4"] / load_gpu("MI355X").efficiency["moe_int4"]
    assert 5.0 / 6.0 <= ratio <= 7.0 / 6.0


@pytest.mark.parametrize("gpu, tp, says", [("MI300X", 8, True), ("MI355X", 4, True), ("MI355X", 8, False),
                                           ("H200", 8, False)])
def test_the_plan_says_where_it_priced_the_default_tiles(gpu, tp, says):
    from capacity.studies.plan import int4_tiles_note

    note = int4_tiles_note(load_gpu(gpu), load_model(KIMI), tp, expert_parallel=False)
    assert (note is not None) is says
    if says:
        assert f"on {gpu} at TP{tp}" in note and "default tiles" in note
    assert int4_tiles_note(load_gpu(gpu), load_model("openai/gpt-oss-120b"), tp, expert_parallel=False) is None


@pytest.mark.parametrize("tiles, gpu, tp, default", [("tuned", "MI300X", 8, False), ("default", "MI355X", 8, True),
                                                      ("auto", "MI355X", 8, False), ("tuned", "H200", 8, False),
                                                      ("default", "H200", 8, False)])
def test_a_scenario_says_which_tiles_its_server_runs(tiles, gpu, tp, default):
    """engine.int4_moe_tiles: 'tuned' for a server given tuned tiles (VLLM_TUNED_CONFIG_FOLDER), 'default' for one
    without; CUDA's Marlin MoE ignores it."""
    assert StepCostModel(load_gpu(gpu), load_model(KIMI), tp, int4_tiles=tiles).int4_default_tiles is default


def test_the_plan_note_is_for_the_shipped_table_only():
    from capacity.studies.plan import int4_tiles_note

    assert int4_tiles_note(load_gpu("MI300X"), load_model(KIMI), 8, False, "tuned") is None
    assert "engine.int4_moe_tiles=tuned" in int4_tiles_note(load_gpu("MI300X"), load_model(KIMI), 8, False, "auto")


def test_a_simulated_scenario_prices_the_tiles_it_names():
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate

    def deployed(tiles: str):
        sc = {"name": "tiles", "engine": {"int4_moe_tiles": tiles},
              "deployment": {"gpu": "MI300X", "model": KIMI, "tensor_parallel_size": 8},
              "traffic": {"arrival": {"process": "poisson", "rate_rps": 0.001}, "num_requests": 1,
                          "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 100},
                                       "output_tokens": {"dist": "fixed", "value": 20}}]}}
        return simulate.deploy(scenario_mod.from_dict(sc)).cost

    assert deployed("auto").int4_default_tiles and not deployed("tuned").int4_default_tiles


def test_a_seed_targets_tiles_flag_reaches_its_scenario(monkeypatch):
    """seed_serve_flags.yaml's `int4_moe_tiles` per target becomes the seed scenario's engine.int4_moe_tiles; the
    article's Kimi-K2.5 command names no tuned-config folder, so its target runs vLLM's shipped files ('auto')."""
    from capacity.fidelity import speedups
    from capacity.measurements import clients

    row = {"target": KIMI, "gpu": "MI300X", "tp": "4", "precision": "int4 (checkpoint native)",
           "max_num_batched_tokens": "", "max_model_len": ""}
    dep = speedups.Deployment.from_row(row)
    assert dep.int4_moe_tiles == "auto"
    assert "int4_moe_tiles" not in speedups.scenario_dict(dep, 8)["engine"]
    monkeypatch.setattr(clients, "_serve_flags", lambda: {KIMI: {"int4_moe_tiles": "tuned"}})
    dep = speedups.Deployment.from_row(row)
    assert speedups.scenario_dict(dep, 8)["engine"]["int4_moe_tiles"] == "tuned"


@pytest.mark.parametrize("users", [16, 32, 64])
def test_the_whole_decode_step_gains_what_vllm_measured_end_to_end(users):
    """vLLM PR #35093 measured Kimi-K2.5 end to end on MI355X at TP8 (max_concurrency 4-128): "~3x-4x lower Mean TPOT"
    with the tuned tiles. The priced decode step (the experts' stream plus everything the tiles do not change) must
    gain about that much at mid load; 2.5-4.5x allowed for "~"."""
    gpu, model = load_gpu("MI355X"), load_model(KIMI)
    step = (np.ones(users), np.full(users, 1100.0))
    slow = StepCostModel(gpu, model, 8, int4_tiles="default").step_time_s(*step)
    fast = StepCostModel(gpu, model, 8, int4_tiles="tuned").step_time_s(*step)
    assert 2.5 <= slow / fast <= 4.5


def test_a_simulated_benchmark_gains_what_vllm_measured_end_to_end():
    """PR #35093's end-to-end check, simulated: Kimi-K2.5 INT4 on MI355X at TP8 under `vllm bench serve`'s default random
    lengths (1,024 in, 128 out) at max_concurrency 16, tuned tiles against default: "~2x lower Mean TTFT and ~3x-4x lower
    Mean TPOT" (1.5-3x and 2.5-4.5x allowed for "~")."""
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate

    def means(tiles: str) -> tuple[float, float]:
        sc = {"name": "pr35093", "engine": {"int4_moe_tiles": tiles},
              "deployment": {"gpu": "MI355X", "model": KIMI, "tensor_parallel_size": 8},
              "traffic": {"arrival": {"process": "closed_loop", "concurrency": 16}, "num_requests": 128,
                          "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 1024},
                                       "output_tokens": {"dist": "fixed", "value": 128}}]}}
        q = simulate.run(scenario_mod.from_dict(sc)).requests
        return float((q.first_token_s - q.arrival_s).mean()), float(((q.finish_s - q.first_token_s) / 127).mean())

    (ttft_d, tpot_d), (ttft_t, tpot_t) = means("default"), means("tuned")
    assert 1.5 <= ttft_d / ttft_t <= 3.0
    assert 2.5 <= tpot_d / tpot_t <= 4.5
