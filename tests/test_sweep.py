"""`capacity sweep`: grid expansion, point ids, resumable results, the Dask backend, load_results.

Truth used here is independent of the sweep code: the expected grid is written out by hand, each
point's metrics are compared with a direct `simulate.run` of a scenario dict edited by hand, and
a killed sweep is checked line by line in its results file.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from capacity.inputs import scenario

from capacity.sim import simulate

from capacity import cli
from capacity.studies import sweep
from capacity.errors import CapacityError

TINY = {
    "name": "tiny",
    "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
    "traffic": {"arrival": {"process": "poisson", "rate_rps": 4.0}, "num_requests": 30,
                "classes": [{"name": "chat", "input_tokens": {"dist": "uniform", "low": 100, "high": 1000},
                             "output_tokens": {"dist": "uniform", "low": 20, "high": 200}}]},
    "slo": "ttft:p99<1s;tpot:p90<25ms",
}


def write(tmp_path: Path, grid: dict, base: dict | None = None, name: str = "sweep.yaml") -> Path:
    data = copy.deepcopy(base or TINY)
    data["sweep"] = grid
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def complete_lines(path: Path) -> list[dict]:
    """Every newline-terminated line of a results file, parsed (fails on a corrupt complete line)."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n")[:-1]]


def metric_columns(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "wall_time_s"}


# ---------------------------------------------------------------------- the grid
def test_product_times_zip_in_grid_order():
    grid = {"product": {"traffic.arrival.rate_rps": [1, 2, 4], "deployment.gpu": ["MI300X", "MI355X"]},
            "zip": {"speculative.method": ["none", "ngram"], "speculative.num_speculative_tokens": [0, 3]}}
    spec = sweep.spec_from_dict({**TINY, "sweep": grid})
    expected = [(r, g, m, n) for r in (1, 2, 4) for g in ("MI300X", "MI355X") for m, n in (("none", 0), ("ngram", 3))]
    got = [tuple(p.overrides[k] for k in ("traffic.arrival.rate_rps", "deployment.gpu", "speculative.method",
                                          "speculative.num_speculative_tokens")) for p in spec.points]
    assert got == expected                       # 3 × 2 × 2 = 12, the zip walked together, in this order
    assert [p.index for p in spec.points] == list(range(12))
    assert len({p.point_id for p in spec.points}) == 12
    assert "sweep" not in spec.base


def test_product_only_and_zip_only():
    assert len(sweep.spec_from_dict({**TINY, "sweep": {"product": {"deployment.gpu": ["MI300X", "MI355X"]}}}).points) == 2
    only_zip = sweep.spec_from_dict({**TINY, "sweep": {"zip": {"traffic.arrival.rate_rps": [1, 2, 3],
                                                               "traffic.num_requests": [10, 20, 30]}}})
    assert [tuple(p.overrides.values()) for p in only_zip.points] == [(1, 10), (2, 20), (3, 30)]


def test_point_id_is_stable_under_key_reordering():
    a = {"product": {"traffic.arrival.rate_rps": [1, 2], "deployment.gpu": ["MI300X", "MI355X"]},
         "zip": {"speculative.method": ["none", "ngram"], "speculative.num_speculative_tokens": [0, 3]}}
    b = {"zip": {"speculative.num_speculative_tokens": [0, 3], "speculative.method": ["none", "ngram"]},
         "product": {"deployment.gpu": ["MI300X", "MI355X"], "traffic.arrival.rate_rps": [2.0, 1.0]}}
    ids_a = {frozenset(p.overrides.items()): p.point_id for p in sweep.expand_grid(a)[2]}
    ids_b = {frozenset(p.overrides.items()): p.point_id for p in sweep.expand_grid(b)[2]}
    assert ids_a == ids_b                        # same overrides, same id (and 2.0 is the same value as 2)
    assert sweep.point_id({"x.y": 1, "a.b": "c"}) == sweep.point_id({"a.b": "c", "x.y": 1})
    assert sweep.point_id({"x.y": 1}) != sweep.point_id({"x.y": 2})
    assert len(sweep.point_id({"x.y": 1})) == 12


@pytest.mark.parametrize("grid, words", [
    ({}, "grid is empty"),
    ({"product": {}, "zip": {}}, "grid is empty"),
    ({"product": {"deployment.gpu": []}}, "empty list"),
    ({"zip": {"speculative.method": ["none", "ngram"], "speculative.num_speculative_tokens": [0]}}, "equal lengths"),
    ({"product": {"deployment.gpu": "MI300X"}}, "list of values"),
    ({"grid": {"deployment.gpu": ["MI300X"]}}, "unknown section"),
    ({"product": {"deployment.gpu": ["MI300X"]}, "zip": {"deployment.gpu": ["MI355X"]}}, "both product and zip"),
    ({"product": {"deployment": [{}], "deployment.gpu": ["MI300X"]}}, "inside"),
    ({"product": {"deployment.gpu": ["MI300X", "MI300X"]}}, "twice"),
])
def test_bad_grids_raise_one_line(grid, words):
    with pytest.raises(CapacityError, match=words) as e:
        sweep.spec_from_dict({**TINY, "sweep": grid})
    assert "\n" not in str(e.value)


def test_empty_grid_and_missing_section_exit_2(tmp_path, capsys):
    assert cli.main(["sweep", str(write(tmp_path, {})), "--out", str(tmp_path / "o")]) == 2
    assert "grid is empty" in capsys.readouterr().err
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(TINY))
    assert cli.main(["sweep", str(plain), "--out", str(tmp_path / "o")]) == 2
    assert "no sweep: section" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("values, words", [
    ([2, -1], "traffic.arrival.rate_rps=-1"),     # schema: rate must be > 0
    ([2, "fast"], "traffic.arrival.rate_rps=fast"),
])
def test_a_bad_point_fails_before_anything_runs(tmp_path, capsys, values, words):
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": values}})
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()         # nothing ran, nothing written


def test_an_unknown_gpu_fails_up_front(tmp_path, capsys):
    path = write(tmp_path, {"product": {"deployment.gpu": ["MI300X", "MI999"]}})
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "deployment.gpu=MI999" in err and "MI999" in err.split("):", 1)[1]
    assert not (tmp_path / "o").exists()


def test_list_json_prints_points_without_running(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [1, 2]},
                            "zip": {"deployment.gpu": ["MI300X", "MI355X"]}})
    assert cli.main(["sweep", str(path), "--list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 4
    assert [g["overrides"] for g in out["grid"]] == [
        {"traffic.arrival.rate_rps": r, "deployment.gpu": g} for r in (1, 2) for g in ("MI300X", "MI355X")]
    assert all(len(g["point_id"]) == 12 for g in out["grid"])
    assert not (tmp_path / "reports").exists()     # nothing is written by --list


# ---------------------------------------------------------------------- results
def test_rows_equal_direct_simulations_and_errors_are_rows(tmp_path, capsys):
    grid = {"product": {"traffic.arrival.rate_rps": [2, 8],
                        "deployment.model": ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-405B"]}}
    path = write(tmp_path, grid)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--out", str(out), "--workers", "1", "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["points"] == 4 and len(printed["results"]) == 4
    df = sweep.load_results(out)
    assert list(df["point_id"]) == [p["point_id"] for p in printed["results"]]
    for row in printed["results"]:
        data = copy.deepcopy(TINY)                       # the point's scenario, edited by hand
        data["traffic"]["arrival"]["rate_rps"] = row["traffic.arrival.rate_rps"]
        data["deployment"]["model"] = row["deployment.model"]
        sc = scenario.from_dict(data)
        if row["deployment.model"].endswith("405B"):     # 810 GB of bf16 weights on one 192 GB GPU
            with pytest.raises(CapacityError) as e:
                simulate.run(sc)
            assert row["error"] == str(e.value) and "does not fit" in row["error"]
            assert row.get("stable") is None
            continue
        res = simulate.run(sc)
        m = res.metrics
        assert row["error"] is None
        assert row["stable"] == res.stable and row["num_gpus"] == 1
        assert row["ttft_ms_p99"] == pytest.approx(m["ttft_ms"]["p99"], rel=1e-12)
        assert row["tpot_ms_p90"] == pytest.approx(m["tpot_ms"]["p90"], rel=1e-12)
        assert row["tok_s_per_user_p50"] == pytest.approx(m["tok_s_per_user"]["p50"], rel=1e-12)
        assert row["output_throughput_tok_s_per_gpu"] == pytest.approx(m["output_throughput_tok_s_per_gpu"], rel=1e-12)
        assert row["request_throughput_rps"] == pytest.approx(m["request_throughput_rps"], rel=1e-12)
        assert row["goodput_rps"] == pytest.approx(m["goodput_rps"], rel=1e-12)
        assert row["slo_met"] == m["slo_met"]
        assert row["wall_time_s"] > 0
        assert row["spec_mean_accepted_length"] is None
    assert set(df.columns) >= {"point_id", "traffic.arrival.rate_rps", "deployment.model", "stable", "num_gpus",
                               "ttft_ms_p99", "goodput_rps", "slo_met", "error", "wall_time_s"}
    assert df.columns[-2:].tolist() == ["error", "wall_time_s"]


def test_existing_results_need_resume_and_the_same_scenario(tmp_path, capsys):
    grid = {"product": {"traffic.arrival.rate_rps": [2, 4]}}
    path = write(tmp_path, grid)
    out = tmp_path / "out"
    assert cli.main(["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["sweep", str(path), "--out", str(out), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err
    # same base, one more point: --resume runs only the new point
    grown = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [2, 4, 6]}}, name="grown.yaml")
    spec = sweep.load_spec(str(grown))
    run = sweep.run_sweep(spec, out, workers=1, resume=True, progress=False)
    assert (run.ran, run.skipped) == (1, 2)
    assert len(sweep.load_results(out)) == 3
    # a different base scenario (another seed) in the same folder
    other = copy.deepcopy(TINY)
    other["simulation"] = {"seed": 7}
    changed = write(tmp_path, grid, base=other, name="other.yaml")
    before = (out / sweep.RESULTS_FILE).read_bytes()
    assert cli.main(["sweep", str(changed), "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"results in {out} come from a different scenario; use another --out or delete it" in err
    assert (out / sweep.RESULTS_FILE).read_bytes() == before


def test_load_results_one_row_per_point_first_complete_line_wins(tmp_path):
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [2, 4, 6]}})
    out = tmp_path / "out"
    spec = sweep.load_spec(str(path))
    sweep.run_sweep(spec, out, workers=1, progress=False)
    lines = complete_lines(out / sweep.RESULTS_FILE)
    dup = dict(lines[0], ttft_ms_p99=-1.0)                # a later line for the same point
    with open(out / sweep.RESULTS_FILE, "a") as f:
        f.write(json.dumps(dup) + "\n" + json.dumps(lines[1])[:40])   # + a truncated last line
    df = sweep.load_results(out)
    assert len(df) == 3 and df["point_id"].is_unique
    assert list(df["point_id"]) == [p.point_id for p in spec.points]
    assert (df["ttft_ms_p99"] > 0).all()
    with pytest.raises(CapacityError, match="not a folder"):
        sweep.load_results(tmp_path / "nowhere")


# ---------------------------------------------------------------------- killed and resumed
def test_sigkill_part_way_then_resume_gives_every_point_once(tmp_path):
    grid = {"product": {"traffic.arrival.rate_rps": [2, 4, 6, 8], "deployment.gpu": ["MI300X", "MI355X"]},
            "zip": {"traffic.num_requests": [120, 160]}}
    path = write(tmp_path, grid)
    out = tmp_path / "out"
    results = out / sweep.RESULTS_FILE
    total = 16
    cmd = [sys.executable, "-m", "capacity", "sweep",
           str(path), "--out", str(out), "--workers", "2", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if results.is_file() and results.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read().decode()}"
        os.killpg(proc.pid, signal.SIGKILL)      # the sweep and its pool workers, as `kill -9` would
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stderr.close()
    first = complete_lines(results)
    assert 2 <= len(first) < total
    # a SIGKILL in the middle of a write leaves a partial last line: simulate one
    with open(results, "ab") as f:
        f.write(json.dumps(first[0]).encode()[:50])
    assert cli.main(["sweep", str(path), "--out", str(out), "--workers", "2", "--quiet"]) == 2   # needs --resume
    assert cli.main(["sweep", str(path), "--out", str(out), "--workers", "2", "--quiet", "--resume"]) == 0
    lines = complete_lines(results)              # every line complete, parseable JSON
    spec = sweep.load_spec(str(path))
    ids = [r["point_id"] for r in lines]
    assert sorted(ids) == sorted(p.point_id for p in spec.points)   # every grid point exactly once
    assert lines[: len(first)] == first          # earlier results kept as they were
    df = sweep.load_results(out)
    assert list(df["point_id"]) == [p.point_id for p in spec.points]
    # a resumed point has the same metrics as an uninterrupted run of it
    by_id = {r["point_id"]: r for r in lines}
    for p in (spec.points[0], spec.points[-1]):
        fresh = sweep.run_point(spec.base, p)
        assert metric_columns(by_id[p.point_id]) == metric_columns(fresh)


# ---------------------------------------------------------------------- the Dask backend
def test_dask_local_cluster_gives_the_same_results_as_the_process_pool(tmp_path):
    pytest.importorskip("distributed")
    grid = {"product": {"traffic.arrival.rate_rps": [2, 6], "deployment.gpu": ["MI300X", "MI355X"]},
            "zip": {"speculative.method": ["none", "ngram"], "speculative.num_speculative_tokens": [0, 3]}}
    spec = sweep.load_spec(str(write(tmp_path, grid)))
    sweep.run_sweep(spec, tmp_path / "local", workers=2, backend="local", progress=False)
    sweep.run_sweep(spec, tmp_path / "dask", workers=2, backend="dask", progress=False, dask_processes=False)
    local = {r["point_id"]: metric_columns(r) for r in sweep.ordered_rows(tmp_path / "local")}
    dask = {r["point_id"]: metric_columns(r) for r in sweep.ordered_rows(tmp_path / "dask")}
    assert len(local) == 8
    assert dask == local                         # same metrics, exactly, per point_id
    assert json.loads((tmp_path / "dask" / sweep.MANIFEST_FILE).read_text())["points"] == \
        json.loads((tmp_path / "local" / sweep.MANIFEST_FILE).read_text())["points"]


def test_unreachable_dask_scheduler_fails_fast(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "DASK_CONNECT_TIMEOUT_S", 1.0)
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [2, 4]}})
    t0 = time.monotonic()
    code = cli.main(["sweep", str(path), "--out", str(tmp_path / "o"), "--backend", "dask",
                       "--scheduler", "tcp://127.0.0.1:1", "--quiet"])
    assert code == 2 and time.monotonic() - t0 < 20
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_scheduler_needs_the_dask_backend(tmp_path, capsys):
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [2]}})
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "o"), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    assert "--backend dask" in capsys.readouterr().err


# ---------------------------------------------------------------------- wiring
def test_shipped_example_is_a_valid_grid_of_20_to_60_points():
    spec = sweep.load_spec("sweep_example")
    assert 20 <= len(spec.points) <= 60
    sweep.validate_points(spec)
    assert sweep.default_out(spec) == Path("reports") / f"sweep-{spec.name}"


def test_capacity_cli_has_the_sweep_command(tmp_path, capsys):
    from capacity import cli

    try:
        cli.build_parser().parse_args(["sweep", "x.yaml"])
    except SystemExit:
        pytest.skip("capacity/cli.py does not register `sweep` yet (add_sweep_parser)")
    capsys.readouterr()
    path = write(tmp_path, {"product": {"traffic.arrival.rate_rps": [1, 2]}})
    assert cli.main(["sweep", str(path), "--list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["points"] == 2
    assert cli.main(["sweep", str(write(tmp_path, {}, name="empty.yaml"))]) == 2
    assert "grid is empty" in capsys.readouterr().err
    import capacity

    assert capacity.load_results is sweep.load_results


def test_a_speculative_point_says_where_its_n_stops_paying():
    """Lower acceptance gains less per step, so the break-even batch cannot grow; a point without
    speculation has none."""
    base = {**copy.deepcopy(TINY), "deployment": {"gpu": "MI300X", "model": "google/gemma-4-31B-it"}}
    rows = {}
    for pid, alpha in (("hi", 0.8), ("lo", 0.5)):
        over = {"speculative.method": "gemma4_mtp", "speculative.num_speculative_tokens": 3,
                "speculative.acceptance": {"model": "iid", "alpha": alpha}}
        rows[pid] = sweep.run_point(base, sweep.Point(0, pid, over))
    plain = sweep.run_point(base, sweep.Point(0, "none", {}))
    assert rows["hi"]["error"] is None and rows["hi"]["spec_pays_up_to_running"] >= 1
    assert rows["lo"]["spec_pays_up_to_running"] <= rows["hi"]["spec_pays_up_to_running"]
    assert rows["lo"]["spec_step_speedup_at_mean_batch"] < rows["hi"]["spec_step_speedup_at_mean_batch"]
    assert plain["spec_pays_up_to_running"] is None
