"""No 500 from what a host's shipper sends to ``/ship/v1/``: hypothesis makes bodies of the shapes
the endpoints read (pushes, reports, acknowledgements, removals to confirm), with every field
also any JSON value, and bodies that are not JSON at all, and headers a shipper sets (its clock,
its instance), sent with a real host key through the WSGI app, on both databases. Bounded and
derandomized, so CI's runs repeat and stay short."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence.ingest import shipping

pytestmark = pytest.mark.django_db(transaction=True)  # a failed statement must not spoil a test transaction

EXAMPLES = 120

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)  # fmt: skip


def either(*values: object) -> st.SearchStrategy:
    """One of ``values`` (what a shipper would send, and what it would not), or any JSON value."""
    return st.sampled_from(values) | json_values


HEX = hashlib.sha256(b"{}").hexdigest()
run_ids = either("r1", "clean-run", "../x", "", ".hidden", "a" * 129, "run two")
offsets = either(0, 3, -1, 2**60, 2**64, True)
items = st.fixed_dictionaries(
    {},
    optional={
        "kind": either("ledger", "file"),
        "offset": offsets,
        "sha256": either(HEX, "0" * 64, "A" * 64),
        "data": either("", "e30=", "not base64!", base64.b64encode(b"{}\n").decode(), "=" * 8),
        "path": either(
            "steer.json",
            "state.json",
            "receipts/a.json",
            "tasks/x",
            "receipts/" + "a" * 250,
            "../x",
            "receipts/.hidden",
            "receipts/a/b",
        ),
        "size": either(0, 2, 3, -1, 2**40),
    },
)
pushes = st.fixed_dictionaries(
    {},
    optional={
        "run_id": run_ids,
        "generation": either("", HEX, "x"),
        "ledger_size": offsets,
        "more": either(True, False),
        "items": st.lists(items | json_values, max_size=4) | json_values,
    },
)
acks = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": either("decision-1", "decision-²", "remove-٣", "remove-" + "9" * 20, "decision-", "x"),
            "outcome": either("delivered", "refused", "failed"),
            "detail": json_values,
        },
    )
    | json_values,
    max_size=4,
)
reports = st.fixed_dictionaries(
    {},
    optional={
        "runs": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "run_id": run_ids,
                    "generation": either("", HEX),
                    "ledger_size": offsets,
                    "problem": either("", "unreadable"),
                },
            )
            | json_values,
            max_size=4,
        )
        | json_values,
        "pass_done": either(True, False),
    },
)
removals = st.fixed_dictionaries({}, optional={"id": either("remove-1", "remove-²", "decision-1"),
                                               "steer_sha256": either(HEX, "")})  # fmt: skip
BODIES = {"push": pushes, "report": reports, "acks": acks | json_values, "removal": removals | json_values}
clocks = st.sampled_from(["", "2026-12-07T10:00:00Z", "9999-12-31T23:59:59+14:00", "0001-01-01T00:00:00-01:00", "now",
                          "2026-13-45T99:00:00Z"]) | st.text(max_size=45)  # fmt: skip


@pytest.mark.parametrize("endpoint", sorted(BODIES))
def test_no_body_a_shipper_sends_is_a_500(client, mirror, endpoint):
    key = shipping.new_key("agent-a")
    failures: list[str] = []

    @given(body=BODIES[endpoint] | st.binary(max_size=40), clock=clocks, instance=st.text(max_size=70))
    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def sends(body: object, clock: str, instance: str) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body)
        headers = {"HTTP_AUTHORIZATION": f"Bearer {key}", "HTTP_X_CALLPROOF_SHIPPER": instance or "one",
                   "HTTP_X_CALLPROOF_TIME": clock}  # fmt: skip
        response = client.post(f"/ship/v1/{endpoint}", data, content_type="application/json", **headers)
        if response.status_code >= 500:
            failures.append(f"{endpoint} {data!r}: {response.status_code}")
        answer = client.get("/ship/v1/instructions", **headers)
        if answer.status_code >= 500:
            failures.append(f"instructions with clock {clock!r}: {answer.status_code}")

    sends()
    assert failures == []
