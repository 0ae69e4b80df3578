"""Judge: trial records become statistics and verdicts (`stats`, `summarize`, `ladder`, `claims`),
and the number of trials a verdict needs is worked out (`power`, `adaptive`, `budget`, `catalog`)."""
