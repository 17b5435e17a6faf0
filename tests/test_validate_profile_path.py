"""A measured row whose GPU is a profile YAML (as `capacity calibrate --out` writes, then
`capacity validate FILES --gpu that.yaml`) is simulated on that file, not on the shipped profile of
the GPU named inside it. Truth: the same row simulated on the shipped profile with the file's
changed value given as an override."""

from __future__ import annotations

import yaml

from capacity.inputs.hardware import hw_profiles_dir
from capacity.fidelity.serving import predict_row
from capacity.measurements.row_scenario import row_scenario

ROW = {"framework": "vllm", "gpu": "MI300X", "model": "Llama-3.3-70B-Instruct (FP8 ckpt family)", "precision": "fp8",
       "tp": 1, "isl": 256, "osl": 32, "concurrency_or_qps": 2, "load_type": "closed_loop_concurrency",
       "num_gpus": 1, "tpot_ms": 20.0, "num_prompts": 6, "spec_method": "none"}


def test_a_profile_yaml_row_is_simulated_on_that_file(tmp_path) -> None:
    data = yaml.safe_load((hw_profiles_dir() / "MI300X.yaml").read_text())
    data["efficiency"]["gemm"]["value"] = 0.05                      # far from the shipped fit
    path = tmp_path / "my-mi300x.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))

    scenario, reason = row_scenario({**ROW, "gpu": str(path)})
    assert reason is None and scenario["deployment"]["gpu"] == str(path)
    on_file = predict_row({**ROW, "gpu": str(path)})
    shipped = predict_row(ROW)
    overridden = predict_row(ROW, gpu_overrides={"efficiency": {"gemm": 0.05}})
    assert on_file["predicted_tpot_ms"] == overridden["predicted_tpot_ms"]
    assert on_file["predicted_tpot_ms"] != shipped["predicted_tpot_ms"]
