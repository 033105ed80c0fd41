"""The one rule for optional extras: a command that needs a module an extra brings, where the
extra is not installed, is refused in one line naming the extra to install (exit 2), before
anything is written; `--help` never needs one."""
from __future__ import annotations

import importlib
import io
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import ConfigError


def require(what: str, modules: tuple[str, ...], extra: str) -> None:
    """Refuse `what` in one line where one of `modules` (brought by `extra`: batch, sagemaker,
    eks) cannot be imported."""
    how = f"pip install 'jobgen[{extra}]'"
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] != name:
                raise ConfigError(f"{what}: {name} is installed but cannot import "
                                  f"{exc.name}: {how}") from None
            raise ConfigError(f"{what} needs {name}, which is not installed: {how}") from None
        except ImportError as exc:
            raise ConfigError(f"{what}: cannot import {name} ({_first_line(str(exc))}): "
                              f"{how}") from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else text


def write_png(path: Path, draw: Callable[[Any], Any], dpi: int,
              rc: Optional[dict[str, Any]] = None) -> None:
    """`--plot PATH`: the figure `draw(pyplot)` returns, as a PNG through the one writer. A bad
    path is refused before the seconds of drawing, a missing matplotlib (the plot extra) in one
    line."""
    from . import fsio
    fsio.check_target(path, "--plot")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'jobgen[plot]'") from None
    with matplotlib.rc_context(rc or {}):  # type: ignore[arg-type]
        fig = draw(plt)
        try:
            out = io.BytesIO()
            fig.savefig(out, format="png", dpi=dpi)
        finally:
            plt.close(fig)
    fsio.write_or_refuse(path, out.getvalue(), "--plot")
