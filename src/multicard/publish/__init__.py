"""Publish: run directories (`runs`) become what a reviewer reads and checks, formatted but never
computed (numbers come from `judge.summarize`): REPORT.md and REPORT.html (`document`, `html`),
tables and figures (`tables`, `figures`, `formatting`), and archives (`pack`)."""
