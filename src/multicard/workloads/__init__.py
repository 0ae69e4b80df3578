"""Workloads: the vision rank started by torchrun (`vision`), the LLM recipes started by tune run
(`llm`, `llm_logger`), and what the runner needs of each (`registry`)."""
