"""Error pages with the site's navigation, and a 400 that says what is allowed."""

from __future__ import annotations

from http import HTTPStatus

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Django's own 400 renders without the request, so without the navigation; the
    # message of our BadRequest names what is allowed, and is safe to show.
    return render(request, "400.html", {"message": str(exception)}, status=HTTPStatus.BAD_REQUEST)
