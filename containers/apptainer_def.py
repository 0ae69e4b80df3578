"""apptainer.def, built as Apptainer would build it, by an OCI builder (podman) where there is no
Apptainer.

spython splits the definition into its sections; its own Docker writer is not used, as it is lossy
on this file (it leaves `{{ BASE_IMAGE }}` in place, breaks quotes inside %post and %test, makes
every %post line its own RUN so a `cd` is lost, and mangles %environment). Instead, as Apptainer
does (its build stages, internal/pkg/build/stage.go): `{{ NAME }}` is filled from %arguments (or a
build argument) everywhere; the %files are copied (a line with one path copies it to the same
path) before %post; %post runs as one `/bin/sh -ex` script in `/`, with the base's environment
and not %environment; %environment becomes /.singularity.d/env/90-environment.sh, and %runscript
and %test become the executable scripts /.singularity.d/runscript and /.singularity.d/test, run
after sourcing every /.singularity.d/env/*.sh. Differences that remain: the %test here runs as
uid 1000 (a host user) with a read-only root and no network (as `apptainer test` by a user on a
SIF), where
Apptainer's build-time test runs as the builder with the host's environment and default binds;
and what an OCI build cannot show at all, the SIF's squashfs root and `--nv` (docs/containers.md, "Build and
run the image").
"""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from spython.main.parse.parsers import SingularityParser

SINGULARITY_D = "/.singularity.d"
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class DefinitionError(ValueError):
    """apptainer.def cannot be built as it stands (a missing value, an unknown bootstrap)."""


class _SectionReader(SingularityParser):  # type: ignore[misc]
    """spython's section splitter, keeping each section's lines as written (stripped of their
    indentation) instead of converting them."""

    def __init__(self, path: Path) -> None:
        self.sections: dict[str, list[str]] = {}
        self.base = ""
        super().__init__(str(path))

    def _load_from(self, line: str) -> None:
        self.base = line.split("#", 1)[0].split(":", 1)[1].strip()

    def _get_mapping(self, section: str):  # type: ignore[no-untyped-def]
        def keep(lines: list[str], layer: object = None) -> None:
            self.sections.setdefault(section.lower(), []).extend(lines)
        return keep


@dataclass(frozen=True)
class Definition:
    base: str
    files: list[tuple[str, str]]  # (source relative to the build directory, destination)
    post: str
    environment: str
    runscript: str
    test: str
    labels: list[tuple[str, str]]


def read(path: Path, build_args: dict[str, str]) -> Definition:
    """The sections of `path` with every `{{ NAME }}` filled from `build_args`, else from
    %arguments; a name with neither is an error, as in Apptainer."""
    values = dict(_pairs(_SectionReader(path).sections.get("arguments", []), "=")) | build_args
    text = path.read_text()
    missing = sorted({m.group(1) for m in _TEMPLATE.finditer(text)} - set(values))
    if missing:
        raise DefinitionError(f"{path}: no value for {', '.join(missing)} (give --build-arg or %arguments)")
    with tempfile.TemporaryDirectory() as scratch:
        filled = Path(scratch) / path.name
        filled.write_text(_TEMPLATE.sub(lambda m: values[m.group(1)], text))
        reader = _SectionReader(filled)
    sections = reader.sections
    return Definition(
        base=reader.base,
        files=[_file_pair(line) for line in sections.get("files", []) if not line.startswith("#")],
        post=_script(sections.get("post", [])), environment=_script(sections.get("environment", [])),
        runscript=_script(sections.get("runscript", [])), test=_script(sections.get("test", [])),
        labels=_pairs(sections.get("labels", []), None))


def _file_pair(line: str) -> tuple[str, str]:
    words = line.split("#", 1)[0].split()
    return (words[0], words[1] if len(words) > 1 else words[0])


def _pairs(lines: list[str], separator: str | None) -> list[tuple[str, str]]:
    pairs = []
    for line in lines:
        if line.startswith("#"):
            continue
        key, _, value = line.partition("=") if separator else line.partition(" ")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _script(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def write_context(definition: Definition, source: Path, context: Path) -> Path:
    """A build context in `context` (made afresh) holding the %files and the scripts, and the
    Containerfile that builds the definition; returns the Containerfile."""
    if context.exists():
        shutil.rmtree(context)
    (context / "files").mkdir(parents=True)
    lines = [f"FROM {definition.base}"]
    for number, (src, dest) in enumerate(definition.files):
        origin = source / src
        if not origin.exists():
            raise DefinitionError(f"%files: {src} does not exist in {source}")
        copy = context / "files" / str(number)
        if origin.is_dir():
            shutil.copytree(origin, copy, symlinks=True)
        else:
            shutil.copy2(origin, copy)
        lines.append(f"COPY files/{number} {dest}")
    scripts = context / "singularity.d"
    (scripts / "env").mkdir(parents=True)
    (scripts / "post.sh").write_text(definition.post)
    (scripts / "env" / "90-environment.sh").write_text(definition.environment)
    for name, body in (("runscript", definition.runscript), ("test", definition.test)):
        (scripts / name).write_text("#!/bin/sh\n" + body)
        (scripts / name).chmod(0o755)
    lines += [f"COPY singularity.d {SINGULARITY_D}", "WORKDIR /",
              # %post sees the base's environment, not %environment; the script is not kept
              f"RUN /bin/sh -ex {SINGULARITY_D}/post.sh && rm {SINGULARITY_D}/post.sh"]
    lines += [f"LABEL {shlex.quote(key)}={shlex.quote(value)}" for key, value in definition.labels]
    containerfile = context / "Containerfile"
    containerfile.write_text("\n".join(lines) + "\n")
    return containerfile


def run_command(script: str) -> list[str]:
    """The command that runs one of /.singularity.d's scripts as Apptainer does: every
    env/*.sh sourced in order, then the script itself (its own `#!/bin/sh`)."""
    source = f'for f in {SINGULARITY_D}/env/*.sh; do . "$f"; done'
    return ["/bin/sh", "-c", f'{source}; exec {SINGULARITY_D}/{script} "$@"', script]
