"""Rank entry points started by torchrun (vision) or tune run (llm)."""
