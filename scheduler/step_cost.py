"""A step-cost model fitted to measured steps of a device at hand: a linear sum of a step's counts; and
the engine's own, fitted online to the steps it runs, which the planner sizes steps by.

`seconds = a + b*tokens + c*samples + d*seqs + e*attention_pairs + f*context_tokens`, the form DistServe
fits for prefill and decode (a constant, a term per token, a term per attention pair) with the terms the
engine's host work adds: per sequence (page tables, metadata) and per sampled row (the output head and
sampling, large on a CPU for a 49k vocabulary). The target is the driver's step time, plan to outputs, so
the planner's and postprocessing's host time is priced with the model's.

Fitted by least squares on relative errors (a 20 ms decode step matters as much as a 2 s prompt step: the
latencies are made of both), robustly: a term that comes out negative has no physical meaning and is
dropped, and steps more than 4 scaled MADs off (another process took the cores) are left out and the fit
redone.
"""

import json
import logging
import math
import os
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scheduler.step_shape import StepShape

log = logging.getLogger(__name__)
TERMS = ("const", "tokens", "samples", "seqs", "attention_pairs", "context_tokens")
COMPUTE_TERMS = ("tokens", "attention_pairs")


def features(step: StepShape) -> list[float]:
    return [1.0, step.tokens, step.samples, step.seqs, step.attention_pairs, step.context_tokens]


@dataclass
class FittedCost:
    coefficients: dict[str, float]
    about: dict = field(default_factory=dict)  # what it was fitted on: model, precision, machine, runs, errors

    def step_seconds(self, step: StepShape) -> float:
        return float(sum(self.coefficients.get(t, 0.0) * x for t, x in zip(TERMS, features(step), strict=True)))

    @classmethod
    def fit(cls, steps: list[StepShape], seconds: list[float], about: dict | None = None) -> "FittedCost":
        y = np.array(seconds, dtype=float)
        x = np.array([features(s) for s in steps], dtype=float) / y[:, None]  # rows scaled: relative errors
        ones = np.ones(len(y))
        keep = np.ones(len(y), dtype=bool)
        coef = nonnegative_lstsq(x, ones)
        for _ in range(3):
            residual = x @ coef - 1
            mad = np.median(np.abs(residual - np.median(residual))) * 1.4826
            keep = np.abs(residual - np.median(residual)) <= 4 * max(mad, 1e-3)
            coef = nonnegative_lstsq(x[keep], ones[keep])
        predicted = (x @ coef) * y
        relative = np.abs(predicted - y) / y
        info = {**(about or {}), "steps": len(y), "outliers_left_out": int((~keep).sum()),
                "relative_error_p50": float(np.median(relative[keep])),
                "relative_error_p90": float(np.percentile(relative[keep], 90)),
                "total_time_error": float(predicted[keep].sum() / y[keep].sum() - 1)}
        return cls(dict(zip(TERMS, map(float, coef), strict=True)), info)

    def parts(self, step: StepShape) -> tuple[float, float]:
        """The step's price split into its compute terms (per token, per attention pair: the products) and the
        rest (per step, per sequence, per row, per context token: weights and keys read, host work)."""
        terms = dict(zip(TERMS, features(step), strict=True))
        compute = sum(self.coefficients.get(t, 0.0) * terms[t] for t in COMPUTE_TERMS)
        return compute, self.step_seconds(step) - compute

    def rescaled(self, compute: float, rest: float) -> "FittedCost":
        """The same machine running slower or faster, its products by `compute` and the rest by `rest`: other
        processes on the cores take more of the memory bandwidth a decode needs than of a prompt's products."""
        return FittedCost({t: c * (compute if t in COMPUTE_TERMS else rest) for t, c in self.coefficients.items()},
                          {**self.about, "rescaled": {"compute": compute, "rest": rest}})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"coefficients": self.coefficients, "about": self.about}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FittedCost":
        data = json.loads(Path(path).read_text())
        return cls(data["coefficients"], data.get("about", {}))


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares, refitted without the most negative term until none is negative."""
    active = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        if active:
            coef[active] = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return coef
        active.remove(min(negative, key=lambda i: coef[i]))


class OnlineCost:
    """What a step will take, fitted to the engine's own steps as it runs them (on the machine at hand, the
    model and precision it serves, its threads; in the simulator, the priced device): refitted every
    `refit_every` steps over the last `window`, so it follows the machine as it is now. Not `ready` until
    its steps include both prompts and decodes, which the terms need to be told apart.

    Its form is the linear sum above with a knee on the tokens: a step's tokens cost nothing extra until
    `knee` of them (a GPU reads its weights once a step, and is bound by that until a step carries enough
    tokens to be bound by its arithmetic; a CPU is bound by arithmetic from the first token: its knee is 0).
    The knee is the one of `KNEES` that fits best; every step counts by its relative error, as the machine
    fit's do. The worst tenth of the steps (another process took the cores) is left out of the final fit.
    """

    KNEES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

    def __init__(self, window: int = 512, refit_every: int = 32, min_each: int = 8, kept_at: str | None = None,
                 save_every_s: float = 60.0) -> None:
        self.shapes: deque[StepShape] = deque(maxlen=window)
        self.seconds: deque[float] = deque(maxlen=window)
        self.refit_every, self.min_each = refit_every, min_each
        self.coefficients = (0.0,) * len(TERMS)
        self.knee = 0
        self.fitted: dict | None = None  # the last fit: its coefficients, knee, steps and errors
        self._since = 0
        # A fit is kept once it has read a quarter of its window: a start that ran a few dozen steps (a short
        # test, a bench's first moments) does not replace one that read hundreds.
        self.kept_at, self.save_every_s, self.keep_steps = kept_at, save_every_s, max(min_each * 2, window // 4)
        self._saved_at = time.monotonic()
        self._resumed = False  # the fit in force is the kept one, not yet refitted here
        self._warned = False
        if kept_at:
            self.resume(kept_at)

    @property
    def ready(self) -> bool:
        return self.fitted is not None

    def observe(self, step: StepShape, seconds: float) -> None:
        if seconds <= 0:
            return
        self.shapes.append(step)
        self.seconds.append(seconds)
        self._since += 1
        if self._since >= self.refit_every and self._varied():
            self._since = 0
            self._refit()

    def predict(self, tokens: int, samples: int, seqs: int, pairs: int, context: int) -> float:
        """A step's seconds from its counts (the planner's tally as it packs; zero before the first fit)."""
        const, per_token, per_sample, per_seq, per_pair, per_context = self.coefficients
        return (const + per_token * max(0, tokens - self.knee) + per_sample * samples + per_seq * seqs
                + per_pair * pairs + per_context * context)

    def step_seconds(self, step: StepShape) -> float:
        """A whole step's price: what the simulator reads of a kept fit."""
        _, *counts = features(step)
        return self.predict(*counts)

    def save(self) -> None:
        """Keep the last fit made here at `kept_at` (written whole, then moved into place: a reader never
        sees half of it); nothing when none is kept, when the fit in force is the kept one, or when it read
        fewer than `keep_steps` steps."""
        if not self.kept_at or self.fitted is None or self._resumed or self.fitted["steps"] < self.keep_steps:
            return
        self._saved_at = time.monotonic()
        target = Path(self.kept_at)
        partial = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=target.parent, suffix=".tmp", delete=False) as f:
                partial = Path(f.name)
                f.write(json.dumps(self.fitted, indent=2) + "\n")
            os.replace(partial, target)
        except OSError as exc:  # a read-only or full cache: the engine serves on, and learns again next start
            if partial is not None:
                partial.unlink(missing_ok=True)
            if not self._warned:
                self._warned = True
                log.warning("cannot keep the step-cost fit at %s: %s", target, exc)

    def resume(self, path: str | Path) -> bool:
        """Start from a fit kept by an earlier run on the same machine and model, so the first steps are
        sized by time too; the engine's own steps refit it as they come. False where none is kept or it
        cannot be used (unreadable, a term missing, negative or not finite): a fresh start."""
        try:
            kept = json.loads(Path(path).read_text())
            coefficients = tuple(float(kept["coefficients"][t]) for t in TERMS)
            knee = int(kept["knee_tokens"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if not all(math.isfinite(c) and c >= 0 for c in coefficients) or knee < 0:
            return False
        self.coefficients, self.knee, self.fitted, self._resumed = coefficients, knee, kept, True
        return True

    def _varied(self) -> bool:
        prompts = sum(1 for s in self.shapes if s.prefill_tokens >= 16)
        return prompts >= self.min_each and len(self.shapes) - prompts >= self.min_each

    def _refit(self) -> None:
        y = np.array(self.seconds)
        counts = np.array([features(s) for s in self.shapes], dtype=float)
        best: tuple[float, int, np.ndarray, np.ndarray] | None = None
        for knee in self.KNEES:
            x = counts.copy()
            x[:, 1] = np.maximum(0.0, x[:, 1] - knee)
            x /= y[:, None]  # rows scaled: relative errors
            coef = nonnegative_lstsq(x, np.ones(len(y)))
            residual = np.abs(x @ coef - 1)
            keep = residual <= np.quantile(residual, 0.9)
            coef = nonnegative_lstsq(x[keep], np.ones(int(keep.sum())))
            error = float(np.mean((x[keep] @ coef - 1) ** 2))
            if best is None or error < best[0]:
                best = (error, knee, coef, np.abs(x @ coef - 1))
            if knee >= counts[:, 1].max():
                break
        _, self.knee, coef, relative = best
        self.coefficients = tuple(float(c) for c in coef)
        self.fitted = {"coefficients": dict(zip(TERMS, self.coefficients, strict=True)), "knee_tokens": self.knee,
                       "steps": len(y), "relative_error_p50": float(np.median(relative)),
                       "relative_error_p90": float(np.percentile(relative, 90))}
        self._resumed = False
        if time.monotonic() - self._saved_at >= self.save_every_s:
            self.save()
