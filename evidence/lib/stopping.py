"""How a watch stops: SIGTERM ends it as Ctrl-C does, and a database error raised while that
interrupt unwinds does not hide it.

systemd (and a shell that ignores SIGINT, as a non-interactive one does) stops a watch with
SIGTERM. The interrupt can land inside a query: psycopg is then left mid-statement, and the
rollback on the way out fails ("connection in transaction status ACTIVE"). That error, not the
interrupt, reaches the watch's loop, which takes it for a database that went away and tries
again: the stop was lost, and the watch ran on until killed. ``interrupted`` finds the
interrupt behind such an error.
"""

from __future__ import annotations


def raise_interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: end as Ctrl-C does (``signal.signal(signal.SIGTERM, raise_interrupt)``)."""
    raise KeyboardInterrupt


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while an interrupt unwound (it is among its causes or the
    exceptions being handled when it was raised)."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return True
        pending += [current.__cause__, current.__context__]
    return False
