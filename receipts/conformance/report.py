"""The kit's checklist, a check's verdict, and the report with its table."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PASS, FAIL, NOT_APPLICABLE = "pass", "fail", "not applicable"
NEEDS_A_PERSON = "not applicable: needs a person"

# The checks, in the order of the checklist; each name is what a failure is reported by.
CHECKS = {
    "restart_after_lost_response": "a restart after the effect, its answer lost, makes no second effect",
    "same_request_reuse": "the same call again reuses the first result",
    "identity_mismatch": "a receipt for this call_id with other args: a conflict, zero effects",
    "idempotency_key": "the target takes the call_id as its key: the same call_id twice, at once or later, one effect",
    "query_answers_truly": "the query says NOT_DONE only when nothing happened, and changes nothing",
    "calls_kept_apart": (
        "several calls on one target: each its own effect; a call never made is not found, even beside one "
        "whose args begin as its own"
    ),
    "evidence_matches_target": "the evidence says present or absent as the counter finds the target",
    "failing_target": "a target that fails: the call is never committed without its effect",
    "keys_kept": (
        "the target still knows a call_id after a wait and with the clock moved on: the same call_id again "
        "makes no second effect"
    ),
    "past_key_retention": 'past the key retention the adapter declares, "not found" is not taken for "not done"',
    "normalise_in_general": "on generated args, normalise is stable and the same in every process",
    "concurrency": "calls at once in real processes make one effect",
    "resume_original_identity": "a resume keeps the original call_id; a new attempt waits for it",
    "random_kills": "SIGKILL at every window, then a clean resume: one effect at most, nothing broken",
}


class KitError(ValueError):
    """The kit cannot run: a bad MODULE:NAME, no args for a call, nothing to count effects with."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # PASS, FAIL, NEEDS_A_PERSON
    evidence: str

    @property
    def title(self) -> str:
        return CHECKS[self.name]

    @property
    def failed(self) -> bool:
        return self.verdict == FAIL

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title, "verdict": self.verdict, "evidence": self.evidence}


@dataclasses.dataclass
class Report:
    adapter: str  # MODULE:ADAPTER as given
    tool: str
    version: str
    queryable: bool
    counted_by: str
    checks: list[Check]
    kept: Path | None = None  # the scratch run directories, when kept

    @property
    def passed(self) -> bool:
        return not any(check.failed for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "adapter": self.adapter,
            "tool": self.tool,
            "version": self.version,
            "queryable": self.queryable,
            "counted_by": self.counted_by,
            "passed": self.passed,
            "checks": [check.as_dict() for check in self.checks],
            "run_directories": str(self.kept) if self.kept else None,
        }


def verdict(name: str, problems: Sequence[str], said: Sequence[str]) -> Check:
    """A check's verdict: failed with its problems (and what was seen), or passed with what was seen."""
    if problems:
        return Check(name, FAIL, "; ".join(problems) + (" (" + "; ".join(said) + ")" if said else ""))
    return Check(name, PASS, "; ".join(said))


def short_text(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_table(report: Report) -> str:
    kind = "queryable" if report.queryable else "not queryable (a call in doubt waits for a person)"
    lines = [
        f"{report.tool} {report.version} ({report.adapter}): {kind}",
        f"effects counted by {report.counted_by}",
        "",
        f"{'check':<28} {'verdict':<31} evidence",
    ]
    for check in report.checks:
        shown = check.verdict.upper() if check.verdict in (PASS, FAIL) else check.verdict
        lines.append(f"{check.name:<28} {shown:<31} {check.evidence}")
    tally = Counter("failed" if check.failed else "passed" if check.verdict == PASS else "not applicable"
                    for check in report.checks)  # fmt: skip
    lines += ["", ", ".join(f"{tally[what]} {what}" for what in ("passed", "failed", "not applicable"))]
    if report.kept:
        lines.append(f"run directories kept under {report.kept}")
    return "\n".join(lines)
