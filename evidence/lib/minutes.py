"""A moment's minute: how a run's events are counted per minute (``EventTally``), by the
importer's reading child and by the pages. Standard library only: the child imports no Django."""

from __future__ import annotations

import datetime as dt

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MINUTE = dt.timedelta(minutes=1)


def minute_of(moment: dt.datetime) -> int:
    """Minutes since the epoch, floored: one call per event of an import."""
    return (moment - EPOCH) // MINUTE
