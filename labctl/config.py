"""Where labctl keeps the portal URL and token: a 0600 JSON file, overridden by env vars and flags."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import UsageError

TOKEN_PAGE = "/account/tokens/"


def config_path() -> Path:
    explicit = os.environ.get("LABCTL_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "labctl" / "config.json"


def read_file(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise UsageError(f"Cannot read the config file {path}: {error.strerror}.") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise UsageError(
            f"The config file {path} is not valid JSON; delete it and run `labctl login` again."
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"The config file {path} should hold a JSON object; run `labctl login` again."
        )
    return {k: v for k, v in data.items() if isinstance(v, str)}


def write_file(url: str, token: str, path: Path | None = None) -> Path:
    """Store url and token, readable only by the user (created 0600, never world-readable meanwhile)."""
    path = path or config_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"url": url, "token": token}, handle, indent=2)
            handle.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except OSError as error:
        raise UsageError(f"Cannot write the config file {path}: {error.strerror}.") from None
    return path


def normalise_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise UsageError(
            f"The portal URL “{url}” should start with http:// or https://, e.g. http://portal:8000."
        )
    return url


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def resolve(url_flag: str | None, token_flag: str | None) -> Settings:
    """Flags beat env vars (LABPORTAL_URL, LABPORTAL_TOKEN), which beat the config file."""
    stored = read_file()
    url = url_flag or os.environ.get("LABPORTAL_URL") or stored.get("url") or ""
    token = token_flag or os.environ.get("LABPORTAL_TOKEN") or stored.get("token") or ""
    if not url:
        raise UsageError(
            "No portal URL configured. Run `labctl login --url http://portal:8000 --token lp_...` "
            f"(create the token in the portal under Account → API tokens, {TOKEN_PAGE}), "
            "or set LABPORTAL_URL and LABPORTAL_TOKEN."
        )
    url = normalise_url(url)
    if not token:
        raise UsageError(
            "No API token configured. Create one at "
            f"{url}{TOKEN_PAGE} (Account → API tokens), then run "
            f"`labctl login --url {url} --token lp_...` or set LABPORTAL_TOKEN."
        )
    return Settings(url=url, token=token.strip())
