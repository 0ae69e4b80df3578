"""Profiling: capture inside the rank (`capture`), nsys command lines (`nsys`), parsing (`parse`)."""

TRACE_MODES = ("none", "torch", "nsys")
