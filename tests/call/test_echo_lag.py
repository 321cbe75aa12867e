"""The echo's lag to a fraction of a sample (frontend/echo_lag.py): the linear filter's far end must sit
where the echo is to within a sample, and a lag between two samples must not pass for either."""

import numpy as np
from support.echo_rooms import VOICE, delayed

from voicepipe.frontend.echo_lag import EchoLag, peak_offset
from voicepipe.frontend.processing import FRAME


def estimates(lag: float) -> list[float]:
    far = np.concatenate([VOICE, VOICE[::-1]])
    near = 0.5 * delayed(far, lag) + np.random.default_rng(0).normal(0, 1e-4, len(far)).astype(np.float32)
    estimator, found = EchoLag(16000, FRAME), []
    for at in range(0, len(far) // FRAME * FRAME, FRAME):
        estimate = estimator.add(near[at:at + FRAME], far[at:at + FRAME])
        if estimate is not None:
            found.append(estimate)
    return found


def test_a_lag_between_two_samples_is_found_between_them():
    found = estimates(1234.5)
    assert len(found) > 10
    assert all(abs(estimate - 1234.5) < 0.2 for estimate in found)


def test_a_whole_sample_lag_is_found_to_the_sample():
    found = estimates(1234.0)
    assert len(found) > 10
    assert all(abs(estimate - 1234.0) < 0.1 for estimate in found)


def test_a_peak_at_either_end_stays_where_it_is():
    assert peak_offset(np.array([3.0, 1.0, 0.5]), 0) == 0.0
    assert peak_offset(np.array([0.5, 1.0, 3.0]), 2) == 0.0
    assert abs(peak_offset(np.array([1.0, 2.0, 1.0]), 1)) < 1e-9


def test_over_the_audio_since_the_far_end_started_anew_the_new_lag_is_found_at_once():
    """A second of echo 1234 samples late, a gap, then a reply whose echo comes 1242 late: 200 ms into it the
    half-second window still holds the old audio, the audio since the start alone places the new echo."""
    rng = np.random.default_rng(1)
    first, second = VOICE[:16000], VOICE[16000:32000]
    gap = np.zeros(1600, np.float32)
    far = np.concatenate([first, gap, second])
    near = np.concatenate([0.5 * delayed(first, 1234.0), gap, 0.5 * delayed(second, 1242.0)])
    near = near + rng.normal(0, 1e-4, len(near)).astype(np.float32)
    estimator = EchoLag(16000, FRAME)
    restart, now = len(first) + len(gap), len(first) + len(gap) + 3200
    for at in range(0, now, FRAME):
        estimator.add(near[at:at + FRAME], far[at:at + FRAME])
    fresh = estimator.now((now - restart) // FRAME)
    assert fresh is not None and abs(fresh - 1242.0) < 0.5
    whole = estimator.now()
    assert whole is None or abs(whole - 1242.0) > 0.5
