"""The simulator's checks as `voicepipe simulate` runs them: each prints its table and may write JSON."""

import argparse

from voicepipe.simulate.report import save


def calibrate(args: argparse.Namespace) -> int:
    from voicepipe.simulate.calibrate import calibrate as fit_cpu
    from voicepipe.simulate.calibrate import print_fit
    from voicepipe.simulate.costs import machine_fit_path

    fit = fit_cpu()
    print_fit(fit)
    print(f"written to {machine_fit_path()}")
    if args.json:
        save({"coefficients": fit.coefficients, "about": fit.about}, args.json)
    return 0


def validate(args: argparse.Namespace) -> int:
    from voicepipe.simulate.cpu_runs import QUICK
    from voicepipe.simulate.validate import print_validation
    from voicepipe.simulate.validate import validate as run_validation

    report = run_validation(QUICK if args.quick else None)
    print_validation(report)
    if args.json:
        save(report, args.json)
    return 0


def seed(args: argparse.Namespace) -> int:
    from voicepipe.simulate.seed import experiment, print_experiment

    report = experiment(args.quick)
    print_experiment(report)
    if args.json:
        save(report, args.json)
    return 0


def public(args: argparse.Namespace) -> int:
    from scheduler.sim import Efficiency
    from voicepipe.simulate.public import compare, print_comparison

    rows = compare(Efficiency.band()[args.efficiency])
    print_comparison(rows)
    if args.json:
        save({"efficiency": args.efficiency, "rows": rows}, args.json)
    return 0
