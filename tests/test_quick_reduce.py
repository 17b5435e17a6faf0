"""vLLM's QuickReduce on ROCm (VLLM_ROCM_QUICK_REDUCE_QUANTIZATION): which all-reduces it takes and what
they put on the wire.

Independent truth: vLLM v0.18.0 quick_all_reduce.py L47-58 (world sizes 2, 4, 8; _QR_MIN_SIZE, the fp16 row,
which bf16 uses by default), L85-89 (gfx94/gfx95 only); csrc/quickreduce: always a two-shot
(quick_reduce.h L164-194) and codecs with one fp16 scale per 32 values (quick_reduce_impl.cuh CodecQ4/Q6/Q8);
the InferenceX MI300X Llama-3.3-70B script sets INT4 (serve_recipes.yaml). docs/rocm_allreduce_paths.md."""

from __future__ import annotations

import pytest

from capacity.cost.step_cost import (StepCostModel, allreduce_traffic, quick_reduce_rule)
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.sim import simulate


# these tests are of the latency-plus-bytes form on MI300X (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("latency_plus_bytes_allreduce")


MIB = 2 ** 20
# vLLM quick_all_reduce.py _QR_MIN_SIZE[(torch.float16, world_size)] = [FP, INT8, INT6, INT4] in MiB
VLLM_FP16_MIN_MIB = {2: [1, 2, 2, 1], 4: [1, 16, 4, 2], 8: [16, 4, 4, 2]}


def _wire_fraction(bits: int) -> float:
    """Bytes per 16-bit byte of a block-quantized codec: `bits` per value plus one fp16 scale per 32 values."""
    return (bits / 8 + 2 / 32) / 2


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_the_minimum_sizes_are_vllms(tp):
    for codec, mib in zip(("fp", "int8", "int6", "int4"), VLLM_FP16_MIN_MIB[tp]):
        floor, _ = quick_reduce_rule("CDNA3 (gfx942)", tp, codec)
        assert floor == mib * MIB


def test_the_wire_bytes_are_the_codecs():
    for codec, bits in (("int8", 8), ("int6", 6), ("int4", 4)):
        assert quick_reduce_rule("CDNA4 (gfx950)", 2, codec)[1] == pytest.approx(_wire_fraction(bits))
    assert quick_reduce_rule("CDNA4 (gfx950)", 2, "fp")[1] == 1.0


def test_vllm_uses_it_only_where_it_exists():
    assert quick_reduce_rule("CDNA3 (gfx942)", 2, "none") is None           # the default: off
    assert quick_reduce_rule("Hopper (GH100, SXM5)", 2, "int4") is None     # not a gfx94/gfx95 GPU
    assert quick_reduce_rule("CDNA3 (gfx942)", 1, "int4") is None           # no all-reduce
    assert quick_reduce_rule("CDNA3 (gfx942)", 6, "int4") is None           # world sizes 2, 4, 8 only


def _allreduce_s(gpu: str, tp: int, tokens: int, quantization: str) -> float:
    cost = StepCostModel(load_gpu(gpu), load_model("Llama-3.3-70B-Instruct"), tp,
                         quick_reduce_quantization=quantization)
    return cost.time_parts(cost.features([tokens], [tokens]))["allreduce"]


def test_a_message_from_its_floor_travels_as_int4():
    """Llama-3.3-70B's all-reduce carries hidden 8192 x 2 bytes per token: 64 tokens make 1 MiB, TP2's int4
    floor. At it the bytes term shrinks to 0.28 of the plain two-shot's; one token fewer, nothing changes."""
    gpu = load_gpu("MI300X")
    model = load_model("Llama-3.3-70B-Instruct")
    assert 64 * model.hidden_size * 2 == MIB
    latency = 2 * model.num_layers * gpu.scaleup_latency_us * 1e-6
    assert _allreduce_s("MI300X", 2, 63, "int4") == pytest.approx(_allreduce_s("MI300X", 2, 63, "none"))
    plain, quick = _allreduce_s("MI300X", 2, 64, "none"), _allreduce_s("MI300X", 2, 64, "int4")
    assert (quick - latency) / (plain - latency) == pytest.approx(_wire_fraction(4))
    # TP4's floor is 2 MiB: 128 tokens
    assert _allreduce_s("MI300X", 4, 127, "int4") == pytest.approx(_allreduce_s("MI300X", 4, 127, "none"))
    assert _allreduce_s("MI300X", 4, 128, "int4") < _allreduce_s("MI300X", 4, 128, "none")
    # a two-shot moves 2 (tp - 1) / tp of the message, as a ring does
    assert allreduce_traffic(float(MIB), 4, "ring") == pytest.approx(1.5 * MIB)


def test_an_nvidia_gpu_ignores_the_setting():
    assert _allreduce_s("H100", 2, 4096, "int4") == pytest.approx(_allreduce_s("H100", 2, 4096, "none"))


def test_the_setting_shortens_a_prefill_heavy_run_and_only_that():
    def run(quantization: str, output: int):
        return simulate.run(scenario_mod.from_dict({
            "name": "qr", "deployment": {"gpu": "MI300X", "model": "Llama-3.3-70B-Instruct", "tensor_parallel_size": 2},
            "engine": {"quick_reduce_quantization": quantization},
            "traffic": {"arrival": {"process": "closed_loop", "concurrency": 1}, "num_requests": 3,
                        "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 4000},
                                     "output_tokens": {"dist": "fixed", "value": output}}]}}, "t")).metrics
    off, on = run("none", 8), run("int4", 8)
    assert on["ttft_ms"]["p50"] < off["ttft_ms"]["p50"]            # 4,000-token prefill: 62.5 MiB messages
    # one user's decode step sends 16 KiB: below every floor
    assert on["tpot_ms"]["p50"] == pytest.approx(off["tpot_ms"]["p50"], rel=1e-9)
