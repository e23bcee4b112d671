"""Progress bars: live on a terminal, a line every few seconds when output goes to a file."""

from __future__ import annotations

import sys


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "step"):
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=tty,
                mininterval=0.1 if tty else 10.0)
