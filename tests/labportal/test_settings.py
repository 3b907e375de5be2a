"""Settings validation: each bad value stops start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "DEBUG",
            "SECRET_KEY",
            "ALLOWED_HOSTS",
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "LABPORTAL_SIGNUP_MODE",
            "LANGUAGE_CODE",
            "DJANGO_SETTINGS_MODULE",
        }
    }
    clean.update({"LABPORTAL_VAR_DIR": str(tmp_path), **env})
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import labportal.settings as s; print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.DEBUG)",
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_runs_the_embedded_defaults_with_no_environment(tmp_path: Path) -> None:
    result = load_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.sqlite3", "filesystem://", "True"]


def test_database_and_broker_urls_switch_to_postgres_and_redis(tmp_path: Path) -> None:
    result = load_settings(
        tmp_path, DATABASE_URL="postgres://lab@db:5432/lab", CELERY_BROKER_URL="redis://r:6379/0"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["django.db.backends.postgresql", "redis://r:6379/0", "True"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "false", "ALLOWED_HOSTS": "lab.example"}, "SECRET_KEY is not set"),
        ({"DEBUG": "false", "SECRET_KEY": "x" * 50}, "ALLOWED_HOSTS is not set"),
        (
            {"DEBUG": "maybe"},
            "DEBUG must be one of: true, 1, yes, on, false, 0, no, off (got 'maybe')",
        ),
        (
            {"DATABASE_URL": "mysql://x@y/z"},
            "DATABASE_URL must start with postgres:// or sqlite:///",
        ),
        ({"CELERY_BROKER_URL": "amqp://x"}, "CELERY_BROKER_URL must start with redis://"),
        (
            {"LABPORTAL_SIGNUP_MODE": "open"},
            "LABPORTAL_SIGNUP_MODE must be one of: closed, approval (got 'open')",
        ),
        (
            {"LABPORTAL_NODE_DOWN_AFTER_S": "soon"},
            "LABPORTAL_NODE_DOWN_AFTER_S must be a whole number (got 'soon')",
        ),
        (
            {"LABPORTAL_NODE_DOWN_AFTER_S": "1"},
            "LABPORTAL_NODE_DOWN_AFTER_S must be at least 5 (got 1)",
        ),
        ({"LANGUAGE_CODE": "fr"}, "LANGUAGE_CODE must be one of: en, zh-hans (got 'fr')"),
        (
            {"LABPORTAL_TRUSTED_PROXIES": "127.0.0.1,proxy.lab"},
            "LABPORTAL_TRUSTED_PROXIES must be IP addresses or networks, comma-separated, "
            "e.g. LABPORTAL_TRUSTED_PROXIES=127.0.0.1,10.0.0.0/8 (got 'proxy.lab')",
        ),
        (
            {"CACHE_URL": "memcached://m:11211"},
            "CACHE_URL must start with redis://, rediss://, file://, locmem://",
        ),
        (
            {"LABPORTAL_LOGIN_LOCKOUT_S": "1"},
            "LABPORTAL_LOGIN_LOCKOUT_S must be at least 10 (got 1)",
        ),
    ],
)
def test_each_bad_value_names_the_variable_and_the_fix(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = load_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_production_mode_starts_with_its_required_variables(tmp_path: Path) -> None:
    result = load_settings(
        tmp_path, DEBUG="false", SECRET_KEY="s" * 50, ALLOWED_HOSTS="lab.example"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "False"


def test_production_shares_the_brokers_redis_as_cache_and_sends_hsts(tmp_path: Path) -> None:
    probe = (
        "import labportal.settings as s; "
        "print(s.CACHES['default']['BACKEND'], s.CACHES['default']['LOCATION'], "
        "s.SECURE_HSTS_SECONDS, s.LABPORTAL_TRUSTED_PROXIES)"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "DJANGO_SETTINGS_MODULE", "CACHE_URL"}
    }
    env.update(
        LABPORTAL_VAR_DIR=str(tmp_path),
        DEBUG="false",
        SECRET_KEY="s" * 50,
        ALLOWED_HOSTS="lab.example",
        CELERY_BROKER_URL="redis://r:6379/0",
        LABPORTAL_TRUSTED_PROXIES="10.0.0.5, 192.168.0.0/16",
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 3) == [
        "django.core.cache.backends.redis.RedisCache",
        "redis://r:6379/0",
        "31536000",
        "(IPv4Network('10.0.0.5/32'), IPv4Network('192.168.0.0/16'))\n",
    ]
