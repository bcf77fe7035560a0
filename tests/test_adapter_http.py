"""The HTTP adapter against a real service on 127.0.0.1 that keeps idempotency keys as Stripe documents them."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from receipts import protocol, runtime
from receipts.adapters.http import HttpRequest, http_factory
from receipts.tools import ABSENT, NOT_DONE, PRESENT, UNCLEAR, OutcomeUnknown, Rejected
from tests.idempotent_service import KEY_LIFETIME, Service

CHARGE = {"amount": 1200, "description": "invoice 42"}


@pytest.fixture
def service() -> Iterator[Service]:
    with Service() as running:
        yield running


def charges(service: Service, **options) -> HttpRequest:
    options.setdefault("retry_wait", 0.01)
    return HttpRequest(name="create_charge", url=f"{service.url}/v1/charges", **options)


def by_key(service: Service, **options) -> HttpRequest:
    return charges(service, lookup_url=f"{service.url}/v1/charges?idempotency_key={{call_id}}", **options)


def post(service: Service, key: str, body: dict) -> tuple[int, dict, str | None]:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{service.url}/v1/charges", data=data, method="POST", headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - the test's own service
            return response.status, json.loads(response.read()), response.headers.get("Idempotent-Replayed")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), error.headers.get("Idempotent-Replayed")


def test_the_service_keeps_keys_as_stripe_documents(service):
    """The test service itself: replay, another body refused, keys forgotten after 24 hours."""
    status, first, replayed = post(service, "k1", CHARGE)
    assert (status, replayed) == (200, None)
    assert post(service, "k1", CHARGE) == (200, first, "true")
    status, error, _ = post(service, "k1", {**CHARGE, "amount": 1})
    assert status == 400 and error["error"]["type"] == "idempotency_error"
    assert post(service, "k2", {"amount": -1})[0] == 400 and "k2" not in service.keys, "a refused body saves nothing"
    created = service.keys["k1"].created
    service.clock = lambda: created + KEY_LIFETIME + 1
    assert post(service, "k1", CHARGE)[2] is None and len(service.charges) == 2, "an expired key is a new request"


def test_a_call_sends_its_call_id_as_the_idempotency_key_and_records_the_resource(run_dir, service):
    adapter = charges(service)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    [charge] = service.charges
    assert charge["idempotency_key"] == outcome.call_id
    assert outcome.result == {"status": 200, "resource_id": charge["id"], "idempotency_key": outcome.call_id}


def test_a_lost_response_is_retried_with_the_key_and_answered_from_it(run_dir, service):
    service.script = ["drop"]  # the charge is made, the connection dropped before the answer
    adapter = charges(service)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    [charge] = service.charges
    assert outcome.status == "committed" and (outcome.result or {})["replayed"] is True
    assert (outcome.result or {})["resource_id"] == charge["id"]
    assert [key for _, key in service.requests] == [outcome.call_id, outcome.call_id]


def test_a_response_lost_past_the_retries_is_in_doubt_and_the_lookup_settles_it(run_dir, service):
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    lost = executor.call(adapter.name, CHARGE)
    assert lost.status == "unknown" and lost.needs == "confirmation" and "no answer" in (lost.error or {})["message"]
    resumed = executor.call(adapter.name, CHARGE)
    [charge] = service.charges
    assert resumed.status == "committed" and resumed.reused and (resumed.result or {})["resource_id"] == charge["id"]


def test_once_the_service_may_have_forgotten_the_key_not_found_is_in_doubt_not_done(run_dir, service):
    """A charge whose answer was lost, looked up a day later: the service keeps a key 24 hours, so
    its 404 no longer says "never charged", and a resume that took it so charged the card twice."""
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    lost = executor.call(adapter.name, CHARGE)
    assert lost.status == "unknown" and len(service.charges) == 1
    [saved] = service.keys.values()
    service.clock = lambda: saved.created + KEY_LIFETIME + 60  # the service forgets the key
    day_later = dt.timedelta(seconds=KEY_LIFETIME + 60)
    later = by_key(service, retries=0, clock=lambda: protocol.utc_now() + day_later)
    resumed = runtime.Executor(run_dir, {later.name: later}).call(later.name, CHARGE)
    assert resumed.needs == "confirmation" and "keeps an idempotency key for 24 h" in (resumed.error or {})["message"]
    evidence = later.evidence(run_dir, CHARGE, lost.call_id)
    assert evidence.verdict == UNCLEAR and any("may have forgotten" in fact for fact in evidence.facts)
    assert len(service.charges) == 1


def test_a_receipt_written_in_the_future_of_the_clock_proves_nothing_by_not_found(run_dir, service):
    """A clock set back (or a receipt from a host whose clock ran ahead): its age is unknown."""
    service.script = ["drop"]
    adapter = by_key(service, retries=0)
    lost = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    service.charges.clear()  # as if the charge never happened: only the clock can still stop the resume
    earlier = by_key(service, retries=0, clock=lambda: protocol.utc_now() - dt.timedelta(hours=2))
    resumed = runtime.Executor(run_dir, {earlier.name: earlier}).call(earlier.name, CHARGE)
    assert resumed.needs == "confirmation" and "in the future of this clock" in (resumed.error or {})["message"]
    assert service.charges == [] and lost.status == "unknown"


def test_without_a_lookup_a_lost_response_waits_for_a_person(run_dir, service):
    service.script = ["drop"]
    adapter = charges(service, retries=0)
    assert adapter.query is None, "not queryable: the service cannot be asked by key"
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    assert executor.call(adapter.name, CHARGE).status == "unknown"
    assert executor.call(adapter.name, CHARGE).needs == "confirmation"
    assert len(service.charges) == 1


def test_a_lookup_that_finds_nothing_lets_the_call_be_made_once(run_dir, service):
    service.script = [500]
    adapter = by_key(service, retries=0)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    assert executor.call(adapter.name, CHARGE).status == "unknown", "a 500 may come after the effect"
    assert adapter.query(run_dir, CHARGE, "a" * 64) is NOT_DONE
    resumed = executor.call(adapter.name, CHARGE)
    assert resumed.status == "committed" and not resumed.reused and len(service.charges) == 1


def test_a_5xx_is_retried_with_the_same_key(run_dir, service):
    service.script = [500, 500]
    adapter = charges(service, retries=2)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "committed" and len(service.charges) == 1


def test_while_the_keys_first_request_runs_a_retry_gets_409_and_waits(run_dir, service):
    """The first try times out while the service is still making the charge; the retry meets a 409."""
    service.hold = threading.Event()
    hold = service.hold

    def release_at_the_first_conflict() -> None:
        service.conflicts.wait()
        hold.set()

    threading.Thread(target=release_at_the_first_conflict, daemon=True).start()
    adapter = charges(service, timeout=0.2, retries=50)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert service.conflicts.is_set(), "a retry met the first request still running"
    assert outcome.status == "committed" and (outcome.result or {})["replayed"] is True and len(service.charges) == 1


def test_a_key_used_with_another_body_is_rejected_and_nothing_of_this_request_ran(run_dir, service):
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    call_id = executor.call(adapter.name, CHARGE).call_id
    with pytest.raises(Rejected, match="HTTP 400") as rejected:
        adapter.execute(run_dir, {**CHARGE, "amount": 5}, call_id)
    assert rejected.value.kind == "permanent" and len(service.charges) == 1


def test_a_refused_request_is_rejected_and_an_unreachable_service_is_retryable(run_dir, service):
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    refused = executor.call(adapter.name, {"amount": -1})
    assert (
        refused.status == "rejected"
        and (refused.error or {})["kind"] == "permanent"
        and "HTTP 400" in (refused.error or {})["message"]
    )
    with socket.socket() as closed:  # a port nothing listens on: every try is refused before a byte is sent
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    nowhere = HttpRequest(name="create_charge", url=f"http://127.0.0.1:{port}/v1/charges", retry_wait=0.01)
    unreachable = runtime.Executor(run_dir, {nowhere.name: nowhere}).call(nowhere.name, {"amount": 7})
    assert unreachable.status == "rejected" and (unreachable.error or {})["kind"] == "retryable", unreachable.error
    assert service.charges == []


@pytest.mark.parametrize("then", [429, 400, 500])
def test_after_a_lost_try_no_refusal_can_say_nothing_happened(run_dir, service, then):
    service.script = ["drop", then]  # the charge is made and its answer lost; the retry is refused
    adapter = charges(service, retries=1)
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "unknown" and f"HTTP {then}" in (outcome.error or {})["message"]
    assert len(service.charges) == 1


def test_evidence_by_key_by_resource_id_and_without_a_lookup(run_dir, service):
    adapter = by_key(service)
    result = adapter.execute(run_dir, CHARGE, "c" * 64)
    present = adapter.evidence(run_dir, CHARGE, "c" * 64, result=result)
    assert present.verdict == PRESENT and result["resource_id"] in present.facts[0]
    assert adapter.evidence(run_dir, CHARGE, "c" * 64, result={**result, "resource_id": "ch_other"}).verdict == UNCLEAR
    assert adapter.evidence(run_dir, CHARGE, "d" * 64).verdict == ABSENT
    by_id = charges(service, lookup_url=f"{service.url}/v1/charges/{{resource_id}}")
    assert by_id.query is None, "a resource id is not known for a call in doubt"
    assert by_id.evidence(run_dir, CHARGE, "c" * 64, result=result).verdict == PRESENT
    hostile = {**result, "resource_id": "../../elsewhere?x=1#"}
    gone = by_id.evidence(run_dir, CHARGE, "c" * 64, result=hostile)
    assert gone.verdict == UNCLEAR and service.requests[-1] == ("GET /v1/charges/..%2F..%2Felsewhere%3Fx%3D1%23", None)
    nothing = charges(service).evidence(run_dir, CHARGE, "c" * 64, result=result)
    assert nothing.verdict == UNCLEAR
    assert nothing.facts == (
        f"this service offers no lookup here: look in the service at POST {service.url}/v1/charges for the request "
        f"with Idempotency-Key: {'c' * 64}; the receipt records resource id {result['resource_id']}",
    )


def test_fixed_headers_are_sent_and_never_recorded(run_dir, service):
    adapter = charges(service, headers={"Authorization": "Bearer sk_test_secret"})
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    assert outcome.status == "committed" and service.authorizations == ["Bearer sk_test_secret"]
    written = b"".join(path.read_bytes() for path in run_dir.rglob("*") if path.is_file())
    assert b"sk_test_secret" not in written


def test_a_redirect_is_never_followed(run_dir, service):
    adapter = charges(service, lookup_url=f"{service.url}/moved?key={{call_id}}")
    evidence = adapter.evidence(run_dir, CHARGE, "c" * 64)
    assert evidence.verdict == UNCLEAR and evidence.facts[0] == f"GET {service.url}/moved: HTTP 302"
    with pytest.raises(OutcomeUnknown, match="HTTP 302"):
        adapter.query(run_dir, CHARGE, "c" * 64)


def test_configuration_is_checked():
    with pytest.raises(ValueError, match="exactly one of"):
        HttpRequest(name="x", url="http://127.0.0.1/", lookup_url="http://127.0.0.1/{call_id}/{resource_id}")
    with pytest.raises(ValueError, match="http"):
        HttpRequest(name="x", url="file:///etc/passwd")


def test_the_zero_argument_factory_reads_the_environment(run_dir, service, monkeypatch):
    monkeypatch.delenv("CALLPROOF_HTTP_URL", raising=False)
    with pytest.raises(ValueError, match="CALLPROOF_HTTP_URL"):
        http_factory()
    monkeypatch.setenv("CALLPROOF_HTTP_URL", f"{service.url}/v1/charges")
    monkeypatch.setenv("CALLPROOF_HTTP_LOOKUP_URL", f"{service.url}/v1/charges?idempotency_key={{call_id}}")
    adapter = http_factory()
    outcome = runtime.Executor(run_dir, {adapter.name: adapter}).call(adapter.name, CHARGE)
    found = adapter.query(run_dir, CHARGE, outcome.call_id)
    assert (
        outcome.status == "committed" and isinstance(found, dict) and found["resource_id"] == service.charges[0]["id"]
    )


def test_without_a_lookup_a_commit_is_reused_from_its_receipt(run_dir, service):
    """Nothing can look at the service, so its own commit was refused as "not shown by the target":
    disputed, exit 4, and the next attempt refused. It is reused from the receipt, which the writer
    checked (its identity and its result's digest): all the evidence there is without a lookup."""
    adapter = charges(service)
    executor = runtime.Executor(run_dir, {adapter.name: adapter})
    first = executor.call(adapter.name, CHARGE)
    again = executor.call(adapter.name, CHARGE)
    assert first.status == "committed" and again.status == "committed" and again.reused and again.needs is None
    assert again.result == first.result and len(service.charges) == 1
