"""What a build of the images sees, checked without building: the build context (the repository
less what .dockerignore drops), the sources the Dockerfiles COPY and apptainer.def's %files name,
and the files the image needs at run time (IMAGE_NEEDS). `missing` names every needed file that
a build would not put into the image.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# What the image runs from (and the documents a reviewer reads in it): the package (with its
# hooks), the experiments and claims, the shipped
# MNIST originals (verified at build time), the sessions, the device check and the build checks.
IMAGE_NEEDS = ("pyproject.toml", "README.md", "ARTIFACT.md", "LICENSE", "CITATION.cff", "docs",
               "noxfile.py", "src/multicard", "experiments",
               "data/mnist", "benchmarks", "requirements/check_image.py", "requirements/image.toml",
               "requirements/container.txt")


def ignore_patterns(root: Path) -> list[str]:
    path = root / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if any(p.startswith("!") for p in patterns):
        raise ValueError(f"{path}: exceptions (!) are not supported here")
    return [p.strip("/") for p in patterns]


def _regex(pattern: str) -> re.Pattern[str]:
    """.dockerignore's matching (Go's filepath.Match on the whole relative path, plus `**`)."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + "$")


def ignored(relative: str, patterns: list[str]) -> bool:
    """A path is left out when a pattern matches it or one of the folders above it."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return any(_regex(p).match(prefix) for p in patterns for prefix in prefixes)


def repository_files(root: Path) -> list[str]:
    """The files a clean checkout has (git's list; every file where `root` is no git work tree)."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=False)
    if done.returncode == 0 and done.stdout:
        return [name for name in done.stdout.decode().split("\0") if name and (root / name).is_file()]
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file()]


def context_files(root: Path) -> set[str]:
    patterns = ignore_patterns(root)
    return {name for name in repository_files(root) if not ignored(name, patterns)}


def dockerfile_sources(text: str) -> list[str]:
    """The sources of every COPY (not COPY --from) in a Dockerfile."""
    sources = []
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        words = [w for w in line.split() if not w.startswith("--")]
        if "--from" not in line:
            sources += [w.rstrip("/") for w in words[:-1]]
    return sources


def definition_sources(text: str) -> list[str]:
    """The sources of apptainer.def's %files lines."""
    match = re.search(r"^%files\n(.*?)(?=^%|\Z)", text, re.M | re.S)
    lines = match.group(1).splitlines() if match else []
    return [line.split()[0].rstrip("/") for line in lines
            if line.strip() and not line.strip().startswith("#")]


def _under(name: str, source: str) -> bool:
    return source in (".", "") or name == source or name.startswith(source + "/")


def missing(root: Path, sources: list[str], needs: tuple[str, ...] = IMAGE_NEEDS) -> list[str]:
    """Needed files (or whole needs) that a build copying `sources` from the context lacks, and
    sources that are not in the context at all."""
    context = context_files(root)
    problems = [f"{source}: copied, but not in the build context" for source in sources
                if not any(_under(name, source) for name in context)]
    tracked = repository_files(root)
    for need in needs:
        wanted = [name for name in tracked if _under(name, need)]
        if not wanted:
            problems.append(f"{need}: needed by the image, but not in the repository")
        for name in wanted:
            if name not in context:
                problems.append(f"{name}: needed by the image, but .dockerignore leaves it out")
            elif not any(_under(name, source) for source in sources):
                problems.append(f"{name}: needed by the image, but nothing copies it")
    return problems
