"""The wheel: every package in it, the web client inside it, and `voicepipe serve` run from a fresh virtual
environment where only the wheel provides voicepipe."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

# Runs inside the fresh environment: voicepipe comes from it, and its dependencies resolve there.
CHECK_INSTALL = """
import importlib.metadata as metadata, json, sys
from pathlib import Path
from packaging.requirements import Requirement
import kernels, scheduler, voicepipe
from voicepipe.web_files import WEB_DIR
inside = [Path(m.__file__).is_relative_to(sys.prefix) for m in (voicepipe, scheduler, kernels)]
unmet = []
for line in metadata.requires("voicepipe"):
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    try:
        found = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        found = None
    if found is None or not requirement.specifier.contains(found, prereleases=True):
        unmet.append(f"{requirement} (found {found})")
print(json.dumps({"inside": inside, "web": str(WEB_DIR), "unmet": unmet}))
"""


def package_directories() -> set[str]:
    """Every directory of the three import packages that holds files (not only caches), as a package name."""
    found = set()
    for top in ("voicepipe", "scheduler", "kernels"):
        for directory in [ROOT / top, *(ROOT / top).rglob("*")]:
            if directory.is_dir() and "__pycache__" not in directory.parts and any(
                    child.is_file() for child in directory.iterdir()):
                found.add(".".join(directory.relative_to(ROOT).parts))
    return found


def test_every_package_directory_is_in_the_wheel():
    """pyproject.toml lists the packages (the web client's mapping needs it): a new one must be added."""
    assert package_directories() | set(PYPROJECT["package-dir"]) == set(PYPROJECT["packages"])


def test_the_web_client_is_found_as_package_data():
    from voicepipe.web_files import WEB_DIR

    assert WEB_DIR == ROOT / "web" and (WEB_DIR / "index.html").is_file()


def copy_sources(target: Path) -> None:
    """The working tree as git sees it (tracked and new files, not ignored ones): no stale build output."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)


def fresh_environment(path: Path, wheel: Path) -> Path:
    """A virtual environment with the wheel installed, which then sees the heavy dependencies (torch, the
    model packages) of this one through a .pth file instead of downloading them again."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    # Installed before the .pth exists, so pip sees no other voicepipe and touches nothing outside `path`.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "-q", str(wheel)], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "heavy-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_the_wheel_serves_the_page_from_a_fresh_environment(tmp_path):
    source, dist, work = tmp_path / "source", tmp_path / "dist", tmp_path / "work"
    work.mkdir()
    copy_sources(source)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(dist)], check=True, cwd=work)
    wheel = next(dist.glob("voicepipe-*.whl"))
    python = fresh_environment(tmp_path / "env", wheel)

    env = {name: value for name, value in os.environ.items()
           if name != "PYTHONPATH" and not name.startswith("VOICEPIPE_")}
    check = subprocess.run([str(python), "-c", CHECK_INSTALL], cwd=work, env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    installed = json.loads(check.stdout)
    assert installed["inside"] == [True, True, True], "voicepipe was imported from outside the fresh environment"
    assert installed["unmet"] == []
    web = Path(installed["web"])
    assert web.is_relative_to(tmp_path / "env") and (web / "index.html").is_file()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(work / "stderr.txt", "w+") as stderr:
        server = subprocess.Popen([str(python.parent / "voicepipe"), "serve", "--port", str(port)], cwd=work,
                                  env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + 600
            status = None
            while status != 200 and time.monotonic() < deadline and server.poll() is None:
                time.sleep(1)
                try:
                    status, _ = get(f"{base}/ready")
                except OSError:  # not listening yet
                    status = None
            assert status == 200, f"/ready never answered 200; exit {server.poll()}: {stderr_text(stderr)}"
            page, body = get(f"{base}/")
            assert page == 200 and body == (ROOT / "web" / "index.html").read_bytes()
            assert get(f"{base}/app.js")[0] == 200
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=120) == 0, stderr_text(stderr)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        assert "voicepipe: loading the LLM ..." in stderr_text(stderr)


def stderr_text(stderr) -> str:
    stderr.seek(0)
    return stderr.read()[-3000:]
