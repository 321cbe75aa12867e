"""What the docs say of the code, held by tests: the test files they name exist, and `POLICIES` is the one
list of scheduling policies (docs/engine.md): whatever offers or runs policies by name reads it, so a
policy added there is offered and run everywhere without another line."""

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from scheduler.policies import POLICIES, Policy
from scheduler.request import Sequence, Status
from voicepipe.cli import build_parser
from voicepipe.simulate import seed
from voicepipe.simulate.scenario_cli import scenarios

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
TEST_PATH = re.compile(r"\btests/[\w./-]*?\.py\b")


class Newest(Policy):
    """A policy the registry did not have: running sequences first, then the newest request."""

    def priority(self, seq: Sequence, now: float) -> tuple:
        return (seq.status is not Status.RUNNING, -seq.arrival)


def test_every_test_file_the_docs_name_exists():
    named = {(doc.relative_to(ROOT).as_posix(), path) for doc in DOCS for path in TEST_PATH.findall(doc.read_text())}
    assert named, "the docs name no test file: the pattern no longer matches how they write paths"
    missing = sorted(f"{doc}: {path}" for doc, path in named if not (ROOT / path).is_file())
    assert not missing, "\n".join(missing)


def test_a_policy_added_to_the_registry_is_offered_and_run_by_simulate(monkeypatch):
    monkeypatch.setitem(POLICIES, "newest", Newest)
    parser = build_parser()
    args = parser.parse_args(["simulate"])
    assert args.policy.split(",") == list(POLICIES)  # every policy by default
    assert list(scenarios(args)) == list(POLICIES)
    assert list(scenarios(parser.parse_args(["simulate", "--policy", "newest"]))) == ["newest"]
    with pytest.raises(ValueError, match="choose from o4, fcfs, static, newest"):
        scenarios(parser.parse_args(["simulate", "--policy", "oldest"]))


def test_a_policy_added_to_the_registry_is_run_by_the_seed_experiment(monkeypatch):
    """Every policy in the registry gets its capacity, sweep, goodput and voice rows (the runs stubbed)."""
    monkeypatch.setitem(POLICIES, "newest", Newest)
    ran: list[tuple[str, dict]] = []

    def simulate(scenario, target) -> dict:
        ran.append((scenario.policy, scenario.engine))
        figures = defaultdict(lambda: 1.0)
        return {"text": figures, "calls": figures, "saturated": None, "duration_s": 1.0, "steps": 1, "wall_s": 0.0}

    monkeypatch.setattr(seed, "simulate", simulate)
    report = seed.experiment(quick=True)
    assert {policy for policy, _ in ran} == set(POLICIES)
    for device in report["devices"].values():
        assert list(device["capacity"]) == list(device["goodput_per_s"]) == list(POLICIES)
        assert {row["policy"] for row in device["sweep"]} == set(POLICIES)
    assert list(report["voice"]["most_calls"]) == [*POLICIES, "o4-tokens", "o4-gpu-tokens", "o4-lane"]


def restated(node: ast.AST, names: set[str]) -> bool:
    """A literal that lists every registered policy: a tuple, list or set of the names, or "a,b,c"."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return len(items) == len(node.elts) and set(items) == names
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return set(re.split(r"[\s,]+", node.value.strip())) == names
    return False


def test_no_module_restates_the_policy_names():
    names = set(POLICIES)
    found = [f"{path.relative_to(ROOT)}:{node.lineno}"
             for package in ("voicepipe", "scheduler") for path in sorted((ROOT / package).rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if restated(node, names)]
    assert not found, f"read scheduler.policies.POLICIES (or call_policies()) instead: {', '.join(found)}"
