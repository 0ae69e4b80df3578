"""REPORT.md as one self-contained HTML page (REPORT.html): the figures inlined as data URIs, so
the page opens anywhere (from an archive, attached to a mail) with nothing beside it.

Rendered by markdown-it-py (CommonMark and GitHub tables); REPORT.md's own HTML (its collapsed
`<details>` sections) passes through. The page carries no script.
"""

from __future__ import annotations

import base64
import html
import mimetypes
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

from multicard import integrity

FILE_NAME = "REPORT.html"
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; }
table { border-collapse: collapse; margin: 0.8rem 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
code, pre { font-family: ui-monospace, monospace; font-size: 0.9em; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; }
img { max-width: 100%; height: auto; }
details { margin: 0.6rem 0; } summary { cursor: pointer; font-weight: 600; }
"""


def render(markdown_text: str, base: Path, title: str) -> str:
    """The page for `markdown_text`, whose relative image paths are read under `base`."""
    parser = MarkdownIt("commonmark", {"html": True}).enable("table")
    tokens = parser.parse(markdown_text)
    for token in tokens:
        for child in token.children or []:
            if child.type == "image":
                _inline(child, base)
    body = parser.renderer.render(tokens, parser.options, {})
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
            f"<body>\n{body}</body>\n</html>\n")


def _inline(image: Token, base: Path) -> None:
    """The image's file as a data URI; a missing one keeps its path (the browser shows it broken,
    and a test that loads the page says so)."""
    src = str(image.attrGet("src") or "")
    path = base / src
    if "://" in src or src.startswith("data:") or not path.is_file():
        return
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    image.attrSet("src", f"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}")


def write(out: Path, title: str) -> Path:
    """<out>/REPORT.html from <out>/REPORT.md."""
    target = out / FILE_NAME
    integrity.write_text_atomic(target, render((out / "REPORT.md").read_text(encoding="utf-8"), out, title))
    return target
