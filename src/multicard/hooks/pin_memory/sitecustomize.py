"""Turns `pin_memory` on in every DataLoader of a torchtune recipe (Table 5: pin_memory in LLM tuning).

torchtune 0.6.1's stock recipes build their DataLoader without a pin_memory option, and this
project never copies recipe code. So, for a trial with `pin_memory = true`, the runner puts this
folder first on PYTHONPATH with MULTICARD_PIN_MEMORY=1: Python runs this `sitecustomize` in every
process of the trial (the `tune` launcher and each rank), which makes `pin_memory=True` the value
of every DataLoader / StatefulDataLoader the recipe constructs, and says so once on stderr. A
`sitecustomize` that this one shadows is run afterwards, so the environment is otherwise unchanged.
"""

import functools
import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _force_pin_memory(cls: type) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["pin_memory"] = True
        if not getattr(_force_pin_memory, "said", False):
            print(f"multicard: {cls.__name__} pin_memory=True (MULTICARD_PIN_MEMORY)", file=sys.stderr)
            _force_pin_memory.said = True  # type: ignore[attr-defined]
        original(self, *args, **kwargs)

    cls.__init__ = init


if os.environ.get("MULTICARD_PIN_MEMORY") == "1":
    import torch.utils.data

    _force_pin_memory(torch.utils.data.DataLoader)
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        pass
    else:
        _force_pin_memory(StatefulDataLoader)

# Run the sitecustomize this file shadows, if there is one.
for entry in sys.path:
    candidate = Path(entry or ".") / "sitecustomize.py"
    if candidate.parent.resolve() != HERE and candidate.is_file():
        runpy.run_path(str(candidate))
        break
