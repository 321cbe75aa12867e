"""The roofline's efficiency factors fitted to step times measured on a device: how a GPU recalibrates it.

A measured step's time is `overhead + max(C / mfu, M / mbu)`, where C and M are the roofline's compute and
memory seconds at full efficiency (`Roofline.parts` with mfu = mbu = 1). The three factors are found by a
grid over plausible values, refined once around the best, minimizing the relative squared error (a decode
step counts as much as a prompt's). A device's own step times then price it, instead of the published
ranges the defaults take.
"""

import numpy as np

from scheduler.sim.roofline import Efficiency, Roofline
from scheduler.step_shape import StepShape


def roofline_sides(roofline: Roofline, steps: list[StepShape]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's compute and memory seconds at full efficiency."""
    ideal = Roofline(roofline.shape, roofline.device, roofline.dtype, Efficiency(1.0, 1.0, 0.0))
    parts = [ideal.parts(s) for s in steps]
    return np.array([p["compute_s"] for p in parts]), np.array([p["memory_s"] for p in parts])


def fit_efficiency(roofline: Roofline, steps: list[StepShape], seconds: list[float]) -> tuple[Efficiency, dict]:
    compute, memory = roofline_sides(roofline, steps)
    y = np.array(seconds, dtype=float)

    def search(mfus: np.ndarray, mbus: np.ndarray, overheads: np.ndarray) -> tuple[float, float, float, float]:
        best = (np.inf, 0.0, 0.0, 0.0)
        for overhead in overheads:
            # all (mfu, mbu) pairs at once: [mfu, mbu, step]
            predicted = overhead + np.maximum(compute[None, None, :] / mfus[:, None, None],
                                              memory[None, None, :] / mbus[None, :, None])
            error = np.mean(((predicted - y) / y) ** 2, axis=2)
            i, j = np.unravel_index(np.argmin(error), error.shape)
            if error[i, j] < best[0]:
                best = (float(error[i, j]), float(mfus[i]), float(mbus[j]), float(overhead))
        return best

    coarse = search(np.linspace(0.2, 1.0, 41), np.linspace(0.2, 1.0, 41), np.linspace(0.0, 0.01, 21))
    _, mfu, mbu, overhead = coarse
    fine = search(np.linspace(max(0.05, mfu - 0.02), mfu + 0.02, 21),
                  np.linspace(max(0.05, mbu - 0.02), mbu + 0.02, 21),
                  np.linspace(max(0.0, overhead - 5e-4), overhead + 5e-4, 11))
    _, mfu, mbu, overhead = fine
    efficiency = Efficiency(mfu, mbu, overhead)
    fitted = Roofline(roofline.shape, roofline.device, roofline.dtype, efficiency)
    relative = np.abs(np.array([fitted.step_seconds(s) for s in steps]) - y) / y
    return efficiency, {"steps": len(y), "relative_error_p50": float(np.median(relative)),
                        "relative_error_p90": float(np.percentile(relative, 90))}
