"""The `capacity` command line. Each sub-command is a thin shell over a library function.

Errors a user can fix (CapacityError) print one line and exit 2, without a traceback.

Each command imports the layers it needs inside its own function, on purpose: `capacity hardware`
or `capacity methods` should not pay for the simulator, pandas, scipy or plotly (a cold start
is mostly imports), and building the parser imports nothing of the package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capacity.errors import CapacityError
from capacity.util.jsonio import print_json


# ---------------------------------------------------------------------- commands
def cmd_simulate(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import summary

    sc = scenario_mod.load(args.scenario, args.set)
    if args.seed is not None:
        sc.simulation.seed = args.seed
    result = summary.run_with_comparison(sc, compare=not args.no_compare)
    payload = summary.simulation_payload(result)
    if args.out:
        summary.write_simulation(result, payload, Path(args.out))
    if args.json:
        print_json(payload)
    else:
        print(summary.simulation_summary(result))
        if args.out:
            print(f"\nwrote {args.out}/result.json, requests.csv, scenario.yaml")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.studies import plan

    result = plan.run(args.scenario, args.set, workers=args.workers, progress=not args.json)
    if args.out:
        plan.write(result, Path(args.out))
    if args.json:
        print_json(result.to_json())
    else:
        print(plan.summary_text(result))
        if args.out:
            print(f"\nwrote {args.out}/plan.json, recommended.yaml, one_fewer_replica.yaml")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.inputs.hardware import list_gpus
    from capacity.inputs.step_cost_fidelity import transferred_from

    gpus = list_gpus()
    if args.json:
        print_json([g.to_dict() for g in gpus])
        return 0
    head = (f"{'GPU':8} {'bf16 TF':>8} {'fp8 TF':>8} {'fp4 TF':>8} {'HBM GB':>7} {'TB/s':>5} {'scale-up GB/s':>13} {'W':>5} "
            f"{'$/h':>5}  efficiency (gemm/hbm/allreduce, overhead ms)  TPOT error, a left-out model (median/p90)")
    print(head)
    for g in gpus:
        p = g.peak_dense_tflops
        e = g.efficiency
        fp4 = f"{p['fp4']:.0f}" if "fp4" in p else "-"
        lomo = g.cross_validation.get("leave_one_model_out")
        sibling = transferred_from(g)
        check = g.transfer_check.get("errors")
        error = (f"{lomo['tpot_pct'][0]:.0f}/{lomo['tpot_pct'][1]:.0f} %" if lomo
                 else f"{check['tpot_pct'][0]:.0f}/{check['tpot_pct'][1]:.0f} % ({sibling}'s values on its rows)" if check
                 else f"not measured ({sibling}'s values)" if sibling else "not measured")
        line = (f"{g.name:8} {p.get('bf16', 0):8.0f} {p.get('fp8', 0):8.0f} {fp4:>8} {g.hbm_capacity_gb:7.0f} "
                f"{g.hbm_bandwidth_tb_s:5.1f} {g.scaleup_bandwidth_gb_s:13.0f} {g.board_power_w:5.0f} "
                f"{g.cost_per_gpu_hour_usd:5.2f}  {e['gemm']:.2f}/{e['hbm']:.2f}/{e['allreduce']:.2f}, "
                f"{e['step_overhead_ms']:.2f}")
        print(line.ljust(head.index("TPOT error")) + error)
    print("\nsources and bases: capacity hardware --json, or hw_profiles/*.yaml; the errors: each profile's cross_validation")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.inputs.models import list_models

    models = list_models()
    if args.json:
        print_json([m.to_dict() for m in models])
        return 0
    print(f"{'model':48} {'role':6} {'params B':>9} {'active B':>9} {'weights GB':>10} {'KV B/token':>10}  layers")
    for m in models:
        kinds = []
        if m.num_full_attention_layers:
            kinds.append(f"{m.num_full_attention_layers} {'MLA' if m.uses_mla else 'full'}")
        if m.num_sliding_attention_layers:
            kinds.append(f"{m.num_sliding_attention_layers} SWA-{m.sliding_window}")
        if m.num_linear_attention_layers:
            kinds.append(f"{m.num_linear_attention_layers} linear")
        moe = f", {m.num_experts}x top-{m.experts_per_token}" if m.num_experts else ""
        print(f"{m.name:48} {m.role:6} {m.params_total / 1e9:9.2f} {m.params_active / 1e9:9.2f} "
              f"{m.weight_bytes_total / 1e9:10.1f} {m.kv_bytes_per_token:10,.0f}  {' + '.join(kinds)}{moe} ({m.weight_precision})")
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.spec.methods import methods_table

    table = methods_table()
    if args.json:
        print_json(table)
        return 0
    for m in table:
        print(f"{m['name']:12} {m['label']}: {m['description']}")
        print(f"{'':12} cost per step: {m['cost_structure']}")
        print(f"{'':12} lookahead: {m['lookahead']}; N: {m['max_num_speculative_tokens']}")
    print("\nfull details, parameters and sources: capacity methods --json, capacity/data/methods.yaml")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.measurements import readers
    from capacity.fidelity import serving as validate
    from capacity.fidelity import speedups as validate_spec

    files = list(args.measurements or [])
    payload: dict = {}
    texts = []
    spec_files: list = []
    serving_rows = None
    if files:
        gpu = args.gpu[0] if len(args.gpu) == 1 and args.gpu[0] != "all" else None
        meas = readers.load(files, readers.Overrides(gpu=gpu, tp=args.tp, model=args.model))
        spec_files = [str(p) for p in meas.spec_files]
        serving_rows = meas.serving
        if meas.acceptance:
            payload["acceptance"] = [{**r.to_json(), "config": readers.acceptance_config(r)} for r in meas.acceptance]
            for r in meas.acceptance:
                texts.append(f"Acceptance from {r.source}: N={r.num_spec_tokens}, {r.num_drafts:.0f} drafts, mean "
                             f"acceptance length {r.mean_acceptance_length:.3f}; P(accepted >= k) = "
                             + ", ".join(f"{x:.3f}" for x in r.marginal))
    if (serving_rows is not None and not serving_rows.empty) or not files:
        if serving_rows is not None and args.gpu and args.gpu != ["all"]:
            wanted = {g.upper() for g in args.gpu}
            serving_rows = serving_rows[serving_rows["gpu"].astype(str).str.upper().isin(wanted)].reset_index(drop=True)
        report = validate.run(None, workers=args.workers, max_rows=args.max_rows, progress=not args.quiet,
                              gpus=args.gpu or None, rows=serving_rows)
        if args.out:
            validate.write(report, Path(args.out))
        payload.update(report.to_json())
        texts.append(report.summary_text())
    if spec_files or args.spec:
        spec = validate_spec.run(spec_files or None, workers=args.workers, progress=not args.quiet)
        if args.out:
            validate_spec.write(spec, Path(args.out))
        payload["speculative"] = spec.to_json()
        texts.append(spec.summary_text())
    if args.json:
        print_json(payload)
    else:
        print("\n\n".join(texts))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.fidelity import calibrate

    result = calibrate.run(args.files or None, gpu=args.gpu, out=args.out, holdout=args.holdout,
                           progress=not args.quiet, tp=args.tp, model=args.model, sets=args.set,
                           rounds=args.rounds, workers=args.workers, cross_validate=not args.no_cross_validation,
                           hold=tuple(args.hold), fit_also=tuple(args.fit),
                           **({} if not args.prior_weight
                              else {"prior_weight": calibrate.parse_prior_weight(args.prior_weight)}))
    if args.json:
        print_json(result.to_json())
    else:
        print(result.summary_text())
    return 0


# ---------------------------------------------------------------------- parser
def cmd_sweep(args: argparse.Namespace) -> int:
    # the command's own layers, imported on use (module docstring)
    from capacity.studies.sweep import (RESULTS_FILE, default_out, load_spec, points_table, results_table, run_sweep,
                                        validate_points)

    spec = load_spec(args.scenario)
    if args.list:
        validate_points(spec)
        if args.json:
            print_json({"points": len(spec.points),
                        "grid": [{"point_id": p.point_id, "overrides": p.overrides} for p in spec.points]})
        else:
            print(f"sweep {spec.name}: {len(spec.points)} points ({spec.source})")
            print(points_table(spec))
        return 0
    out = Path(args.out) if args.out else default_out(spec)
    run = run_sweep(spec, out, workers=args.workers, backend=args.backend, scheduler=args.scheduler,
                    resume=args.resume, progress=not args.quiet)
    rows = run.rows()
    if args.json:
        print_json({"points": len(spec.points), "results": rows})
        return 0
    errors = sum(1 for r in rows if r.get("error"))
    print(f"sweep {spec.name}: {len(spec.points)} points, {run.ran} run now in {run.wall_time_s:.1f} s"
          + (f", {run.skipped} from earlier" if run.skipped else "") + (f", {errors} with errors" if errors else ""))
    print(results_table(spec, rows))
    print(f"\nresults: {out / RESULTS_FILE} (capacity.load_results('{out}') gives a DataFrame)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capacity", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="simulate one scenario (default: the built-in chatbot scenario)")
    s.add_argument("scenario", nargs="?", help="scenario YAML path or shipped name (default: default)")
    s.add_argument("--seed", type=int)
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, e.g. --set deployment.replicas=4 (repeatable)")
    s.add_argument("--out", help="write result.json, requests.csv and the resolved scenario here")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--no-compare", action="store_true",
                   help="with speculation on, do not also simulate the same traffic without it")
    s.set_defaults(func=cmd_simulate)

    pl = sub.add_parser("plan", help="how many GPUs, which ones, with which speculative decoding (default scenario)")
    pl.add_argument("scenario", nargs="?", help="scenario YAML with a plan section (default: default)")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    pl.add_argument("--workers", type=int, default=None)
    pl.add_argument("--out", help="write plan.json, recommended.yaml, one_fewer_replica.yaml and evidence here")
    pl.add_argument("--json", action="store_true")
    pl.set_defaults(func=cmd_plan)

    h = sub.add_parser("hardware", help="list GPU profiles")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=cmd_hardware)

    m = sub.add_parser("models", help="list model architectures")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_models)

    me = sub.add_parser("methods", help="list speculative-decoding drafting methods and their cost structure")
    me.add_argument("--json", action="store_true")
    me.set_defaults(func=cmd_methods)

    v = sub.add_parser("validate", help="predict measured rows and report the error")
    v.add_argument("measurements", nargs="*",
                   help="vllm bench serve --save-result JSON, /metrics dumps, vLLM logs, serving or speculative CSV "
                        "files, detected from their content (default: the shipped calibration rows)")
    v.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size of vLLM result files without --metadata tensor_parallel_size")
    v.add_argument("--model", default=None, help="model of vLLM result files (overrides their model_id)")
    v.add_argument("--measurements", dest="measurements_opt", action="append", default=[], help=argparse.SUPPRESS)
    v.add_argument("--workers", type=int, default=2)
    v.add_argument("--max-rows", type=int, default=None, help="validate only the first N modelled rows (quick check)")
    v.add_argument("--gpu", action="append", default=[],
                   help="only rows of this GPU (repeatable; 'all' for every row); default without files: "
                        "the GPUs with calibrated profiles. With vLLM result files: the GPU they ran on, a "
                        "profile name or a profile YAML (e.g. one written by capacity calibrate --out), "
                        "which the rows are then simulated on")
    v.add_argument("--spec", action="store_true",
                   help="also predict the shipped seed-article speculative-decoding rows (several minutes)")
    v.add_argument("--out", help="write rows.csv and summary.json here")
    v.add_argument("--json", action="store_true")
    v.add_argument("--quiet", action="store_true")
    v.set_defaults(func=cmd_validate)

    c = sub.add_parser("calibrate", help="fit a GPU's efficiency parameters to serving measurements")
    c.add_argument("files", nargs="*",
                   help="vllm bench serve --save-result JSON, /metrics dumps, vLLM logs or serving CSV files "
                        "(default: the shipped calibration rows)")
    c.add_argument("--gpu", required=True, help="GPU the runs were measured on (profile name or YAML path)")
    c.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size of vLLM result files without --metadata tensor_parallel_size")
    c.add_argument("--model", default=None, help="model of vLLM result files (overrides their model_id)")
    c.add_argument("--set", action="append", default=[], metavar="COLUMN=VALUE",
                   help="fill a measurement column for every row, e.g. --set precision=fp8 (repeatable)")
    c.add_argument("--rounds", type=int, default=None,
                   help="re-record the schedules at the fitted values and refit this many times in all "
                        "(default: 2 with a request delay or open-loop runs, else 1)")
    c.add_argument("--prior-weight", action="append", default=[], metavar="[KEY=]W",
                   help="pull of the fraction efficiencies toward the profile's microbenchmark ratios "
                        "(default: calibrate.PRIOR_WEIGHT; 0 fits the runs alone); KEY=W sets one anchor's "
                        "(gemm, hbm, attention, allreduce; repeatable)")
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--out", help="write the fitted profile YAML here (nothing is written without it); with "
                                 "spec-decode metrics also OUT.acceptance.yaml")
    c.add_argument("--holdout", type=float, default=0.0, help="fraction of rows kept out of the fit")
    c.add_argument("--hold", action="append", default=[], metavar="KEY",
                   help="keep this efficiency parameter at the profile's value instead of fitting it, e.g. "
                        "--hold prompt_token_overhead_us (repeatable; an ablation of one cost term)")
    c.add_argument("--fit", action="append", default=[], metavar="KEY",
                   help="also fit this opt-in parameter, e.g. --fit moe_token_overhead_ns (a term not every profile "
                        "ships; one the profile already has is fitted without it; repeatable)")
    c.add_argument("--no-cross-validation", action="store_true",
                   help="fit only: skip leave-one-model-out and leave-one-TP-size-out (about half the time)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=cmd_calibrate)

    s = sub.add_parser(
        "sweep", help="simulate a scenario over a grid of overrides (its sweep: section), in parallel and resumably",
        description="Simulate every point of a scenario's sweep: grid (product and zip of dotted keys). "
                    "Each finished point is appended to DIR/results.jsonl; --resume runs only what is missing.")
    s.add_argument("scenario", help="sweep scenario YAML path or shipped name (e.g. sweep_example)")
    s.add_argument("--out", metavar="DIR", help="results folder (default: reports/sweep-<scenario name>)")
    s.add_argument("--workers", type=int, default=None, metavar="N",
                   help="parallel simulations (default: the number of CPUs; dask: workers of the local cluster)")
    s.add_argument("--backend", choices=("local", "dask"), default="local",
                   help="local: a process pool; dask: a dask.distributed cluster (--scheduler, or a local one)")
    s.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    s.add_argument("--resume", action="store_true", help="continue the sweep in --out: run only missing points")
    s.add_argument("--list", action="store_true", help="print the grid's points without running them")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    r = sub.add_parser("report", help="HTML report (and PNG/SVG figures) of a simulate, validate, sweep or plan folder")
    r.add_argument("results", nargs="?", help="folder written by --out of capacity simulate, validate, sweep or plan")
    r.add_argument("--out", help="HTML file to write (default: RESULTS/report.html)")
    r.add_argument("--png", metavar="DIR", help="also write every figure as PNG and SVG, and summary.md, here")
    r.add_argument("--explainer", metavar="FILE.html", help="write the interactive draft-and-verify view alone")
    r.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    # plotly and pandas: imported only when a report is made
    from capacity.report.build import write_report
    from capacity.report.explainer import write_explainer

    if not args.results and not args.explainer:
        raise CapacityError("give a results folder (capacity report RESULTS) or --explainer FILE.html")
    if args.explainer:
        path = write_explainer(args.explainer)
        print(f"wrote {path}")
    if args.results:
        rep, out = write_report(args.results, args.out, args.png)
        print(f"wrote {out} ({rep.kind} report, {len(rep.figures)} figures + draft-and-verify view)")
        for title, why in rep.skipped:
            print(f"  not drawn: {title}: {why}")
        if args.png:
            print(f"wrote {args.png}/summary.md and {len(rep.figures) + 1} figures as PNG and SVG")
    return 0


def check_options(args: argparse.Namespace) -> None:
    """Option values argparse's types let through but no command can use (one line each)."""
    def whole(name: str, low: int, high: int, flag: str) -> None:
        value = getattr(args, name, None)
        if value is not None and not low <= value <= high:
            raise CapacityError(f"{flag} {value}: give a whole number from {low} to {high:,}")
    whole("seed", 0, 2**63 - 1, "--seed")
    whole("workers", 1, 1024, "--workers")
    whole("tp", 1, 64, "--tp")
    whole("max_rows", 1, 10**9, "--max-rows")
    whole("rounds", 1, 20, "--rounds")
    for name in ("gpu", "model", "scenario", "results", "scheduler"):
        values = getattr(args, name, None)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and (len(value) > 4096 or any(len(p) > 255 for p in value.split("/"))):
                label = f"--{name}" if name in ("gpu", "model", "scheduler") else name.upper()
                raise CapacityError(f"{label} '{value[:100]}...': {len(value):,} characters; give a name or path of "
                                    f"at most 255 characters per path component")
    out = getattr(args, "out", None)
    if out is not None:
        path = Path(out)
        try:
            folder = args.command in ("simulate", "plan", "validate", "sweep")
            if folder and path.exists() and not path.is_dir():
                raise CapacityError(f"--out {out}: a file of that name exists; give a folder (new or existing)")
            if not folder and path.is_dir():
                raise CapacityError(f"--out {out}: a folder of that name exists; give a file name")
        except OSError as exc:   # e.g. a name too long for the file system
            raise CapacityError(f"--out: cannot use that path ({exc.strerror or exc}); give a shorter one") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "measurements_opt", None):
        args.measurements = list(args.measurements) + args.measurements_opt
    try:
        check_options(args)
        return int(args.func(args) or 0)
    except CapacityError as e:
        fresh_line = "\r\033[K" if sys.stderr.isatty() else ""      # past a progress line being rewritten
        msg = " ".join(str(e).split())           # one line, whatever the message
        if len(msg) > 1000:                       # a value echoed in full somewhere: keep the line readable
            msg = f"{msg[:600]} ... (message cut, {len(msg):,} characters)"
        print(f"{fresh_line}capacity: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("capacity: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
