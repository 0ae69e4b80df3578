"""REPORT.html in a real headless Chromium: every figure loads from inside the page, and the page
draws (a screenshot beside it). Skips where no Chromium is installed (.ci/run installs one)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from multicard.judge import claims
from multicard.publish import document
from tests.helpers import EXPERIMENTS
from tests.unit.publish.test_report import gpu_run

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium here")
# a copy of the page with one script: after load, the count of figures the browser decoded
PROBE = ("<script>window.addEventListener('load', () => { const i = [...document.images]; "
         "document.body.setAttribute('data-loaded', i.filter(x => x.complete && x.naturalWidth > 0)"
         ".length + '/' + i.length); });</script>")


def headless(*args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    return subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--virtual-time-budget=10000", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.e2e
def test_every_figure_of_report_html_loads_in_chromium(tmp_path: Path) -> None:
    run = gpu_run(tmp_path / "t2", "table2_precision",
                  {(p, g): [16.0, 16.1, 15.9, 16.05, 15.95] if p == "fp64" else [10.0, 10.1, 9.9, 10.05, 9.95]
                   for p in ("fp64", "fp32") for g in (1, 2)}, "train_time_s", {"energy_per_sample_j": 0.5})
    out = tmp_path / "out"
    document.write_report([run], out, claims.load(EXPERIMENTS / "claims.toml"))
    page = (out / "REPORT.html").read_text(encoding="utf-8")
    figures = len(list((out / "figures").glob("*.png")))
    assert figures >= 2 and page.count("<img") == figures
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = headless("--dump-dom", probe.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'data-loaded="(\d+)/(\d+)"', dom.stdout).groups() == (str(figures), str(figures))
    shot = out / "REPORT.png"
    done = headless(f"--screenshot={shot}", "--window-size=1280,2400", (out / "REPORT.html").as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
