"""A thin client over the LabPortal REST API: one place that turns every failure into a LabctlError."""

from __future__ import annotations

from typing import Any

import requests

from labctl import __version__
from labctl.errors import ApiRefusal, Unreachable, UsageError

TIMEOUT = (5, 60)  # connect, read


def explain(body: Any) -> tuple[str, str | None]:
    """The server's own explanation: `detail`, or DRF field errors as 'field: message' lines."""
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        if "detail" in body:
            return str(body["detail"]), code
        lines = []
        for field, problems in body.items():
            if field == "code":
                continue
            text = _flatten(problems)
            lines.append(text if field in ("non_field_errors", "__all__") else f"{field}: {text}")
        if lines:
            return "\n".join(lines), code
    if isinstance(body, list) and body:
        return _flatten(body), None
    return "", None


def _flatten(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_flatten(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in value.items())
    return str(value)


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers.update(
            {
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"labctl/{__version__}",
            }
        )

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> Any:
        return self._decode(self.send(method, path, params=params, json=json))

    def send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """The raw answer (a download streams it); an error status raises as ``request`` does."""
        url = path if path.startswith(("http://", "https://")) else f"{self.url}{path}"
        try:
            response = self.session.request(method, url, timeout=TIMEOUT, **kwargs)
        except (
            requests.exceptions.InvalidURL,
            requests.exceptions.MissingSchema,
            requests.exceptions.InvalidSchema,
        ) as error:
            raise UsageError(f"The portal URL {self.url} is not a valid URL ({error}).") from None
        except requests.exceptions.Timeout:
            raise Unreachable(
                f"The portal at {self.url} did not answer in time. Try again, or check that it is up."
            ) from None
        except requests.exceptions.RequestException as error:
            reason = _short_reason(error)
            raise Unreachable(
                f"Cannot reach the portal at {self.url} ({reason}). "
                "Check the URL (--url, LABPORTAL_URL or `labctl login`) and that the portal is up."
            ) from None
        if not response.ok:
            self._decode(response)  # raises with the portal's explanation
        return response

    def _decode(self, response: requests.Response) -> Any:
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = None
            is_json = False
        else:
            is_json = True
        if response.ok:
            if not is_json:
                raise ApiRefusal(
                    f"{response.url} answered HTTP {response.status_code} but not with JSON. "
                    "Is the URL the portal's address (e.g. http://portal:8000)?",
                    status=response.status_code,
                )
            return body
        message, code = explain(body)
        if not message:
            if response.status_code == 404 and not is_json:
                message = (
                    f"{response.url} does not exist (HTTP 404). "
                    "Is the URL the portal's address, and is the portal up to date?"
                )
            elif response.status_code >= 500:
                message = (
                    f"The portal had an internal error (HTTP {response.status_code}). "
                    "Try again later or tell the lab admins."
                )
            else:
                message = f"The portal refused the request (HTTP {response.status_code} {response.reason})."
        raise ApiRefusal(message, status=response.status_code, code=code, body=body)

    def get(self, path: str, **params: Any) -> Any:
        return self.request(
            "GET", path, params={k: v for k, v in params.items() if v is not None} or None
        )

    def post(self, path: str, json: Any = None) -> Any:
        return self.request("POST", path, json=json)

    def get_list(self, path: str, *, limit: int | None = None, **params: Any) -> list[Any]:
        """Every item of a paginated list (following `next`), up to `limit` items."""
        query = {k: v for k, v in params.items() if v is not None}
        if limit is not None:
            query["limit"] = min(limit, 100)
        body = self.get(path, **query)
        if isinstance(body, list):
            return body[:limit] if limit is not None else body
        items = list(body.get("results", []))
        while body.get("next") and (limit is None or len(items) < limit):
            body = self.request("GET", body["next"])
            items.extend(body.get("results", []))
        return items[:limit] if limit is not None else items


def _short_reason(error: Exception) -> str:
    text = str(error)
    for marker in (
        "Connection refused",
        "Name or service not known",
        "No route to host",
        "Temporary failure in name resolution",
        "Network is unreachable",
        "timed out",
        "nodename nor servname",
        "getaddrinfo failed",
        "Connection reset",
    ):
        if marker.lower() in text.lower():
            return marker.lower()
    return type(error).__name__
