"""Steps too large for vLLM's captured CUDA/HIP graphs: the capture size rule and the host time per kernel.

Independent truth: vLLM's own rule (vllm/config/vllm.py `_set_cudagraph_sizes`, vLLM >= 0.13, PR #30330):
    decode_query_len = 1 + num_speculative_tokens
    max_cudagraph_capture_size = min(max_num_seqs * decode_query_len * 2, 512)
    then min(max_num_tokens, max_cudagraph_capture_size)
and its dispatcher (vllm/v1/cudagraph_dispatcher.py): `num_tokens > self.max_capture_size` -> no graph. The kernel
count per forward pass is the one tests/test_layer_kernels.py checks against vLLM's decoder layers."""

from __future__ import annotations

import pytest

from capacity.cost.step_cost import StepCostModel, cudagraph_max_tokens, layer_overhead_units
from capacity.errors import CapacityError
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

EAGER_US = 50.0


@pytest.mark.parametrize("max_num_seqs, n_spec, max_batched, expected", [
    (4, 0, 8192, 8),          # InferenceX's --max-num-seqs $CONC at 4 users: 4 * 1 * 2
    (64, 0, 8192, 128),
    (256, 0, 8192, 512),      # 512 cap
    (1024, 0, 8192, 512),     # vLLM's default max_num_seqs on a >= 70 GiB GPU
    (32, 3, 8192, 256),       # speculative: 32 * (1 + 3) * 2
    (64, 3, 8192, 512),
    (1024, 0, 256, 256),      # never more than a step can schedule
])
def test_capture_size_is_vllms_rule(max_num_seqs, n_spec, max_batched, expected):
    assert cudagraph_max_tokens(max_num_seqs, n_spec, max_batched) == expected


@pytest.mark.parametrize("max_num_seqs, n_spec, max_batched, server_size, expected", [
    (1024, 0, 8192, 8192, 8192),   # compilation-config cudagraph_capture_sizes up to 8192 (InferenceX gpt-oss, MI355X 2025)
    (4, 0, 8192, 2048, 2048),      # --max-cudagraph-capture-size 2048 replaces min(2 * max_num_seqs, 512)
    (32, 3, 8192, 64, 64),         # ... below the default as well
    (1024, 0, 4096, 8192, 4096),   # and is still at most max_num_batched_tokens
])
def test_the_servers_capture_size_replaces_the_default(max_num_seqs, n_spec, max_batched, server_size, expected):
    """vllm/config/vllm.py `_set_cudagraph_sizes`: the default rule applies only when max_cudagraph_capture_size is
    None; a given size (or the largest of cudagraph_capture_sizes) is used, then clipped to max_num_batched_tokens."""
    assert cudagraph_max_tokens(max_num_seqs, n_spec, max_batched, server_size) == expected


def _eager_gpu(name: str = "MI300X", eager_us: float = EAGER_US):
    return load_gpu(name).with_overrides(efficiency={"eager_kernel_us": eager_us})


@pytest.mark.parametrize("model", ["gpt-oss-120b", "MiniMax-M2.5", "Llama-3.3-70B-Instruct"])
@pytest.mark.parametrize("tp", [1, 4])
def test_a_step_above_the_capture_size_pays_each_kernels_launch(model, tp):
    gpu, m = _eager_gpu(), load_model(model, weight_precision="fp8" if model.startswith("Llama") else None)
    plain = StepCostModel(_eager_gpu(eager_us=0.0), m, tp, graph_max_tokens=8)
    eager = StepCostModel(gpu, m, tp, graph_max_tokens=8)
    kernels = layer_overhead_units(m, gpu.kernels_per_dense_layer) * gpu.kernels_per_dense_layer
    prefill = ([1024, 1, 1, 1], [1024, 300, 400, 500])      # 1027 tokens > 8: no graph
    extra = eager.step_time_s(*prefill) - plain.step_time_s(*prefill)
    # in series with the GPU time and not divided by TP (async scheduling on: host time hidden only up to the GPU's)
    assert extra == pytest.approx(EAGER_US * 1e-6 * kernels, rel=1e-9)
    decode = ([1] * 8, [1000] * 8)                          # 8 tokens: a replayed graph
    assert eager.step_time_s(*decode) == pytest.approx(plain.step_time_s(*decode), rel=1e-12)


def test_without_a_capture_size_every_step_is_graphed():
    m = load_model("gpt-oss-120b")
    eager, plain = StepCostModel(_eager_gpu(), m, 2), StepCostModel(_eager_gpu(eager_us=0.0), m, 2)
    assert eager.step_time_s([4096], [4096]) == pytest.approx(plain.step_time_s([4096], [4096]), rel=1e-12)


def test_a_profile_without_a_kernel_count_is_refused_in_one_line():
    gpu = load_gpu("H100").with_overrides(efficiency={"eager_kernel_us": EAGER_US})
    with pytest.raises(CapacityError, match="kernels_per_dense_layer") as err:
        StepCostModel(gpu, load_model("gpt-oss-120b"), 1, graph_max_tokens=8)
    assert "\n" not in str(err.value)
    # and where the value comes per call (a fit's trial values), at pricing
    cost = StepCostModel(load_gpu("H100"), load_model("gpt-oss-120b"), 1, graph_max_tokens=8)
    with pytest.raises(CapacityError, match="kernels_per_dense_layer"):
        cost.time_parts(cost.features([1024], [1024]), dict(cost.efficiency, eager_kernel_us=EAGER_US))


@pytest.mark.parametrize("max_num_seqs, capture_size, prompt, eager_step", [
    (1, None, 1024, True), (1024, None, 400, False), (1, 2048, 1024, False), (1024, 256, 400, True)])
def test_the_simulation_charges_a_lone_prompt_step_by_the_engines_capture_size(max_num_seqs, capture_size, prompt,
                                                                               eager_step):
    """A lone request's TTFT is its request delay plus one prefill step (tests/test_prompt_token_delay.py); with
    `engine.max_num_seqs` 1 vLLM captures graphs of up to 2 tokens, so a 1,024-token prompt step runs without one and
    pays its kernels' launches; with 1,024 the largest graph is 512 tokens and a 400-token prompt replays it. A
    server started with --max-cudagraph-capture-size 2048 replays the 1,024-token step whatever max_num_seqs is, and
    one started with 256 launches a 400-token step's kernels from the host."""
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate
    ttft = {}
    for eager_us in (0.0, EAGER_US):
        engine = {"max_num_seqs": max_num_seqs}
        if capture_size is not None:
            engine["max_cudagraph_capture_size"] = capture_size
        sc = {"name": "eager", "engine": engine,
              "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1,
                             "gpu_overrides": {"efficiency": {"eager_kernel_us": eager_us}}},
              "traffic": {"arrival": {"process": "poisson", "rate_rps": 0.001}, "num_requests": 1,
                          "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": prompt},
                                       "output_tokens": {"dist": "fixed", "value": 20}}]}}
        res = simulate.run(scenario_mod.from_dict(sc))
        r = res.requests.iloc[0]
        ttft[eager_us] = r.first_token_s - r.arrival_s
    gpu, m = load_gpu("MI300X"), load_model("meta-llama/Llama-3.1-8B")
    launches = EAGER_US * 1e-6 * layer_overhead_units(m, gpu.kernels_per_dense_layer) * gpu.kernels_per_dense_layer
    assert ttft[EAGER_US] - ttft[0.0] == pytest.approx(launches if eager_step else 0.0, rel=1e-9, abs=1e-12)


def test_the_goodput_policy_prices_a_verification_batch_too_large_for_a_graph_as_the_simulation_does():
    """With the engine's limits, the adaptive policy's step estimate charges a verification step above the capture
    size (200 sequences x (1 + 3) tokens = 800 > 512) its launches, and one at or below it (128 x 4 = 512) none."""
    from capacity.spec.decoding import build_speculation
    gpu, target = _eager_gpu(), load_model("google/gemma-4-26B-A4B-it")
    cfg = {"method": "eagle3", "num_speculative_tokens": 3, "policy": {"kind": "goodput", "max_n": 3},
           "acceptance": {"model": "iid", "alpha": 0.7}}
    plain = build_speculation(cfg, gpu, target, 2).policy.step_time_s
    limited = build_speculation(cfg, gpu, target, 2, engine_limits=(1024, 8192)).policy.step_time_s
    launches = EAGER_US * 1e-6 * layer_overhead_units(target, gpu.kernels_per_dense_layer) * gpu.kernels_per_dense_layer
    assert limited(200, 1000.0, 3) - plain(200, 1000.0, 3) == pytest.approx(launches, rel=1e-9)
    assert limited(128, 1000.0, 3) == pytest.approx(plain(128, 1000.0, 3), rel=1e-12)
