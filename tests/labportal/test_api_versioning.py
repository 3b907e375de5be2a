"""The API's version is in its path: /api/v1/ answers, /api/ answers the same as a
deprecated alias (Deprecation, Sunset, Link to the successor), the schema states version 1
and lists only versioned paths."""

from __future__ import annotations

from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver, reverse

from tests.conftest import api_as


def test_the_versioned_path_answers_without_deprecation(alice: Any) -> None:
    response = api_as(alice).get("/api/v1/credits/")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    assert "Deprecation" not in response and "Sunset" not in response


def test_the_unversioned_alias_answers_the_same_and_says_it_is_deprecated(alice: Any) -> None:
    client = api_as(alice)
    old = client.get("/api/credits/")
    assert old.status_code == 200
    assert old.json() == client.get("/api/v1/credits/").json()
    assert old["Deprecation"].startswith("@") and int(old["Deprecation"][1:]) > 0
    assert old["Sunset"].endswith(" GMT")
    assert old["Link"] == '</api/v1/credits/>; rel="successor-version"'
    # Refusals too, so that a client sees the notice whatever it asked.
    assert "Deprecation" in client.get("/api/jobs/", {"state": "sleeping"})


def test_an_unknown_version_is_a_json_404(alice: Any) -> None:
    response = api_as(alice).get("/api/v2/credits/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")


def test_reverse_names_the_versioned_paths() -> None:
    assert reverse("job-detail", args=[7]) == "/api/v1/jobs/7/"
    assert reverse("schema") == "/api/v1/schema/"


def test_the_schema_states_the_version_and_lists_versioned_paths_only(alice: Any) -> None:
    schema = api_as(alice).get("/api/v1/schema/?format=json").json()
    assert schema["info"]["version"] == "1"
    assert schema["paths"]
    assert all(path.startswith("/api/v1/") for path in schema["paths"]), sorted(schema["paths"])
    # The alias's schema is the same document.
    assert api_as(alice).get("/api/schema/?format=json").json() == schema


def _routes(resolver: URLResolver, prefix: str = "") -> list[str]:
    routes = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            routes += _routes(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            routes.append(prefix + str(entry.pattern))
    return routes


def test_every_unversioned_api_route_has_its_versioned_twin() -> None:
    routes = _routes(get_resolver())
    alias = {
        r.removeprefix("api/")
        for r in routes
        if r.startswith("api/") and not r.startswith("api/v1/")
    }
    versioned = {r.removeprefix("api/v1/") for r in routes if r.startswith("api/v1/")}
    assert alias and alias == versioned, sorted(alias ^ versioned)
