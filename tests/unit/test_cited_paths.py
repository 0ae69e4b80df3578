"""Every file the documents, specs, source and `--help` cite is in the repository: a reviewer
who follows a reference finds it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

# a repository path: folders, then a file with an extension (a placeholder such as <run> or
# a glob is a pattern, not a citation, and is left out)
EXTENSIONS = "md|toml|py|def|txt|sh|cff|in|sbatch|yml|yaml"
CITED = re.compile(rf"(?<![\w./<*{{-])((?:\.\./|\./)?(?:[\w.-]+/)+[\w.-]+\.(?:{EXTENSIONS}))(?![\w/*>}}])")
# a document cited by its bare name (README.md, docs/..., LICENSE)
BARE = re.compile(r"(?<![\w./-])([A-Z][A-Z0-9_]*\.(?:md|cff)|LICENSE)(?![\w/-])")
# files a run or report writes (cited as what a reviewer will find there, not in the repository)
WRITTEN = {"REPORT.md", "REPORT.html", "SHA256SUMS"}
# folders a run writes (a run directory's tables/), an installed image's tree, and other
# projects' sources (cited by their own paths)
OTHERS = ("artifact/runs/", "artifact/reports/", "runs/", "tables/", "DIR/", "/opt/", "/tmp/",
          "/models/", "torch/", "torchvision/", "torchtune/")


# the repository's own files, listed by git: a copy without its history (the image, which binds
# tests/ beside an installed tree) has no such list, and its documents are the checkout's
CHECKOUT = (ROOT / ".git").exists() and shutil.which("git") is not None
pytestmark = pytest.mark.skipif(not CHECKOUT, reason="not a git checkout: no list of the repository's files")


def sources() -> list[Path]:
    if not CHECKOUT:
        return []
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    keep = (".md", ".toml", ".py", ".def", ".cff", ".sh", ".in", ".txt")
    return [ROOT / f for f in listed if f.endswith(keep) or Path(f).name in ("Dockerfile", "run")
            if not f.startswith("tests/") and (ROOT / f).is_file()]  # tests cite made-up paths


def cited_in(text: str) -> set[str]:
    found = {m.group(1) for m in CITED.finditer(text)} | {m.group(1) for m in BARE.finditer(text)}
    return {f for f in found if f not in WRITTEN and not f.startswith(OTHERS)}


def resolves(citation: str, where: Path) -> bool:
    """From the root, the citing file's folder or the package (`profiling/parse.py`); a bare
    document name anywhere in the tree (`SOURCE.md` beside the data it describes)."""
    if "/" not in citation and citation != "LICENSE":
        return any(ROOT.glob(f"**/{citation}"))
    return any((base / citation).exists() for base in (ROOT, where.parent, ROOT / "src" / "multicard"))


def missing_in(path: Path, text: str) -> list[str]:
    return sorted(c for c in cited_in(text) if not resolves(c, path))


def test_the_scanner_finds_a_missing_citation() -> None:
    text = 'see docs/nowhere.md and NOTES.md "section 6"; runs write REPORT.md; <run>/spec.toml'
    assert missing_in(ROOT / "README.md", text) == ["NOTES.md", "docs/nowhere.md"]


def test_the_scanner_accepts_what_exists() -> None:
    assert missing_in(ROOT / "README.md", "experiments/claims.toml, LICENSE, docs/design.md") == []


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(path: Path) -> None:
    assert missing_in(path, path.read_text(encoding="utf-8", errors="replace")) == []


def test_every_path_the_help_cites_exists() -> None:
    texts = [subprocess.run([sys.executable, "-m", "multicard", *words, "--help"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
             for words in ([], ["plan"], ["run"], ["report"], ["list"], ["claims", "power"])]
    assert missing_in(ROOT / "README.md", "\n".join(texts)) == []


def test_the_zenodo_record_says_what_citation_cff_says() -> None:
    # a release archived by Zenodo's GitHub integration gets its DOI from .zenodo.json; the two
    # files must not describe two artifacts (CITATION.cff's top-level keys, read line by line)
    import json
    import tomllib

    zenodo = json.loads((ROOT / ".zenodo.json").read_text())
    cff = (ROOT / "CITATION.cff").read_text()
    top = dict(re.findall(r"^(title|version|license): \"?(.*?)\"?$", cff, re.MULTILINE))
    assert (zenodo["title"], zenodo["version"], zenodo["license"]) == (top["title"], top["version"],
                                                                       top["license"])
    assert zenodo["upload_type"] == "software" and zenodo["access_right"] == "open"
    [paper] = re.findall(r"^  doi: (\S+)$", cff, re.MULTILINE)  # preferred-citation's
    assert {"identifier": paper, "relation": "isSupplementTo", "scheme": "doi",
            "resource_type": "publication-article"} in zenodo["related_identifiers"]
    assert top["version"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


DURATION = re.compile(r"\d+(?:\.\d+)?\s?(?:h|min|m|s)\b")


def test_every_time_a_document_gives_a_session_is_the_one_in_docs_times() -> None:
    # one number, one place: a line that names a session (`nox -s NAME`, its row of README's
    # table, or a table cell that is the session alone) and gives a time gives docs/times.toml's
    import tomllib

    times = tomllib.loads((ROOT / "docs" / "times.toml").read_text())["session"]
    documents = [ROOT / "README.md", ROOT / "ARTIFACT.md", *sorted((ROOT / "docs").glob("*.md"))]
    wrong = []
    for path in documents:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            said = re.sub(r"--budget \S+", "", line)  # a budget is not the session's time
            row = re.match(r"\| `([\w-]+)`(?: \(default\))? \|", said)  # README's table: its own row
            for session, time in times.items():
                cells = [c.strip() for c in said.split("|")] if said.startswith("|") else []
                named = (row.group(1) == session if row else
                         re.search(rf"nox -s {re.escape(session)}(?![\w-])", said)
                         or f"`{session}`" in cells)
                if named and DURATION.search(said) and time not in said:
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {session} is {time} "
                                 f"({line.strip()[:90]})")
    assert not wrong, "\n".join(wrong)
