"""The conformance kit: does a tool's adapter keep the receipts' promises when processes die?

Standard library only. ``callproof conformance MODULE:ADAPTER`` runs one call of
the adapter through the real writer in scratch run directories, in real child
processes, and checks what a runtime's retries depend on (the checklist "for
every tool with a side effect": a restart after the effect, the same id with the
same and with another request, calls at once, a resume under the original
identity), then kills children with SIGKILL at every window of the write and
resumes. It makes the target fail (the adapter's failing args, or its
``break_target()`` in a child) and moves the clock (``RECEIPTS_CLOCK``).
Effects are counted on the target: by a counter given with ``--counter
MODULE:FUNC``, else by the adapter's ``evidence``, else its ``query``.

Each check is ``pass``, ``fail`` or ``not applicable``. A tool with no ``query``
cannot answer for a call in doubt, and the writer never hands its target the
same call_id twice: a person decides. The checks about the target's answers are
then "not applicable: needs a person", which is not a failure.

The child processes are this package run as ``python -m receipts.conformance
REQUEST_JSON``; docs/runtime-authors.md ("The conformance kit") is the guide.

The package's rooms:

- ``report``: the checklist (``CHECKS``), a check's verdict, the report and its table;
- ``loading``: the adapter and the counter the user names (``MODULE:NAME``);
- ``effects``: how many effects of a call its target holds (``Effects``), and the counter of
  the built-in ``send_message``'s outbox;
- ``args``: the argument sets the checks try beside the example's;
- ``child``: a step in a child process (``Child``, ``Ended``), and the child's own side;
- ``kit``: ``Kit``, scratch run directories and children for the checks, and ``run_kit``;
- ``checks_resume``, ``checks_target``, ``checks_processes``: the checks themselves, each a
  function of the kit: a call resumed, what the target answers, and several processes at once.
"""

from __future__ import annotations

from receipts.conformance.args import derive_args, draw_args
from receipts.conformance.checks_processes import CALIBRATION_RUNS, KILL_PLAN, MAX_KILLS, RANDOM, SPAN_MARGIN
from receipts.conformance.child import STEP_TIMEOUT, Child, Ended
from receipts.conformance.effects import Counter_, Effects, count_outbox_lines
from receipts.conformance.kit import PACKAGE_PARENT, Kit, run_kit
from receipts.conformance.loading import load_adapter, load_object
from receipts.conformance.report import (
    CHECKS,
    FAIL,
    NEEDS_A_PERSON,
    NOT_APPLICABLE,
    PASS,
    Check,
    KitError,
    Report,
    format_table,
    short_text,
)

__all__ = [
    "CALIBRATION_RUNS",
    "CHECKS",
    "FAIL",
    "KILL_PLAN",
    "MAX_KILLS",
    "NEEDS_A_PERSON",
    "NOT_APPLICABLE",
    "PACKAGE_PARENT",
    "PASS",
    "RANDOM",
    "SPAN_MARGIN",
    "STEP_TIMEOUT",
    "Check",
    "Child",
    "Counter_",
    "Effects",
    "Ended",
    "Kit",
    "KitError",
    "Report",
    "count_outbox_lines",
    "derive_args",
    "draw_args",
    "format_table",
    "load_adapter",
    "load_object",
    "run_kit",
    "short_text",
]
