"""The CPU kernels written in C++ (`kernels/cpu/*.cpp`): built once at set-up, loaded at run time.

Why a build at set-up: compiling takes a minute or two, which no engine start should pay, and a machine may
have no compiler at all. `python -m kernels.native` (run by `.ci/setup.sh`) compiles the sources with the
machine's own instruction set into a cache directory, under a name that changes with the sources, torch's
and Python's versions and the CPU's features; `lib()` only looks there, never compiles, and callers fall
back to plain torch ops when it finds nothing. The library is a Python module (`bindings.cpp` says why not
torch ops) whose loops run on torch's own thread pool (OpenMP, the same runtime torch loaded), so
`torch.set_num_threads` sizes it like every other op.
"""

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)
SOURCE_DIR = Path(__file__).parent / "cpu"
SOURCES = tuple(sorted(SOURCE_DIR.glob("*.cpp")))
HEADERS = tuple(sorted(SOURCE_DIR.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-std=c++20", "-fPIC", "-fopenmp", "-Wall")
MODULE = "voicepipe_cpu"  # the name bindings.cpp gives the module


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
    digest.update(" ".join((torch.__version__, sys.version, *FLAGS, _cpu_features())).encode())
    return cache_dir() / f"{MODULE}-{digest.hexdigest()[:16]}{sysconfig.get_config_var('EXT_SUFFIX')}"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _run(command: list[str], log_file: Path) -> subprocess.Popen:
    """The compiler in the background, its messages to `log_file` (a pipe left unread would stall it)."""
    with log_file.open("w") as messages:
        return subprocess.Popen(command, stdout=messages, stderr=subprocess.STDOUT)


def build() -> Path:
    """Compile the sources into the cache (each source at once, then linked under a temporary name and moved:
    a reader never sees half a library); returns its path. RuntimeError when no compiler is found or it fails."""
    from torch.utils.cpp_extension import include_paths, library_paths

    target = library_path()
    if target.exists():
        return target
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on this machine")
    target.parent.mkdir(parents=True, exist_ok=True)
    lib_dir = library_paths()[0]
    includes = [f"-I{p}" for p in (*include_paths(), sysconfig.get_paths()["include"])]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        folder = Path(tmp)
        objects = [folder / f"{source.stem}.o" for source in SOURCES]
        jobs = [(_run([cxx, *FLAGS, abi, *includes, "-c", str(source), "-o", str(obj)], obj.with_suffix(".log")),
                 obj.with_suffix(".log")) for source, obj in zip(SOURCES, objects, strict=True)]
        out = folder / target.name
        failed = [log_file for job, log_file in jobs if job.wait() != 0]
        if not failed:
            link = _run([cxx, "-shared", "-fopenmp", *map(str, objects), "-o", str(out), f"-L{lib_dir}", "-lc10",
                         "-ltorch_cpu", "-ltorch", "-ltorch_python", f"-Wl,-rpath,{lib_dir}"], folder / "link.log")
            if link.wait() != 0:
                failed.append(folder / "link.log")
        if failed:
            raise RuntimeError("compiling the CPU kernels failed:\n" +
                               "\n".join(f.read_text()[-3000:] for f in failed))
        out.replace(target)
    return target


@cache
def lib() -> ModuleType | None:
    """The built library, imported once; None (and one warning) when it was never built here."""
    path = library_path()
    if not path.exists():
        log.warning("the C++ CPU kernels are not built (run `python -m kernels.native`); int8 and int4 "
                    "weights run as float32 matrices instead, at float32's speed")
        return None
    spec = importlib.util.spec_from_file_location(MODULE, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    try:
        print(build())
    except RuntimeError as e:
        print(f"kernels.native: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
