"""REPORT.html: REPORT.md rendered with its figures inside the page."""

from __future__ import annotations

import base64
from pathlib import Path

from multicard.publish import html
from multicard.publish.figures import pyplot


def _figure(path: Path) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([1, 2], [1, 4])
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


def test_figures_are_inlined_and_tables_and_details_render(tmp_path: Path) -> None:
    png = _figure(tmp_path / "figures" / "t2.png")
    text = ("# Report\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<details><summary>all statistics</summary>\n\n"
            "| x |\n|---|\n| 3 |\n\n</details>\n\n![Table 2](figures/t2.png)\n")
    page = html.render(text, tmp_path, "a <report>")
    assert "<title>a &lt;report&gt;</title>" in page
    assert page.count("<table>") == 2 and "<summary>all statistics</summary>" in page
    encoded = page.split('src="data:image/png;base64,', 1)[1].split('"', 1)[0]
    assert base64.b64decode(encoded) == png
    assert "figures/t2.png" not in page and "<script" not in page


def test_a_missing_figure_keeps_its_path(tmp_path: Path) -> None:
    page = html.render("![gone](figures/gone.png)\n", tmp_path, "r")
    assert 'src="figures/gone.png"' in page


def test_write_puts_the_page_beside_report_md(tmp_path: Path) -> None:
    (tmp_path / "REPORT.md").write_text("# r\n\ntext\n", encoding="utf-8")
    assert html.write(tmp_path, "r") == tmp_path / "REPORT.html"
    assert "<h1>r</h1>" in (tmp_path / "REPORT.html").read_text(encoding="utf-8")
