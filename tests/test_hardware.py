"""Tests of the GPU profiles in hw_profiles/ and their loader (capacity.inputs.hardware).

Expected values are the published figures, typed in here from their sources (the project's
validation compilation hw_specs.csv, 2026, which cites them), never read from the code:
  [STAS] https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md
  [SA]   https://github.com/SemiAnalysisAI/InferenceX-app/blob/main/packages/app/src/lib/gpu-specs.ts
  [MAF]  https://rocm.blogs.amd.com/software-tools-optimization/measuring-max-achievable-flops-part2/README.html
  [AZ]   https://github.com/samuel-bohman/AI-benchmarking-guide/tree/main/Azure_Results (ND_*_results.md)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from capacity.errors import CapacityError
from capacity.inputs.hardware import (
    EFFICIENCY_KEYS,
    GpuProfile,
    list_gpus,
    load_gpu,
    save_profile,
)
from capacity.paths import hw_profiles_dir

SHIPPED = ("B200", "B300", "H100", "H200", "MI300X", "MI325X", "MI350X", "MI355X")
TRANSFERRED = {"B300": "B200", "MI325X": "MI300X", "MI350X": "MI355X"}   # family_transfer: efficiencies from a sibling
FRACTIONS = ("gemm", "hbm", "attention", "allreduce")


def _leaves(node: object, prefix: str = ""):
    """Yield (dotted key, leaf mapping) for every {value, ...} leaf of a raw profile document."""
    if isinstance(node, dict) and "value" in node:
        yield prefix, node
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from _leaves(child, f"{prefix}.{key}" if prefix else str(key))


def _raw(name: str) -> dict:
    return yaml.safe_load((hw_profiles_dir() / f"{name}.yaml").read_text())


def _write(tmp_path: Path, document: dict, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------------
# Every shipped profile


def test_every_shipped_profile_loads_and_is_named_after_its_file():
    profiles = list_gpus()
    assert [p.name for p in profiles] == list(SHIPPED)
    for profile in profiles:
        assert Path(profile.path).stem == profile.name
        assert isinstance(profile, GpuProfile)
        assert profile.scaleup_world_size == 8
        assert isinstance(profile.scaleup_world_size, int)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_leaf_has_a_source_or_is_labelled_assumed(name):
    leaves = list(_leaves({k: v for k, v in _raw(name).items()
                           if k not in ("name", "vendor", "architecture", "family_transfer")}))
    assert len(leaves) >= (9 if name in TRANSFERRED else 17)  # 2+ peaks, 7 scalars (, efficiencies), measurements
    for key, leaf in leaves:
        assert isinstance(leaf["value"], (int, float)) and not isinstance(leaf["value"], bool), key
        assert str(leaf.get("basis", "")).strip(), f"{name}: {key} has no basis"
        assert str(leaf.get("source", "")).strip() or leaf["basis"] == "assumed", f"{name}: {key} has no source"
    # And the loader keeps one provenance record per leaf.
    profile = load_gpu(name)
    transferred = [f"efficiency.{k}" for k in EFFICIENCY_KEYS] if name in TRANSFERRED else []
    if name in TRANSFERRED:   # the sibling's kernel count travels with the layer overhead fitted per kernel
        sibling = _raw(_raw(name)["family_transfer"]["from"])
        if "kernels_per_dense_layer" in sibling and "kernels_per_dense_layer" not in _raw(name):
            transferred.append("kernels_per_dense_layer")
        if "expert_stream_bandwidth_tb_s" not in _raw(name):   # so does the bandwidth its expert efficiencies use
            transferred.append("expert_stream_bandwidth_tb_s")
    # a profile that states no `attention_triton` gets one that follows its `attention`, and optional terms at 0 (hardware.py)
    stated = {key for key, _ in leaves} | set(transferred)
    follows = [k for k in ("efficiency.attention_triton", "efficiency.moe_token_overhead_ns",
                           "efficiency.aiter_moe_token_overhead_ns", "efficiency.eager_kernel_us") if k not in stated]
    assert sorted(profile.provenance) == sorted([key for key, _ in leaves] + transferred + follows)


@pytest.mark.parametrize("name", SHIPPED)
def test_efficiency_has_exactly_the_model_keys_and_fractions_are_in_range(name):
    profile = load_gpu(name)
    assert tuple(profile.efficiency) == EFFICIENCY_KEYS
    for key in FRACTIONS:
        assert 0.0 < profile.efficiency[key] <= profile.efficiency_ceiling(key)
    assert profile.efficiency["step_overhead_ms"] >= 0
    for k in EFFICIENCY_KEYS:
        record = profile.provenance[f"efficiency.{k}"]
        # every efficiency value is either an assumption (with its reasoning) or a fit that says what it was fitted on
        if record.basis == "fitted" or record.basis.endswith("(fitted)"):   # a sibling's fit keeps its fitted_on
            assert record.fitted_on
        else:
            assert record.fitted_on is None and record.source
    if all(profile.provenance[f"efficiency.{k}"].basis == "assumed" for k in ("step_overhead_ms",)):
        assert profile.efficiency["step_overhead_ms"] == 1.2  # SpecDecode-Bench fit, modelling_notes §2.5
    assert profile.provenance["cost_per_gpu_hour_usd"].basis == "assumed"


# ---------------------------------------------------------------------------------------------
# Published figures (hw_specs.csv rows; sources in the module docstring)

PUBLISHED = {
    # name: (bf16, fp8, fp4 or None, HBM GB, HBM TB/s, scale-up GB/s unidirectional, board W)
    "MI300X": (1307.4, 2614.9, None, 192, 5.3, 448, 750),  # peaks: AMD "1307.4"/"2614.9 peak" [MAF]; rest [STAS]/[SA]
    "MI325X": (1307.4, 2614.9, None, 256, 6.0, 448, 1000),  # same compute as MI300X [MAF]; [STAS]/[SA]
    "MI355X": (2516, 5033, 10066, 288, 8.0, 7 * 76.8, 1400),  # peaks [SA]; 7 xGMI links x 76.8 GB/s (SA docs)
    # MI350X: the MI355X silicon at 2200 instead of 2400 MHz (hw_specs.csv), 288 GB, 8 TB/s, 1000 W [STAS]
    "MI350X": (2516 * 2200 / 2400, 5033 * 2200 / 2400, 10066 * 2200 / 2400, 288, 8.0, 7 * 76.8, 1000),
    "H100": (989, 1979, None, 80, 3.35, 450, 700),  # [STAS]/[SA], SXM
    "H200": (989, 1979, None, 141, 4.8, 450, 700),  # [STAS]/[SA]
    "B200": (2250, 4500, 9000, 180, 8.0, 900, 1000),  # [STAS]/[SA], SXM
    "B300": (2250, 4500, 13500, 268, 8.0, 900, 1000),  # [SA] (FP4 dense, usable HBM; [STAS] lists 12600 and 288), [STAS] power
}


@pytest.mark.parametrize("name", SHIPPED)
def test_specs_match_published_figures(name):
    bf16, fp8, fp4, hbm_gb, hbm_tb_s, scaleup_gb_s, power_w = PUBLISHED[name]
    profile = load_gpu(name)
    assert profile.peak_dense_tflops["bf16"] == pytest.approx(bf16, rel=1e-4)
    assert profile.peak_dense_tflops["fp8"] == pytest.approx(fp8, rel=1e-4)
    if fp4 is None:
        assert "fp4" not in profile.peak_dense_tflops and "fp6" not in profile.peak_dense_tflops
    else:
        assert profile.peak_dense_tflops["fp4"] == pytest.approx(fp4, rel=1e-4)
    assert profile.hbm_capacity_gb == pytest.approx(hbm_gb)
    assert profile.hbm_bandwidth_tb_s == pytest.approx(hbm_tb_s)
    assert profile.scaleup_bandwidth_gb_s == pytest.approx(scaleup_gb_s)
    assert profile.board_power_w == pytest.approx(power_w)


def test_vendor_peaks_are_consistent_with_compute_unit_arithmetic():
    # MI300X: 304 CUs x 2.1 GHz (hw_specs compute_units / compute_clock_max) x 2048 bf16 FLOP/clk/CU.
    assert load_gpu("MI300X").peak_dense_tflops["bf16"] == pytest.approx(304 * 2.1e9 * 2048 / 1e12, rel=1e-4)
    # MI355X: 256 CUs x 2.4 GHz x 8192 fp8 FLOP/clk/CU (AMD ISSCC 2026, as reported in hw_specs.csv).
    mi355x = load_gpu("MI355X")
    assert mi355x.peak_dense_tflops["fp8"] == pytest.approx(256 * 2.4e9 * 8192 / 1e12, rel=1e-3)
    assert mi355x.peak_dense_tflops["fp4"] == pytest.approx(2 * mi355x.peak_dense_tflops["fp8"], rel=1e-3)


def test_measured_figures_match_published_measurements():
    mi300x = load_gpu("MI300X").measured
    assert mi300x["gemm_bf16_tflops"] == 708  # AMD MAF Table 1 [MAF]
    assert mi300x["gemm_fp8_tflops"] == 1273  # [MAF]
    assert mi300x["hbm_stream_tb_s"] == 4.09  # STREAM triad, Azure ND MI300X v5 [AZ]
    assert mi300x["allreduce_busbw_gb_s"] == 316.82  # RCCL busbw @8 GB [AZ]
    assert mi300x["flash_attention_tflops"] == 328.6  # [AZ]
    assert load_gpu("MI325X").measured == {"gemm_bf16_tflops": 843, "gemm_fp8_tflops": 1519}  # [MAF]
    assert load_gpu("MI355X").measured == {"gemm_bf16_tflops": 1565.0}  # MAMF [STAS]
    assert load_gpu("B300").measured == {"gemm_bf16_tflops": 1769.0, "gemm_fp8_tflops": 3353.3}  # MAMF [STAS]
    h100 = load_gpu("H100").measured
    assert (h100["gemm_bf16_tflops"], h100["gemm_fp8_tflops"]) == (794.5, 1402.6)  # MAMF [STAS]
    assert (h100["hbm_stream_tb_s"], h100["allreduce_busbw_gb_s"], h100["flash_attention_tflops"]) == (2.97, 478.87, 327.9)
    h200 = load_gpu("H200").measured
    assert (h200["gemm_fp8_tflops"], h200["hbm_stream_tb_s"], h200["allreduce_busbw_gb_s"]) == (1453.4, 4.15, 479.98)
    assert load_gpu("B200").measured == {"gemm_bf16_tflops": 1745.0, "gemm_fp8_tflops": 3432.5}  # MAMF [STAS]


# Efficiency = published measurement / published spec, worked out by hand from the figures above.
MEASURED_RATIOS = {
    ("MI300X", "gemm"): 708 / 1307.4,
    ("MI300X", "hbm"): 4.09 / 5.3,
    ("MI300X", "attention"): 328.6 / 1307.4,
    ("MI300X", "allreduce"): 1.0,  # of its measured all-reduce latencies (allreduce_latency.yaml; section 44)
    ("MI355X", "gemm"): 1565 / 2516,
    ("H100", "gemm"): 794.5 / 989,
    ("H100", "hbm"): 2.97 / 3.35,
    ("H100", "attention"): 327.9 / 989,
    ("H100", "allreduce"): 478.87 / 450,  # NVLS busbw exceeds the link rate (efficiency_ceiling)
    ("H200", "gemm"): 794.5 / 989,
    ("H200", "hbm"): 4.15 / 4.8,
    ("H200", "attention"): 329.3 / 989,
    ("H200", "allreduce"): 479.98 / 450,
    ("B200", "gemm"): 1745 / 2250,
}


@pytest.mark.parametrize(("name", "key"), sorted(MEASURED_RATIOS))
def test_measured_efficiencies_are_measurement_over_spec(name, key):
    profile = load_gpu(name)
    record = profile.provenance[f"efficiency.{key}"]
    if record.basis == "fitted":
        # calibrated on serving rows: the measured ratio it replaced is kept in the note
        before = float(record.note.split("before calibration: ")[1].split()[0])
        assert before == pytest.approx(MEASURED_RATIOS[(name, key)], abs=1e-3)
        return
    assert profile.efficiency[key] == pytest.approx(MEASURED_RATIOS[(name, key)], rel=1e-3)
    assert record.basis.startswith("measured")


def test_efficiencies_without_a_measurement_are_labelled_assumed():
    for name in SHIPPED:
        profile = load_gpu(name)
        for key in FRACTIONS:
            if (name, key) not in MEASURED_RATIOS:
                basis = profile.provenance[f"efficiency.{key}"].basis
                assert basis in ("assumed", "fitted") or basis.startswith(f"transferred from {TRANSFERRED[name]}"), \
                    (name, key)


def test_readme_ranges_of_achievable_fractions():
    # Validation README (calibration data notes): measured GEMM on MI300X ~50-54 % of peak; HBM ~77 % (MI300X) vs 86-89 % (H100/H200).
    mi300x = load_gpu("MI300X")
    assert 0.50 <= mi300x.measured["gemm_bf16_tflops"] / mi300x.peak_dense_tflops["bf16"] <= 0.545
    assert mi300x.measured["hbm_stream_tb_s"] / mi300x.hbm_bandwidth_tb_s == pytest.approx(0.77, abs=0.005)
    for name in ("H100", "H200"):
        g = load_gpu(name)
        assert 0.86 <= g.measured["hbm_stream_tb_s"] / g.hbm_bandwidth_tb_s <= 0.89


# ---------------------------------------------------------------------------------------------
# compute_dtype / peak_tflops


def test_compute_dtype_rules():
    mi300x, mi355x, h100, b200 = (load_gpu(n) for n in ("MI300X", "MI355X", "H100", "B200"))
    # No FP4 units on CDNA3: MXFP4 weights are dequantized and the GEMM runs in bf16 (weight-only).
    assert mi300x.compute_dtype("mxfp4") == "bf16"
    assert mi300x.peak_tflops("mxfp4") == 1307.4
    # MXFP4 checkpoints are served weight-only (w4a16, assumed; see compute_dtype); w4a4 runs in fp4.
    assert mi355x.compute_dtype("mxfp4") == "bf16"
    assert mi355x.compute_dtype("w4a4") == "fp4"
    assert mi355x.peak_tflops("w4a4") == 10066
    assert b200.compute_dtype("nvfp4_w4a4") == "fp4"
    assert h100.compute_dtype("w4a4") == "bf16"
    assert mi355x.compute_dtype("mxfp6") == "fp6"
    assert h100.compute_dtype("fp6") == "bf16"
    for gpu in (mi300x, mi355x, h100, b200):
        assert gpu.compute_dtype("fp8") == "fp8"
        assert gpu.compute_dtype("mxfp8") == "fp8"
        assert gpu.compute_dtype("FP8_E4M3") == "fp8"
        assert gpu.compute_dtype("int4") == "bf16"
        assert gpu.compute_dtype("bf16") == "bf16"
        assert gpu.compute_dtype("fp16") == "bf16"
    assert h100.peak_tflops("fp8") == 1979
    assert h100.peak_tflops("bfloat16") == 989


def test_compute_dtype_without_fp8_falls_back_to_bf16(tmp_path):
    # A hypothetical GPU with only bf16 tensor cores (built from a shipped profile with fp8 removed).
    raw = _raw("H100")
    del raw["peak_dense_tflops"]["fp8"]
    gpu = load_gpu(_write(tmp_path, raw, "bf16_only.yaml"))
    assert gpu.compute_dtype("fp8") == "bf16"
    assert gpu.compute_dtype("int8") == "bf16"
    assert gpu.compute_dtype("mxfp4") == "bf16"
    assert load_gpu("H100").compute_dtype("int8") == "fp8"  # W8A8 int8 runs at the int8 = fp8 rate


def test_unknown_weight_dtype_raises():
    with pytest.raises(CapacityError, match=r"unknown weight dtype 'fp3'"):
        load_gpu("MI300X").compute_dtype("fp3")


# ---------------------------------------------------------------------------------------------
# Loading by name and path; errors


def test_load_by_case_insensitive_name_and_by_path():
    assert load_gpu("mi300x").name == "MI300X"
    assert load_gpu("  h200 ").name == "H200"
    assert load_gpu("H100 SXM").name == "H100"
    path = hw_profiles_dir() / "MI355X.yaml"
    assert load_gpu(str(path)).name == "MI355X"
    assert load_gpu(path).hbm_capacity_gb == 288


def test_unknown_gpu_message():
    with pytest.raises(CapacityError) as info:
        load_gpu("A100")
    message = str(info.value)
    assert message.startswith("unknown GPU 'A100'; known GPUs: ")
    assert "B200, B300, H100, H200, MI300X, MI325X, MI350X, MI355X" in message
    assert message.endswith("or pass the path of a profile YAML")
    assert "\n" not in message


def test_missing_profile_file_message(tmp_path):
    with pytest.raises(CapacityError, match="not found"):
        load_gpu(str(tmp_path / "nothing.yaml"))


def _malformed_message(tmp_path: Path, document: dict | str) -> str:
    path = tmp_path / "broken.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(CapacityError) as info:
        load_gpu(str(path))
    message = str(info.value)
    assert str(path) in message, message
    assert "\n" not in message
    return message


def test_malformed_missing_key(tmp_path):
    raw = _raw("MI300X")
    del raw["efficiency"]["gemm"]
    assert "missing key 'efficiency.gemm'" in _malformed_message(tmp_path, raw)


def test_malformed_efficiency_above_one(tmp_path):
    raw = _raw("MI300X")
    raw["efficiency"]["hbm"]["value"] = 1.3
    message = _malformed_message(tmp_path, raw)
    assert "'efficiency.hbm'" in message and "(0, 1]" in message and "1.3" in message


def test_malformed_non_numeric_value(tmp_path):
    raw = _raw("MI300X")
    raw["hbm_bandwidth_tb_s"]["value"] = "fast"
    message = _malformed_message(tmp_path, raw)
    assert "'hbm_bandwidth_tb_s.value' must be a finite number" in message and "'fast'" in message


def test_malformed_bare_number_instead_of_leaf(tmp_path):
    raw = _raw("MI300X")
    raw["board_power_w"] = 750
    assert "'board_power_w' must be a mapping" in _malformed_message(tmp_path, raw)


def test_malformed_unknown_key_wrong_unit_and_missing_source(tmp_path):
    raw = _raw("MI300X")
    raw["hbm_bandwith_tb_s"] = raw["hbm_bandwidth_tb_s"]
    assert "unknown key 'hbm_bandwith_tb_s'" in _malformed_message(tmp_path, raw)

    raw = _raw("MI300X")
    raw["hbm_capacity_gb"]["unit"] = "GiB"
    assert "'hbm_capacity_gb' has unit 'GiB'" in _malformed_message(tmp_path, raw)

    raw = _raw("MI300X")
    raw["board_power_w"]["source"] = ""
    assert "'board_power_w' has an empty 'source'" in _malformed_message(tmp_path, raw)

    raw = _raw("MI300X")
    raw["peak_dense_tflops"]["fp3"] = dict(raw["peak_dense_tflops"]["fp8"])
    assert "'peak_dense_tflops.fp3'" in _malformed_message(tmp_path, raw)

    raw = _raw("MI300X")
    raw["scaleup_world_size"]["value"] = 7.5
    assert "'scaleup_world_size'" in _malformed_message(tmp_path, raw)


def test_malformed_yaml_syntax(tmp_path):
    assert "not valid YAML" in _malformed_message(tmp_path, "name: MI300X\nvendor: [AMD\n")


def test_assumed_leaf_may_have_empty_source_and_measured_may_be_empty(tmp_path):
    raw = _raw("MI300X")
    raw["cost_per_gpu_hour_usd"] = {"value": 1.0, "basis": "assumed", "source": ""}
    raw["measured"] = None
    gpu = load_gpu(_write(tmp_path, raw, "ok.yaml"))
    assert gpu.cost_per_gpu_hour_usd == 1.0
    assert gpu.measured == {}


# ---------------------------------------------------------------------------------------------
# Overrides, JSON view, save_profile


def test_with_overrides_replaces_values_and_records_provenance():
    base = load_gpu("MI300X")
    changed = base.with_overrides(efficiency={"gemm": 0.6}, cost_per_gpu_hour_usd=2.75)
    assert changed.efficiency["gemm"] == 0.6
    assert changed.efficiency["hbm"] == base.efficiency["hbm"]
    assert changed.cost_per_gpu_hour_usd == 2.75
    assert changed.provenance["efficiency.gemm"].basis == "override"
    assert changed.provenance["cost_per_gpu_hour_usd"].basis == "override"
    assert base.efficiency["gemm"] == load_gpu("MI300X").efficiency["gemm"]  # the original is untouched
    # Adding an FP4 peak changes how MXFP4 weights run.
    with_fp4 = base.with_overrides(peak_dense_tflops={"fp4": 5000})
    assert with_fp4.compute_dtype("w4a4") == "fp4"
    assert with_fp4.peak_tflops("w4a4") == 5000


def test_allreduce_ceiling_is_the_measured_nvls_ratio_where_it_beats_the_links():
    # Azure ND H200 v5 / H100 v5 NCCL NVLS all-reduce bus bandwidth at 8 GB (479.98 / 478.87 GB/s) against
    # NVLink's 450 GB/s per GPU and direction: the in-switch reduction beats the link rate, so that ratio,
    # not 1, is how far the efficiency can go. Every other fraction, and MI300X's all-reduce (316.82 of 448
    # GB/s on a mesh), stays at 1.
    assert load_gpu("H200").efficiency_ceiling("allreduce") == pytest.approx(479.98 / 450)
    assert load_gpu("H100").efficiency_ceiling("allreduce") == pytest.approx(478.87 / 450)
    assert load_gpu("MI300X").efficiency_ceiling("allreduce") == 1.0
    assert load_gpu("H200").efficiency_ceiling("gemm") == 1.0
    assert load_gpu("H200").with_overrides(efficiency={"allreduce": 1.05}).efficiency["allreduce"] == 1.05
    with pytest.raises(CapacityError, match=r"'efficiency.allreduce' must be a fraction in \(0, 1.067\]"):
        load_gpu("H200").with_overrides(efficiency={"allreduce": 1.1})
    with pytest.raises(CapacityError, match=r"'efficiency.allreduce' must be a fraction in \(0, 1\]"):
        load_gpu("MI300X").with_overrides(efficiency={"allreduce": 1.05})


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"hbm_size_gb": 100}, r"cannot override 'hbm_size_gb'"),
        ({"efficiency": {"matmul": 0.5}}, r"cannot override 'efficiency.matmul'"),
        ({"efficiency": {"gemm": 0.0}}, r"'efficiency.gemm' must be a fraction in \(0, 1\]"),
        ({"efficiency": 0.5}, r"must be a mapping"),
        ({"hbm_bandwidth_tb_s": "5"}, r"'hbm_bandwidth_tb_s' must be a finite number"),
        ({"scaleup_world_size": 0}, r"'scaleup_world_size'"),
    ],
)
def test_with_overrides_rejects_bad_changes(changes, pattern):
    with pytest.raises(CapacityError, match=pattern):
        load_gpu("H100").with_overrides(**changes)


def test_to_dict_is_json_serialisable_with_provenance():
    view = json.loads(json.dumps(load_gpu("MI355X").to_dict()))
    assert view["name"] == "MI355X"
    assert view["peak_dense_tflops"]["fp4"] == 10066
    assert view["provenance"]["hbm_capacity_gb"]["value"] == 288
    assert view["provenance"]["hbm_capacity_gb"]["source"].startswith("https://")
    assert set(view["efficiency"]) == set(EFFICIENCY_KEYS)


def test_save_profile_round_trip(tmp_path):
    base = load_gpu("MI300X")
    out = tmp_path / "fitted" / "MI300X.yaml"
    save_profile(base, out, {"gemm": 0.48, "step_overhead_ms": 2.5}, fitted_on="seed_spec_decode.csv, 272 MI300X rows")
    again = load_gpu(str(out))
    assert again.efficiency["gemm"] == 0.48
    assert again.efficiency["step_overhead_ms"] == 2.5
    for key in ("gemm", "step_overhead_ms"):
        record = again.provenance[f"efficiency.{key}"]
        assert record.basis == "fitted"
        assert record.fitted_on == "seed_spec_decode.csv, 272 MI300X rows"
    # Everything else - values and sources - is kept.
    for key in ("hbm", "attention", "allreduce", "per_seq_overhead_us"):
        assert again.efficiency[key] == base.efficiency[key]
        assert again.provenance[f"efficiency.{key}"] == base.provenance[f"efficiency.{key}"]
    for key, record in base.provenance.items():
        if key not in ("efficiency.gemm", "efficiency.step_overhead_ms"):
            assert again.provenance[key] == record, key
    assert (again.name, again.vendor, again.architecture) == (base.name, base.vendor, base.architecture)
    assert again.peak_dense_tflops == base.peak_dense_tflops and again.measured == base.measured
    assert again.scaleup_world_size == 8
    # A second save of the re-loaded profile is stable.
    out2 = tmp_path / "again.yaml"
    save_profile(again, out2, {}, fitted_on="nothing new")
    assert load_gpu(str(out2)).provenance == again.provenance


def test_save_profile_rejects_bad_fits(tmp_path):
    base = load_gpu("H200")
    with pytest.raises(CapacityError, match="fitted keys must be among"):
        save_profile(base, tmp_path / "x.yaml", {"speed": 1.0}, fitted_on="x")
    with pytest.raises(CapacityError, match=r"'efficiency.hbm' must be a fraction"):
        save_profile(base, tmp_path / "x.yaml", {"hbm": 1.2}, fitted_on="x")
    with pytest.raises(CapacityError, match="fitted_on"):
        save_profile(base, tmp_path / "x.yaml", {"hbm": 0.8}, fitted_on=" ")
    with pytest.raises(CapacityError, match="finite number"):
        save_profile(base, tmp_path / "x.yaml", {"hbm": math.nan}, fitted_on="x")
    assert not (tmp_path / "x.yaml").exists()


# ---------------------------------------------------------------------------------------------
# Family transfer: a GPU without serving rows takes its sibling's efficiencies


@pytest.mark.parametrize(("name", "sibling"), sorted(TRANSFERRED.items()))
def test_transferred_efficiencies_are_the_siblings_and_the_datasheet_is_its_own(name, sibling):
    gpu, sib = load_gpu(name), load_gpu(sibling)
    assert gpu.architecture.split()[0] == sib.architecture.split()[0]        # same family (CDNA3, CDNA4)
    for key in EFFICIENCY_KEYS:
        record = gpu.provenance[f"efficiency.{key}"]
        if key == "attention_triton" and sib.provenance[f"efficiency.{key}"].basis == "assumed":
            # the sibling states none: this profile's follows its own (transferred) `attention`
            assert record.basis == "assumed" and gpu.efficiency[key] == gpu.efficiency["attention"], name
            continue
        if (key in ("moe_token_overhead_ns", "aiter_moe_token_overhead_ns", "eager_kernel_us")
                and sib.provenance[f"efficiency.{key}"].basis == "assumed"):
            assert record.basis == "assumed" and gpu.efficiency[key] == 0.0, name
            continue
        assert record.basis.startswith(f"transferred from {sibling} ("), (name, key)
        assert record.fitted_on == sib.provenance[f"efficiency.{key}"].fitted_on
        if key != "gemm" or name not in ("MI325X", "B300"):   # both measured a GEMM ratio of their own
            assert gpu.efficiency[key] == sib.efficiency[key], (name, key)
    # what the datasheet says stays the GPU's own (MI325X: HBM 6.0 vs 5.3 TB/s and 1000 W; MI350X: peaks at 2.2 GHz
    # and 1000 W; B300: 268 GB of HBM and a 13.5 PF FP4 peak) and differs from the sibling's
    def datasheet(g):
        return (g.peak_dense_tflops["bf16"], g.peak_dense_tflops["fp8"], g.peak_dense_tflops.get("fp4", 0.0), g.hbm_capacity_gb,
                g.hbm_bandwidth_tb_s, g.scaleup_bandwidth_gb_s, g.board_power_w)
    assert datasheet(gpu) == pytest.approx(tuple(x or 0.0 for x in PUBLISHED[name]), rel=1e-4)
    assert datasheet(gpu) != datasheet(sib)


@pytest.mark.parametrize(("name", "sibling"), sorted(TRANSFERRED.items()))
def test_a_transfer_keeps_the_siblings_expert_streaming_rate(name, sibling):
    """Expert kernels stream at a rate the die sets, so the sibling's fitted `moe` stays a fraction of the
    sibling's bandwidth (GpuProfile.expert_stream_bw_tb_s): MI325X's expert weights stream at MI300X's
    5.3 TB/s x moe x hbm, not at its own 6.0 TB/s."""
    gpu, sib = load_gpu(name), load_gpu(sibling)
    assert gpu.expert_stream_bw_tb_s == sib.hbm_bandwidth_tb_s
    assert gpu.provenance["expert_stream_bandwidth_tb_s"].basis.startswith(f"transferred from {sibling} (")
    assert sib.expert_stream_bw_tb_s == sib.hbm_bandwidth_tb_s      # a fitted profile: its own HBM


def test_mi350x_peaks_match_amds_rounded_figures():
    # AMD's MI350X page rounds the dense peaks to 2.3 PF (FP16/BF16), 4.6 PF (FP8), 9.2 PF (MXFP4): an
    # independent check of the clock-ratio derivation the profile uses
    peaks = load_gpu("MI350X").peak_dense_tflops
    for dtype, rounded in (("bf16", 2300), ("fp8", 4600), ("fp4", 9200)):
        assert abs(peaks[dtype] - rounded) <= 0.005 * rounded, dtype


def test_b300_gemm_carries_its_measured_matmul_ratio():
    # the community MAMF table [STAS]: B300 1769 of 2250 bf16 TFLOPS, B200 1745 of 2250; same peaks, so the
    # transferred GEMM efficiency is B200's times 1769 / 1745
    assert load_gpu("B300").efficiency["gemm"] == pytest.approx(load_gpu("B200").efficiency["gemm"] * 1769 / 1745)


def test_mi325x_gemm_carries_the_measured_sustained_clock_difference():
    # AMD's max-achievable-FLOPS table [MAF]: on the same die and kernels MI325X (1000 W) reaches 843
    # bf16 TFLOPS, MI300X (750 W) 708; the transferred GEMM efficiency keeps that ratio.
    assert load_gpu("MI325X").efficiency["gemm"] == pytest.approx(load_gpu("MI300X").efficiency["gemm"] * 843 / 708)


def _one_user_tpot_ms(gpu: str) -> float:
    from capacity.inputs import scenario
    from capacity.sim import simulate

    sc = scenario.from_dict({
        "name": "one user", "deployment": {"gpu": gpu, "model": "meta-llama/Llama-3.3-70B-Instruct",
                                           "precision": "fp8", "tensor_parallel_size": 1},
        "traffic": {"arrival": {"process": "closed_loop", "concurrency": 1}, "num_requests": 4,
                    "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 1024},
                                 "output_tokens": {"dist": "fixed", "value": 256}}]}}, "test")
    return simulate.run(sc).metrics["tpot_ms"]["p50"]


def test_sibling_gpus_decode_within_their_datasheet_ratios():
    """At one user a decode step reads the weights once: a sibling with more HBM bandwidth and the same
    die can be faster by at most the bandwidth ratio (MI325X 6.0 vs MI300X 5.3 TB/s) and is not slower;
    a sibling with a lower clock and the same memory (MI350X 2.2 vs MI355X 2.4 GHz) is not faster and at
    most slower by the clock ratio. Before the family transfer MI325X decoded 1.38x faster than MI300X."""
    ratio = _one_user_tpot_ms("MI325X") / _one_user_tpot_ms("MI300X")
    assert 5.3 / 6.0 <= ratio <= 1.0
    ratio = _one_user_tpot_ms("MI350X") / _one_user_tpot_ms("MI355X")
    assert 1.0 - 1e-9 <= ratio <= 2400 / 2200   # equal where the step does not depend on the clock
    # B300 and B200: the same 8 TB/s and BF16 / FP8 peaks; B300's measured max-achievable BF16 matmul is 1769
    # against 1745 TFLOPS [STAS], so it is not slower and faster by at most that ratio
    ratio = _one_user_tpot_ms("B300") / _one_user_tpot_ms("B200")
    assert 1745 / 1769 - 1e-9 <= ratio <= 1.0 + 1e-9


def _mi325x_document() -> dict:
    return _raw("MI325X")


def test_family_transfer_errors_are_one_line(tmp_path):
    both = _mi325x_document()
    both["efficiency"] = _raw("MI300X")["efficiency"]
    neither = {k: v for k, v in _mi325x_document().items() if k != "family_transfer"}
    cross = _mi325x_document()
    cross["family_transfer"]["from"] = "MI355X"
    chained = _mi325x_document()
    chained["family_transfer"]["from"] = "MI350X"
    chained["architecture"] = "CDNA4 (gfx950)"
    itself = _mi325x_document()
    itself["family_transfer"]["from"] = "MI325X"
    unknown = _mi325x_document()
    unknown["family_transfer"]["from"] = "MI999X"
    unchecked = _mi325x_document()   # a transfer check needs its figures
    unchecked["family_transfer"]["checked_on"] = {"measured_by": "x", "rows": 3, "models": ["m"], "tensor_parallel_sizes": [1]}
    for doc, pattern in ((both, "not both"), (neither, "not neither"), (cross, "not the CDNA3 family"),
                         (chained, "itself transfers"), (itself, "names the GPU itself"), (unknown, "unknown GPU 'MI999X'"),
                         (unchecked, "errors")):
        with pytest.raises(CapacityError, match=pattern) as info:
            load_gpu(_write(tmp_path, doc, "MI325X_variant.yaml"))
        assert "\n" not in str(info.value)


def test_a_transfer_check_of_values_the_sibling_no_longer_has_is_dropped(tmp_path):
    """B300's `checked_on` measured B200's values of one fit (`sibling_fit` = B200's cross_validation.measured_by);
    against a refitted sibling (another measured_by) it describes other values, so the profile carries none."""
    sib = _raw("B200")
    child = _raw("B300")
    child["family_transfer"]["from"] = "sib.yaml"
    _write(tmp_path, sib, "sib.yaml")
    assert load_gpu(_write(tmp_path, child, "child.yaml")).transfer_check["rows"] == 124
    sib["cross_validation"]["measured_by"] = "capacity calibrate --gpu B200 (a later refit)"
    _write(tmp_path, sib, "sib.yaml")
    assert load_gpu(_write(tmp_path, child, "child2.yaml")).transfer_check == {}


def test_a_transferred_profile_follows_its_sibling_when_the_sibling_changes(tmp_path):
    sib = _raw("MI300X")
    sib["efficiency"]["hbm"]["value"] = 0.5
    sib_path = _write(tmp_path, sib, "sib.yaml")
    child = _mi325x_document()
    child["family_transfer"]["from"] = "sib.yaml"            # a path relative to the child's folder
    child_path = _write(tmp_path, child, "child.yaml")
    assert load_gpu(child_path).efficiency["hbm"] == 0.5
    sib["efficiency"]["hbm"]["value"] = 0.6
    sib_path.write_text(yaml.safe_dump(sib, sort_keys=False) + "# changed\n")
    assert load_gpu(child_path).efficiency["hbm"] == 0.6


def test_a_transferred_profile_takes_its_siblings_gemm_curve_without_rescaling_gemm(tmp_path):
    """With a `gemm_curve` (its `gemm` a multiplier on the measured curve) the sibling's curve travels with
    its efficiencies and the curve's ceiling is the child's own measured ratio (MI325X 843 / 1307.4), so
    `gemm` is not scaled a second time by the two GPUs' measured ratios."""
    sib = _raw("MI300X")
    sib["efficiency"]["gemm"]["value"] = 0.9
    sib["gemm_curve"] = {"fp8": {"value": 43.4, "unit": "GFLOP", "basis": "assumed", "source": ""},
                         "bf16": {"value": 24.1, "unit": "GFLOP", "basis": "assumed", "source": ""}}
    _write(tmp_path, sib, "sib.yaml")
    child = _mi325x_document()
    child["family_transfer"]["from"] = "sib.yaml"
    gpu = load_gpu(_write(tmp_path, child, "child.yaml"))
    assert gpu.gemm_curve == {"bf16": 24.1, "fp8": 43.4}
    assert gpu.efficiency["gemm"] == 0.9
    assert gpu.gemm_ceiling("bf16") == pytest.approx(843 / 1307.4)
    assert gpu.provenance["gemm_curve.fp8"].basis.startswith("transferred from")


def test_shipped_profiles_without_a_gemm_curve_have_none():
    """The curve is opt-in: a profile without a `gemm_curve` section prices every GEMM at `gemm` of peak."""
    for gpu in list_gpus():
        if "gemm_curve" not in _raw(gpu.name) and not _raw(gpu.name).get("family_transfer"):
            assert gpu.gemm_curve == {}
