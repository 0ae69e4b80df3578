"""Build-time check of a multicard image (Dockerfile and apptainer.def both run it).

The image must have the base's DALI (requirements/image.toml) and exactly the torchtune and torchao
that requirements/container.txt pins, and torch must still be the base image's own build.
Exits non-zero, naming what differs, so a drifting base or lock fails the build.
"""

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    image = tomllib.loads((HERE / "image.toml").read_text())
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (HERE / "container.txt").read_text(), re.M))
    problems = []
    for package in ("torchtune", "torchao"):
        found = importlib.metadata.version(package)
        if found != pins[package]:
            problems.append(f"{package} {found}, the lock pins {pins[package]}")
    import nvidia.dali
    import torch

    if not nvidia.dali.__version__.startswith(image["dali"]):
        problems.append(f"DALI {nvidia.dali.__version__}, expected {image['dali']}.x")
    if "torch" in pins:
        problems.append("the lock pins torch: it must stay the base image's build")
    if not sys.version.startswith(image["python"]):
        problems.append(f"Python {sys.version.split()[0]}, expected {image['python']}")
    for problem in problems:
        print(f"check_image: {problem}", file=sys.stderr)
    print(f"check_image: torch {torch.__version__}, DALI {nvidia.dali.__version__}, "
          f"torchtune {pins['torchtune']}, torchao {pins['torchao']}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
