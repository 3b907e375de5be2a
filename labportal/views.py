from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from labportal.home import home_for


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: the process answers and the database is reachable."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The member's home: their jobs, next booking, credits, the lab today, what to do next."""
    return render(request, "labportal/home.html", {"home": home_for(request.user)})
