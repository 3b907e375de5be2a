from __future__ import annotations

from django.conf import settings
from django.contrib import admin
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.urls import reverse
from django.views.i18n import set_language as django_set_language

from labportal.home import home_for


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """/favicon.ico, for browsers that ask for it, is the SVG icon. Its hashed name is
    looked up when asked for, not when the URLs load: with DEBUG=false the manifest
    exists only after collectstatic, and `migrate` (which loads the URLs for its
    checks) runs before it."""
    return HttpResponsePermanentRedirect(static("favicon.svg"))


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The member's home: their jobs, next booking, credits, the lab today, what to do next."""
    return render(request, "labportal/home.html", {"home": home_for(request.user)})


def set_language(request: HttpRequest) -> HttpResponse:
    """Django's language switch, which also remembers the choice on the member's account:
    notifications and emails written later use it."""
    response = django_set_language(request)
    language = request.POST.get("language", "")
    user = getattr(request, "user", None)
    if (
        request.method == "POST"
        and user is not None
        and user.is_authenticated
        and language in dict(settings.LANGUAGES)
        and getattr(user, "preferred_language", language) != language
    ):
        user.preferred_language = language
        user.save(update_fields=["preferred_language"])
    return response


def admin_login(request: HttpRequest) -> HttpResponse:
    """Staff sign in on the one sign-in page, where the login lockout applies.

    A signed-in member without staff rights still sees the admin's own refusal
    (sending them to the sign-in page would bounce straight back to the admin).
    """
    if request.method == "GET" and request.user.is_authenticated:
        return admin.site.login(request)
    query = request.GET.urlencode()
    return redirect(reverse("account_login") + (f"?{query}" if query else ""))
