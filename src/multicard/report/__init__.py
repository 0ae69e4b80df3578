"""Presentation: tables (md, csv, tex), figures (PNG) and REPORT.md for one or more run directories,
one module per output (tables, figures, document) with the formatting they share.

Nothing here computes a statistic; numbers come from `summarize` and are only formatted.
"""

from multicard.report.document import evidence_text, write_report
from multicard.report.runs import RunData, discover_runs, load_run

__all__ = ["RunData", "discover_runs", "evidence_text", "load_run", "write_report"]
