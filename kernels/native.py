"""The CPU kernels written in C++ (`kernels/cpu/*.cpp`): built once at set-up, loaded at run time.

Why a build at set-up: compiling takes about a minute, which no engine start should pay, and a machine may
have no compiler at all. `python -m kernels.native` (run by `.ci/setup.sh`) compiles the sources with the
machine's own instruction set into a cache directory, under a name that changes with the sources, torch's
version and the CPU's features; `load()` only looks there, never compiles, and callers fall back to plain
torch ops when it finds nothing. The library registers its ops under `torch.ops.voicepipe` and runs its
loops on torch's own thread pool (OpenMP, the same runtime torch loaded), so `torch.set_num_threads` sizes
it like every other op.
"""

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).parent / "cpu"
SOURCES = tuple(sorted(SOURCE_DIR.glob("*.cpp")))
HEADERS = tuple(sorted(SOURCE_DIR.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-std=c++20", "-shared", "-fPIC", "-fopenmp", "-Wall")


def cache_dir() -> Path:
    """`$VOICEPIPE_CACHE/kernels`, else ~/.cache/voicepipe/kernels (where the models' cache also lives)."""
    return Path(os.environ.get("VOICEPIPE_CACHE") or Path.home() / ".cache" / "voicepipe") / "kernels"


def _cpu_features() -> str:
    """The CPU's feature flags: a library built with -march=native must not load on a CPU without them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def library_path() -> Path:
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    digest.update(" ".join((torch.__version__, *FLAGS, _cpu_features())).encode())
    return cache_dir() / f"voicepipe_cpu-{digest.hexdigest()[:16]}.so"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def build() -> Path:
    """Compile the sources into the cache (written to a temporary name, then moved: a reader never sees half
    a library); returns its path. Raises RuntimeError when no compiler is found or it fails."""
    from torch.utils.cpp_extension import include_paths, library_paths

    target = library_path()
    if target.exists():
        return target
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on this machine")
    target.parent.mkdir(parents=True, exist_ok=True)
    lib_dir = library_paths()[0]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        command = [cxx, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                   *(f"-I{p}" for p in include_paths()), *map(str, SOURCES), "-o", str(out),
                   f"-L{lib_dir}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib_dir}"]
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"compiling the CPU kernels failed:\n{run.stderr[-4000:]}")
        out.replace(target)
    return target


@cache
def load() -> bool:
    """Load the built library into torch, once; False (and one warning) when it was never built here."""
    path = library_path()
    if not path.exists():
        log.warning("the C++ CPU kernels are not built (run `python -m kernels.native`); int8 and int4 "
                    "weights run as float32 matrices instead, at float32's speed")
        return False
    torch.ops.load_library(str(path))
    return True


def main() -> int:
    try:
        print(build())
    except RuntimeError as e:
        print(f"kernels.native: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
