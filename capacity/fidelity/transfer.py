"""Leave one GPU out: a GPU's shipped serving rows predicted with ANOTHER GPU's efficiencies, no refit.

The TARGET's rows run on the TARGET's own datasheet (peaks, HBM, scale-up, power) with every `efficiency` entry of the
SOURCE (fitted values included), its `kernels_per_dense_layer` and `gemm_call_us` (what a fixed time per kernel was
fitted with) and, within a family, the bandwidth its expert efficiencies are fractions of: what `family_transfer` does
for a GPU without serving rows (hw_profiles/README.md). Within a family (H100 <-> H200) this is the out-of-sample error a
user gets for a sibling GPU; across a generation (MI300X -> MI355X) it is the hard case (issue 16 item 4).
`target_host` keeps the TARGET's own host times (HOST_EFFICIENCY_KEYS), so that what is left is the error of the
GPU-side efficiencies alone: the rows do not record the servers' CPUs (docs/seed_validation.md section 52).
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from capacity.fidelity import serving
from capacity.fidelity.common import error_table
from capacity.inputs.hardware import HOST_EFFICIENCY_KEYS, GpuProfile, family_of, list_gpus, load_gpu
from capacity.measurements.row_scenario import row_scenario
from capacity.measurements.schemas import read_measurements

METRICS = ("output_tok_s_per_gpu", "tpot_ms", "ttft_ms")


def transfer_overrides(source: GpuProfile, target: GpuProfile, efficiency: Mapping[str, float] | None = None,
                       target_host: bool = False) -> dict[str, Any]:
    """The `gpu_overrides` that price `target`'s rows with `source`'s efficiencies (`efficiency`: values to use in place
    of the source profile's own, e.g. a fit not yet written)."""
    eff = dict(source.efficiency if efficiency is None else efficiency)
    if target_host:
        eff.update({k: target.efficiency[k] for k in HOST_EFFICIENCY_KEYS if k in target.efficiency})
    overrides: dict[str, Any] = {"efficiency": eff, "gemm_call_us": source.gemm_call_us}
    if source.kernels_per_dense_layer:   # a layer overhead fitted per dense layer's kernels needs its count
        overrides["kernels_per_dense_layer"] = source.kernels_per_dense_layer
    # within a family (one die) the bandwidth the expert efficiencies are fractions of (GpuProfile.expert_stream_bw_tb_s);
    # across a generation they stay fractions of the target's own HBM
    if family_of(source.architecture) == family_of(target.architecture):
        overrides["expert_stream_bandwidth_tb_s"] = source.expert_stream_bw_tb_s
    return overrides


def errors(rows: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Median and p90 absolute percentage error per METRICS of predicted rows (`serving.run`'s), from
    `common.error_table` over the modelled rows."""
    table = {t["metric"]: t for t in error_table(rows[rows["skipped"].isna()], [])}
    return {m: {"rows": table[m]["n"], "median_pct": table[m]["median_ape"] * 100, "p90_pct": table[m]["p90_ape"] * 100}
            for m in METRICS if m in table}


def predict(source: GpuProfile, target: str, efficiency: Mapping[str, float] | None = None, target_host: bool = False,
            workers: int = 2, max_rows: int | None = None, progress: bool = False) -> pd.DataFrame:
    """`target`'s shipped serving rows predicted with `source`'s efficiencies (transfer_overrides)."""
    overrides = transfer_overrides(source, load_gpu(target), efficiency, target_host)
    return serving.run(gpus=[target], gpu_overrides=overrides, workers=workers, max_rows=max_rows,
                       progress=progress).rows


def siblings_with_rows(profile: GpuProfile) -> list[str]:
    """The other shipped GPUs of `profile`'s architecture family that have shipped serving rows the simulator models."""
    family = family_of(profile.architecture)
    siblings = {g.name.upper(): g.name for g in list_gpus()
                if g.name.upper() != profile.name.upper() and family_of(g.architecture) == family}
    modelled = set()
    for path in serving.default_files():
        for row in read_measurements(path).to_dict(orient="records"):
            gpu = str(row.get("gpu", "")).upper()
            if gpu in siblings and gpu not in modelled and row_scenario(row)[0] is not None:
                modelled.add(gpu)
    return [name for key, name in sorted(siblings.items()) if key in modelled]
