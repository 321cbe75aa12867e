"""What every bench's report holds and where it goes: the machine it ran on, and a JSON file."""

import argparse
import json
import platform
from pathlib import Path


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")


def save(report: dict, path: str) -> None:
    Path(path).write_text(json.dumps(report, indent=2))


def machine(device: str = "cpu") -> dict:
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "device": device}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info
