"""The three import packages of the distribution, and our `kernels` package beside transformers."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

# Runs in a fresh interpreter: transformers caches its answer, and other tests import our `kernels`.
KERNELS_CHECK = """
import importlib.util, sys
from pathlib import Path
assert Path(importlib.util.find_spec("kernels").origin).parent == Path(sys.argv[1]) / "kernels"
from transformers.utils import import_utils
import transformers.integrations.hub_kernels  # imports the hub `kernels` API if it thinks it is there
assert not import_utils.is_kernels_available(), "transformers takes our kernels for the hub package"
assert "kernels" not in sys.modules, "transformers imported our kernels package"
"""


def test_the_three_packages_import():
    import kernels
    import scheduler
    import voicepipe

    assert voicepipe.__version__
    assert {Path(m.__file__).parent.parent for m in (voicepipe, scheduler, kernels)} == {ROOT}


def test_transformers_does_not_mistake_our_kernels_for_the_hub_package():
    """transformers finds a top-level `kernels` and reads its version from the distribution that ships
    it, ours; only that version falling outside its supported range of the hub package keeps it from
    importing ours in its place. A release numbered inside that range would fail here."""
    done = subprocess.run([sys.executable, "-c", KERNELS_CHECK, str(ROOT)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
