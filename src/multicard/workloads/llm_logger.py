"""torchtune's DiskLogger, plus a wall-clock stamp on every step line (for step times).

Named in the recipe config (`metric_logger._component_=multicard.workloads.llm_logger.
TimedDiskLogger`); the recipe itself is unchanged. The line format stays torchtune's:
`Step N | loss:... tokens_per_second_per_gpu:... wall_time:<unix seconds>`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from torchtune.training.metric_logging import DiskLogger


class TimedDiskLogger(DiskLogger):
    def log_dict(self, payload: Mapping[str, object], step: int) -> None:
        super().log_dict({**payload, "wall_time": time.time()}, step)  # type: ignore[arg-type]
