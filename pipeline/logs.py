"""How Facecast's processes log: one line an event, `key=value` fields first, at a level the
command line sets (`--log-level`). The engine's own process (`realtime.engine_process`) sets
itself up the same way, so its start-up and warnings read as the server's do."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def setup_logging(level: str | int) -> None:
    """The process's log lines at `level` (a name such as "info", or logging's number)."""
    number = getattr(logging, level.upper()) if isinstance(level, str) else level
    logging.basicConfig(level=number, format=LOG_FORMAT)


def log_levels() -> dict[str, int]:
    """The levels set in this process: the root logger's (key "") and every logger's set
    apart from it (`serve` shows `realtime` at info under a warning root)."""
    levels = {"": logging.getLogger().level}
    for name, logger in logging.root.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels


def setup_logging_as(levels: dict[str, int]) -> None:
    """This process's logging as another's (`log_levels` there): the same lines, levels."""
    setup_logging(levels.get("", logging.WARNING))
    for name, level in levels.items():
        if name:
            logging.getLogger(name).setLevel(level)
