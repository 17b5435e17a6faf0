"""All-reduce cost by topology (opt-in: a profile that states its full mesh) and by vLLM's algorithm choice (issue 16, collectives).

Independent truth: the link arithmetic of a full mesh (AMD's 8-GPU Infinity Fabric platforms: 7 links of
64 GB/s per GPU, one per peer; SemiAnalysis InferenceX gpu-specs.md) and of a switched fabric, and vLLM's
one-shot / two-shot rule (vllm csrc/custom_all_reduce.cuh, CustomAllreduce::allreduce, REDUCE_CASE;
custom_all_reduce.py max_size 8 MiB). The expected times are written out from those rules here, not
read from the code.
"""

from __future__ import annotations

import pytest

from pathlib import Path

from capacity.cost.step_cost import StepCostModel, allreduce_traffic
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model


# these tests are of the latency-plus-bytes form on MI300X (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("latency_plus_bytes_allreduce")


KIB = 1024
ROOT = Path(__file__).resolve().parents[1]


MESH_LEAF = """scaleup_links_per_gpu:
  value: 7
  unit: links
  basis: vendor spec
  source: https://rocm.blogs.amd.com/software-tools-optimization/mi300x-rccl-xgmi/README.html
"""


def mesh_profile(tmp_path, gpu: str = "MI300X"):
    """The shipped profile with its full mesh stated (the opt-in: AMD's RCCL/xGMI blog, each GPU of the
    8-GPU platform has one xGMI link to each of its seven peers)."""
    text = (ROOT / "hw_profiles" / f"{gpu}.yaml").read_text()
    path = tmp_path / f"{gpu}_mesh.yaml"
    path.write_text(text.replace("\nboard_power_w:", "\n" + MESH_LEAF + "board_power_w:", 1))
    return load_gpu(path)


@pytest.mark.parametrize("gpu", ["MI300X", "MI355X"])
def test_a_full_mesh_gives_a_tp_group_its_links_to_its_peers(tmp_path, gpu):
    g = mesh_profile(tmp_path, gpu)
    link = g.scaleup_bandwidth_gb_s / 7
    assert g.scaleup_links_per_gpu == 7
    # a TP group of t GPUs talks over its t - 1 direct links; the whole platform over all seven
    assert [g.allreduce_bandwidth_gb_s(t) for t in (2, 4, 8)] == pytest.approx([link, 3 * link, 7 * link])


@pytest.mark.parametrize("gpu", ["MI300X", "H100", "H200", "B200"])
def test_without_a_stated_mesh_every_group_gets_the_whole_scaleup_bandwidth(gpu):
    g = load_gpu(gpu)
    assert g.scaleup_links_per_gpu == 0
    assert [g.allreduce_bandwidth_gb_s(t) for t in (2, 4, 8)] == [g.scaleup_bandwidth_gb_s] * 3


def test_vllm_one_shot_and_two_shot_rule():
    # world size 2: one-shot (and a ring moves the same), the whole message over the one link
    assert allreduce_traffic(4096.0 * KIB, 2) == 4096 * KIB
    assert allreduce_traffic(100e6, 2) == 100e6
    # world size 4: one-shot below 512 KiB (each peer's whole message), two-shot from there
    assert allreduce_traffic(511.0 * KIB, 4) == 3 * 511 * KIB
    assert allreduce_traffic(512.0 * KIB, 4) == pytest.approx(1.5 * 512 * KIB)
    # world size 8: one-shot below 256 KiB
    assert allreduce_traffic(255.0 * KIB, 8) == 7 * 255 * KIB
    assert allreduce_traffic(256.0 * KIB, 8) == pytest.approx(1.75 * 256 * KIB)
    # arrays give the same per element
    import numpy as np
    msgs = np.array([255.0 * KIB, 256.0 * KIB, 10e6])
    assert allreduce_traffic(msgs, 8) == pytest.approx([7 * 255 * KIB, 1.75 * 256 * KIB, 1.75 * 10e6])


def test_ring_is_two_shot_for_every_message():
    assert allreduce_traffic(255.0 * KIB, 8, "ring") == pytest.approx(1.75 * 255 * KIB)


def test_shipped_profiles_price_a_ring_at_the_whole_bandwidth():
    """No shipped profile states its mesh (the opt-in did not earn its place, docs/seed_validation.md §18):
    a TP2 prefill all-reduce on MI300X is the ring formula at 448 GB/s, as before."""
    g = load_gpu("MI300X")
    m = load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")
    cost = StepCostModel(g, m, 2)
    message = 8192 * m.hidden_size * 2
    one = g.scaleup_latency_us * 1e-6 + message / (448e9 * cost.efficiency["allreduce"])
    assert cost.time_parts(cost.features([8192], [8192]))["allreduce"] == pytest.approx(2 * m.num_layers * one)


def test_prefill_allreduce_on_a_mi300x_pair_uses_one_link(tmp_path):
    """8,192 prompt tokens of Llama-3.3-70B at TP2 on MI300X: each of the 160 all-reduces moves the whole
    128 MiB message (ring of two) over the single 64 GB/s link between the pair, at the profile's
    all-reduce efficiency, plus its latency."""
    g = mesh_profile(tmp_path)
    m = load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")
    cost = StepCostModel(g, m, 2)
    f = cost.features([8192], [8192])
    eff = cost.efficiency
    message = 8192 * m.hidden_size * 2
    one = g.scaleup_latency_us * 1e-6 + message / (64e9 * eff["allreduce"])
    assert cost.time_parts(f)["allreduce"] == pytest.approx(2 * m.num_layers * one)
    # TP8 on the same platform: two-shot over all seven links
    cost8 = StepCostModel(g, m, 8)
    one8 = g.scaleup_latency_us * 1e-6 + 1.75 * message / (448e9 * eff["allreduce"])
    assert cost8.time_parts(cost8.features([8192], [8192]))["allreduce"] == pytest.approx(2 * m.num_layers * one8)


def test_minimax_m2_all_reduces_its_qk_norm_variance_once_per_layer():
    """MiniMax-M2's per-layer q/k RMSNorm all-reduces the q and k variances (two fp32 per token) across the
    tensor-parallel group in every layer (vllm/model_executor/layers/mamba/linear_attn.py
    MiniMaxText01RMSNormTP.forward_qk): three all-reduces per layer at TP > 1, the third of 8 bytes per token;
    a model without it (Llama) keeps two; at TP1 there are none."""
    g = load_gpu("MI300X")
    m = load_model("MiniMax-M2.5")
    assert m.qk_norm == "per_layer"
    cost = StepCostModel(g, m, 4)
    eff = cost.efficiency
    tokens = 64
    bw = 448e9 * eff["allreduce"]      # shipped MI300X: the ring over the whole scale-up bandwidth
    hidden = g.scaleup_latency_us * 1e-6 + 1.5 * tokens * m.hidden_size * 2 / bw
    norm = g.scaleup_latency_us * 1e-6 + 1.5 * tokens * 8 / bw
    f = cost.features([1] * tokens, [1000] * tokens)
    assert cost.time_parts(f)["allreduce"] == pytest.approx(m.num_layers * (2 * hidden + norm))
    assert "allreduce" not in StepCostModel(g, m, 1).time_parts(f)
    llama = StepCostModel(g, load_model("Llama-3.3-70B-Instruct"), 4)
    assert llama.time_parts(f)["allreduce"] == pytest.approx(llama.model.num_layers * 2 * (
        g.scaleup_latency_us * 1e-6 + 1.5 * tokens * llama.model.hidden_size * 2 / bw))
