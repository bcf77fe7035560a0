"""The kinds of item the inbox lists, and what a page calls each: the vocabulary the inbox, claims
and triage name an item by (a kind, its run, its subject)."""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import pgettext_lazy

from evidence.words import i18n
from receipts import protocol, states

IN_DOUBT, TAMPERED, CONFLICT, STALE, LEDGER = "in doubt", "tampered", "conflict", "stale reservation", "ledger"
# A committed receipt that passes its check, whose target did not show the result: no intruder.
DISPUTED = "disputed"
HOST = "silent host"  # a host whose importer stopped reporting: its runs' decisions wait
# A host that reports, where a path to a person stalls: a run not arriving, its pushes refused,
# a decision not written, its clock off (``hosts.stalled``).
STALLED = "stalled host"
# A run that stopped writing before it finished: someone resumes it or ends it (retention keeps it till then).
ABANDONED = "abandoned run"
# A person's decision the run directory refused (another decision stood there, the receipt had
# changed): the person who made it learns it here, not only on the call's page.
REFUSED = "refused decision"
# A call settled by a file its host wrote that no decision made on the dashboard matches, in a run not
# signed with a key the server trusts (evidence/ingest/provenance.py): a person acknowledges it.
HOST_DECISION = "host decision"
# A decided call whose target contradicts the decision the runtime followed (evidence/ingest/consequences.py):
# the effect made twice, or made where the decision said it was not.
CONTRADICTED = "contradicted decision"
# The order of the filter, most serious first.
KINDS = (HOST, STALLED, TAMPERED, LEDGER, DISPUTED, CONTRADICTED, IN_DOUBT, REFUSED, HOST_DECISION, CONFLICT, STALE,
         ABANDONED)  # fmt: skip
# The kinds that are states (``receipts.states``): the inbox shows them as every page does.
STATE_OF_KIND = {TAMPERED: states.TAMPERED, DISPUTED: states.DISPUTED, IN_DOUBT: states.IN_DOUBT,
                 CONFLICT: states.CONFLICT, STALE: states.STALE}  # fmt: skip
LEDGER_CODES = ("ledger_rewritten", "ledger_chain_broken")
FINDING_KINDS = {
    LEDGER: LEDGER_CODES,
    CONFLICT: ("submission_conflict",),
    STALE: ("stale_reservation",),
    ABANDONED: ("run_abandoned",),
    REFUSED: ("decision_undeliverable",),
    HOST_DECISION: ("decision_made_on_host",),
    CONTRADICTED: ("decision_contradicted",),
}
# What a page calls each kind (the kind itself is what downloads, the API and ?kind= hold).
# In doubt, tampered and conflict are the protocol's words (evidence/i18n.WORDS).
KIND_LABELS: dict[str, Promise] = {
    HOST: pgettext_lazy("inbox kind", "silent host"),
    STALLED: pgettext_lazy("inbox kind", "stalled host"),
    TAMPERED: i18n.WORDS["tampered"],
    DISPUTED: i18n.WORDS["disputed"],
    LEDGER: pgettext_lazy("inbox kind", "ledger"),
    IN_DOUBT: i18n.WORDS["in doubt"],
    CONFLICT: i18n.WORDS["conflict"],
    STALE: i18n.WORDS["stale reservation"],
    ABANDONED: pgettext_lazy("inbox kind", "abandoned run"),
    REFUSED: pgettext_lazy("inbox kind", "refused decision"),
    HOST_DECISION: pgettext_lazy("inbox kind", "decision made on a host"),
    CONTRADICTED: pgettext_lazy("inbox kind", "decision the target contradicts"),
}


def kind_label(kind: str) -> str:
    """A kind as a page says it, in the reader's language."""
    label = KIND_LABELS.get(kind)
    return str(label) if label is not None else kind


VERIFICATION_OF_KIND = {TAMPERED: protocol.MISMATCH, DISPUTED: protocol.DISPUTED}


def call_kind(present: bool, verification: str) -> str:
    if present:
        for kind, verdict in VERIFICATION_OF_KIND.items():
            if verification == verdict:
                return kind
    return IN_DOUBT
