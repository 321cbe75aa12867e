"""The Prometheus rules and the Grafana dashboard against the metrics the engine really exposes.

A typo in a metric or label name does not fail in Prometheus or Grafana: the query just returns nothing and
the alert never fires. So every expression is checked here against the engine's own registry, with
promtool where it is installed and with a small PromQL reader that always runs.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from scheduler.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "voicepipe" / "monitoring" / "prometheus-rules.yml"
DASHBOARD = ROOT / "voicepipe" / "monitoring" / "grafana-dashboard.json"
RULES_TEST = ROOT / "tests" / "data" / "prometheus-rules-test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

# Labels Prometheus adds to every scraped series, and the bucket bound of histograms.
TARGET_LABELS = {"job", "instance"}
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created")}
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
    "label_replace", "last_over_time", "ln", "max_over_time", "min_over_time", "predict_linear",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt", "sum_over_time",
    "time", "timestamp", "vector",
    "avg", "bottomk", "count", "count_values", "group", "max", "min", "quantile", "stddev", "stdvar", "sum", "topk",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
            "inf", "nan"}


@pytest.fixture(scope="module")
def exposed() -> dict[str, set[str]]:
    """Every sample name the server's registry can expose (the engine's metrics, and those the calls and
    the server register on it), with the label names it carries.

    Labelled metrics have no samples until first used, so names come from each family's type (as the
    exposition format spells them) and labels from the metric objects themselves.
    """
    from voicepipe.pipeline.turn_metrics import turn_metrics
    from voicepipe.server.metrics import call_metrics

    metrics = Metrics()
    sources = (metrics, turn_metrics(metrics.registry), call_metrics(metrics.registry))
    labels = {}
    for wrapper in [w for source in sources for w in vars(source).values()]:
        if isinstance(wrapper, MetricWrapperBase):
            for family in wrapper.describe():
                labels[family.name] = set(wrapper._labelnames)
    names: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for suffix in SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            names[family.name + suffix] = labels[family.name] | extra | TARGET_LABELS
        for sample in family.samples:  # what the client really writes, in case a name rule changes
            names.setdefault(sample.name, set(sample.labels) | TARGET_LABELS)
    return names


def parse(expr: str) -> tuple[set[str], list[tuple[str, set[str]]], set[str]]:
    """Read a PromQL (or Grafana-templated PromQL) expression: (metric names, selectors, grouping labels).

    A selector is (metric name, label names in its matchers). Functions and keywords must be known words,
    so a misspelt function fails too.
    """
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # label values and other strings
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors, including Grafana's $__rate_interval
    selectors = [(name, set(re.findall(r"([A-Za-z_]\w*)\s*[=!]~?", body)))
                 for name, body in re.findall(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}", text)]
    grouping = set()
    for body in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        grouping |= {w.strip() for w in body.split(",") if w.strip()}
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\$\w+", "", text)
    text = re.sub(r"(?<![\w:.])\d+(\.\d+)?([eE][+-]?\d+)?", "", text)  # numbers
    names = set()
    for word, call in re.findall(r"([A-Za-z_:][\w:]*)\s*(\(?)", text):
        if word.lower() in KEYWORDS:
            continue
        if call:
            assert word in FUNCTIONS, f"unknown function {word!r} in {expr!r}"
        else:
            names.add(word)
    names |= {name for name, _ in selectors}
    return names, selectors, grouping


def check_expr(expr: str, exposed: dict[str, set[str]], recorded: dict[str, set[str]]) -> None:
    """Every metric exists, every matcher names a label that metric has, every grouping label exists."""
    known = exposed | recorded
    names, selectors, grouping = parse(expr)
    assert names, f"no metric in {expr!r}"
    unknown = names - set(known)
    assert not unknown, f"{expr!r} uses {sorted(unknown)}, which the engine does not expose"
    for name, matched in selectors:
        assert matched <= known[name], f"{expr!r}: {name} has no label {sorted(matched - known[name])}"
    available = set().union(*(known[n] for n in names))
    assert grouping <= available, f"{expr!r} groups by {sorted(grouping - available)}, which no metric has"


def load_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert groups
    return [rule for group in groups for rule in group["rules"]]


def recorded_labels(exposed: dict[str, set[str]]) -> dict[str, set[str]]:
    """Recorded series, with a generous label set (what they keep depends on the aggregation)."""
    every = set().union(*exposed.values())
    return {rule["record"]: every for rule in load_rules() if "record" in rule}


def test_registry_names_are_what_the_rules_rely_on(exposed: dict[str, set[str]]) -> None:
    """Guards the fallback reader itself: it must know the exposition format's suffixes."""
    assert "voicepipe_time_to_first_token_seconds_bucket" in exposed
    assert "cls" in exposed["voicepipe_time_to_first_token_seconds_bucket"]
    assert "voicepipe_turn_deadlines_total" in exposed
    assert "voicepipe_kv_fragmentation_ratio" in exposed
    assert "voicepipe_kv_fragmentation_ratio_total" not in exposed


def test_reader_catches_mistakes(exposed: dict[str, set[str]]) -> None:
    for bad in ('rate(voicepipe_turn_deadline_total[5m])',  # missing s
                'voicepipe_kv_fragmentation_ratio{class="REALTIME"}',  # no such label
                'sum by (class) (rate(voicepipe_generation_tokens_total[5m]))',
                'histogram_quantile(0.99, rate(voicepipe_time_to_first_audio_seconds[5m]))',  # no _bucket
                'rat(voicepipe_steps_total[5m])'):
        with pytest.raises(AssertionError):
            check_expr(bad, exposed, {})


def test_rules_parse_and_use_exposed_metrics(exposed: dict[str, set[str]]) -> None:
    rules = load_rules()
    recorded = recorded_labels(exposed)
    for rule in rules:
        assert ("record" in rule) != ("alert" in rule), rule
        check_expr(rule["expr"], exposed, recorded)
    records = [r["record"] for r in rules if "record" in r]
    assert len(records) == len(set(records)), "a recording rule is defined twice"
    for wanted in ("job_cls:voicepipe_time_to_first_token_seconds:p99_5m",
                   "job:voicepipe_time_to_first_audio_seconds:p99_5m",
                   "instance:voicepipe_kv_fragmentation_ratio:avg_5m",
                   "instance:voicepipe_turn_deadline_miss_ratio:rate5m"):
        assert wanted in records


def test_alerts_wait_five_minutes_and_say_why() -> None:
    alerts = {r["alert"]: r for r in load_rules() if "alert" in r}
    assert {"VoicepipeKVFragmentationHigh", "VoicepipeDeadlineMissRateHigh"} <= set(alerts)
    for name, alert in alerts.items():
        assert alert.get("for") == "5m", name
        assert alert["labels"]["severity"] in {"warning", "critical"}, name
        assert alert["annotations"]["summary"], name
    assert re.search(r"voicepipe_kv_fragmentation_ratio\s*>\s*0\.15\b", alerts["VoicepipeKVFragmentationHigh"]["expr"])


def test_dashboard_loads_and_uses_exposed_metrics(exposed: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p.get("targets") for p in panels), "a panel without a query"
    for expr in exprs:
        check_expr(expr, exposed, {})
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            check_expr(var["definition"].removeprefix("label_values(").split(",")[0], exposed, {})
    used = set().union(*(parse(e)[0] for e in exprs))
    for family in ("voicepipe_time_to_first_token_seconds_bucket", "voicepipe_inter_token_latency_seconds_bucket",
                   "voicepipe_time_to_first_audio_seconds_bucket", "voicepipe_turn_deadlines_total",
                   "voicepipe_audio_underruns_total", "voicepipe_generation_tokens_total",
                   "voicepipe_kv_cache_usage_ratio", "voicepipe_kv_fragmentation_ratio",
                   "voicepipe_preemptions_total", "voicepipe_step_tokens_total"):
        assert family in used, f"the dashboard does not show {family}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    """The fragmentation alert fires after 5 minutes above 15% and not at or below it (and the others)."""
    result = subprocess.run([PROMTOOL, "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
