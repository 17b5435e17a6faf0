"""Per-layer fixed cost weighted by the kernels each layer launches (opt-in `kernels_per_dense_layer`).

Independent truth: the kernel counts written out from vLLM's decoder layers (a dense layer 9 kernels, a MoE
layer 13, a shared expert 3 more; capacity/cost/step_cost.py states where they come from) and the models'
layer structure from their config.json files."""

from __future__ import annotations

import pytest

from capacity.cost.step_cost import StepCostModel, layer_overhead_units
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

LEAF = """kernels_per_dense_layer:
  value: 9
  unit: kernels
  basis: assumed
  source: counted from vLLM's model code
"""


@pytest.mark.parametrize("model, units", [
    ("Llama-3.3-70B-Instruct", 80.0),                 # 80 dense layers
    ("gpt-oss-120b", 36 * 13 / 9),                    # 36 MoE layers, no shared expert
    ("Kimi-K2.5", (1 * 9 + 60 * (13 + 3)) / 9),       # first layer dense, 60 MoE layers with a shared expert
])
def test_kernel_weighted_layer_units(model, units):
    assert layer_overhead_units(load_model(model), 9) == pytest.approx(units)


def test_without_the_opt_in_the_overhead_is_per_layer():
    m = load_model("gpt-oss-120b")
    assert layer_overhead_units(m) == m.num_layers
    assert load_gpu("MI300X").kernels_per_dense_layer == 0


def test_the_opt_in_profile_prices_a_moe_layer_by_its_kernels(tmp_path):
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "hw_profiles" / "MI300X.yaml").read_text()
    path = tmp_path / "k.yaml"
    path.write_text(text.replace("\nboard_power_w:", "\n" + LEAF + "board_power_w:", 1))
    g = load_gpu(path)
    m = load_model("gpt-oss-120b")
    plain, counted = StepCostModel(load_gpu("MI300X"), m), StepCostModel(g, m)
    f = plain.features([1], [100])
    extra = counted.time_parts(f)["overhead"] - plain.time_parts(f)["overhead"]
    assert extra == pytest.approx(g.efficiency["layer_overhead_us"] * 1e-6 * (36 * 13 / 9 - 36))


def test_a_family_transfer_carries_the_kernel_count(tmp_path):
    """MI325X takes MI300X's fitted efficiencies; a layer overhead fitted per dense layer's kernels keeps
    that meaning only with the count, so the count travels with it."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "hw_profiles"
    sibling = tmp_path / "MI300X.yaml"
    sibling.write_text((root / "MI300X.yaml").read_text().replace("\nboard_power_w:", "\n" + LEAF + "board_power_w:", 1))
    text = (root / "MI325X.yaml").read_text()
    import re
    text = re.sub(r"(family_transfer:\n  from: ).*", r"\g<1>" + str(sibling), text)
    child = tmp_path / "MI325X.yaml"
    child.write_text(text)
    assert load_gpu(child).kernels_per_dense_layer == 9
    assert load_gpu("MI325X").kernels_per_dense_layer == load_gpu("MI300X").kernels_per_dense_layer
