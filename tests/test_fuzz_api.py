"""No 500 from a client's input to the API: schemathesis reads the OpenAPI description the API
serves and sends what it describes, and what it does not (negative cases: wrong types, out of
range, NULs, overlong text), to every endpoint, in this process through the WSGI app, as a
person with every role that reads and triages, on both databases. Bounded and derandomized, so
CI's runs repeat and stay short."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.db import connection
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from evidence.models import Finding
from evidence.web import api
from tests.helpers import join

pytestmark = pytest.mark.django_db(transaction=True)  # a failed statement must not spoil a test transaction

EXAMPLES = {"GET": 15, "POST": 80}  # cases an endpoint and mode: most where a body is written


@pytest.fixture
def token(demo, django_user_model) -> str:
    user = join(django_user_model.objects.create_user("fuzzer"), "viewer", "confirmer")
    return api.new_token(user=user, name="fuzz")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_request_the_api_describes_or_not_is_a_500(token, mode, settings_for_fuzz):
    auth = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application(), headers=auth)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]  # an invalid description fails here
    assert len(operations) >= 14, "every endpoint of the API is fuzzed"
    finding = Finding.objects.filter(run__run_id="tampered-receipt", closed_at__isnull=True).order_by("pk")[0]
    real = {"run_id": "tampered-receipt", "finding_id": finding.pk}  # the ids a real client would send
    strategies = [(operation, operation.as_strategy(generation_mode=mode)) for operation in operations] + [
        (operation, operation.as_strategy(generation_mode=mode, path_parameters={name: real[name] for name in names}))
        for operation in operations
        if (names := [parameter.name for parameter in operation.path_parameters])
    ]
    for operation, strategy in strategies:

        @given(case=strategy)
        @settings(max_examples=EXAMPLES[operation.method.upper()], derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        def sends(case) -> None:
            response = case.call(headers=auth)
            if response.status_code >= 500:
                sent = f"{case.method} {case.formatted_path} {case.query} {case.body!r}"
                failures.append(f"{sent}: {response.status_code}")

        sends()
    assert failures == []


@pytest.fixture
def settings_for_fuzz(settings, monkeypatch):
    settings.ALLOWED_HOSTS = ["*"]  # schemathesis's WSGI client names its own host
    settings.DEBUG_PROPAGATE_EXCEPTIONS = False
    # The WSGI app ends each request as a server does, closing a connection not kept: with the
    # default (0) every case opened a new one, a PostgreSQL backend started for each of about 900
    # requests (a third of the test's time). Kept as deploy/ keeps them (DATABASE_CONN_MAX_AGE=60).
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    return settings
