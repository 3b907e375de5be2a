"""LabPortal settings: one file, driven by environment variables.

With no environment at all LabPortal runs its embedded demo defaults: SQLite under
var/, kombu's filesystem broker (no server needed) and DEBUG on. Production sets
DEBUG=false, SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL and CELERY_BROKER_URL.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import django_stubs_ext
import environ
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from core.beat_schedule import AppsBeatSchedule
from core.envvars import (
    env_admins,
    env_bool,
    env_choice,
    env_int,
    env_int_map,
    env_list,
    env_networks,
    env_required,
    env_sample_rate,
    env_str,
    env_str_map,
    env_url,
)

# Lets model admins and querysets be subscripted for mypy at run time too.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
# Created when Django starts (labportal/apps.py), not when the settings are read.
VAR_DIR = Path(env_str("LABPORTAL_VAR_DIR", str(BASE_DIR / "var")) or "")

DEBUG = env_bool("DEBUG", True)

if DEBUG:
    SECRET_KEY = env_str("SECRET_KEY", "labportal-demo-insecure-key-do-not-use-in-production")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
else:
    SECRET_KEY = env_required(
        "SECRET_KEY",
        why="Production mode (DEBUG=false) needs a long random SECRET_KEY; "
        'generate one with: python -c "import secrets; print(secrets.token_urlsafe(50))"',
    )
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
    if not ALLOWED_HOSTS:
        raise ImproperlyConfigured(
            "ALLOWED_HOSTS is not set. Production mode (DEBUG=false) needs the portal's "
            "host names, comma-separated, e.g. ALLOWED_HOSTS=gpu.lab.example.org"
        )

CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Where members reach the portal: emails carry absolute links built on it.
_default_site_url = (
    "http://127.0.0.1:8000"
    if DEBUG or ALLOWED_HOSTS[0].startswith((".", "*"))
    else f"https://{ALLOWED_HOSTS[0]}"
)
LABPORTAL_SITE_URL = (env_str("SITE_URL", _default_site_url) or _default_site_url).rstrip("/")
if not LABPORTAL_SITE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"SITE_URL must be an absolute address such as https://gpu.lab.example.org "
        f"(got {LABPORTAL_SITE_URL!r})."
    )

# --- Applications -----------------------------------------------------------
DJANGO_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
]
THIRD_PARTY_APPS = [
    "allauth",
    "allauth.account",
    # Campus sign-in with OpenID Connect (labportal/campus_login.py); off unless configured.
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "django_htmx",
    # Who changed which rule, when, from what to what (labportal/audit.py: what is logged).
    "auditlog",
]
LOCAL_APPS = [
    "labportal",
    "accounts",
    "cluster",
    "jobqueue",
    "credits",
    "approvals",
    "reservations",
    "telemetry",
    "joblogs",
    "reports",
    "handbook",
    "alerts",
    "scheduling",
    "slurm",
    "sessions",
    "ops",
    "files",
]
# The demo lab's commands (seed_demo, seed_demo_history, rundemo): a checkout has the
# demo/ package, the installed wheel does not ship it.
if importlib.util.find_spec("demo") is not None:
    LOCAL_APPS.append("demo")
INSTALLED_APPS = DJANGO_APPS + THIRD_PARTY_APPS + LOCAL_APPS

MIDDLEWARE = [
    # First: every log record of the request carries its id (and the member, once known).
    "core.log_context.RequestContextMiddleware",
    # Compresses what every later middleware has written (text only, never a stream).
    "labportal.middleware.CompressedPagesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "labportal.middleware.SecurityHeadersMiddleware",
    "core.api_versioning.UnversionedApiDeprecationMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    # After LocaleMiddleware, so that their refusals are in the member's language; the
    # size check first, before anything reads the body.
    "labportal.middleware.BoundedRequestBodyMiddleware",
    "labportal.middleware.RejectNulCharactersMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The person behind each audit log entry: the signed-in admin, or the API token's owner.
    "labportal.audit.AuditActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "labportal.error_pages.FriendlyNotFoundMiddleware",
    "labportal.error_pages.DatabaseOutageMiddleware",
    # The tutorial's steps that are page views (a job's page and log, My credits).
    "handbook.middleware.TutorialStepMiddleware",
]

ROOT_URLCONF = "labportal.urls"
WSGI_APPLICATION = "labportal.wsgi.application"
ASGI_APPLICATION = "labportal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
                "accounts.context_processors.portal",
                "approvals.context_processors.pending_approvals",
            ],
            # {% help_link "slug" %} links a page to its part of the manual, on any page.
            "builtins": ["handbook.templatetags.handbook", "ops.templatetags.ops"],
        },
    },
]

# --- Database ---------------------------------------------------------------
_default_db = f"sqlite:///{VAR_DIR / 'labportal.sqlite3'}"
_database_url = env_str("DATABASE_URL", _default_db) or _default_db
try:
    _db = environ.Env.db_url_config(_database_url)
except Exception:  # environ raises several types for a bad URL
    _db = {}
if _db.get("ENGINE") not in (
    "django.db.backends.sqlite3",
    "django.db.backends.postgresql",
):
    raise ImproperlyConfigured(
        f"DATABASE_URL must start with postgres:// or sqlite:/// (got {_database_url!r}); "
        "e.g. DATABASE_URL=postgres://labportal@127.0.0.1:5432/labportal"
    )
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # A busy timeout lets the web, worker and agent-ingest processes share the demo file.
    _db.setdefault("OPTIONS", {})["timeout"] = 20
    _db["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
else:
    _db["CONN_MAX_AGE"] = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    # The web tier runs Django under ASGI (labportal/asgi.py sets LABPORTAL_ASGI), where
    # each request's sync code runs in a thread of its own: a connection kept past the
    # request is never used again nor closed. 300 requests from 8 clients left 39 open on
    # one worker, and under a lab's load they passed PostgreSQL's max_connections (503s).
    # As Django advises for ASGI: no persistent connections, a pool per process instead.
    if env_bool("LABPORTAL_ASGI", False) and env_str("DATABASE_POOL", "on") != "off":
        _db["CONN_MAX_AGE"] = 0
        # The pool checks a connection before handing it out: after a database restart
        # the idle ones are replaced, not each failing one request with a 503.
        _db["CONN_HEALTH_CHECKS"] = True
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": 2,
            "max_size": env_int("DATABASE_POOL_MAX", 16, minimum=1),
            # Waiting longer for a free connection than this is an outage: a 503 with
            # Retry-After (labportal.error_pages), not a request hung for minutes.
            "timeout": 10.0,
        }
_db["ATOMIC_REQUESTS"] = False
_db.setdefault("TEST", {})
DATABASES = {"default": _db}
DATABASE_IS_POSTGRES = _db["ENGINE"] == "django.db.backends.postgresql"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth -------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "dashboard"
ACCOUNT_LOGOUT_REDIRECT_URL = "account_login"
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_SIGNUP_FIELDS = ["username*", "email*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_ADAPTER = "accounts.adapters.LabAccountAdapter"
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_SESSION_REMEMBER = None
# closed: only admins create accounts or send invitations.
# approval: anyone may sign up, and an admin approves them before their first login.
LABPORTAL_SIGNUP_MODE = env_choice("LABPORTAL_SIGNUP_MODE", "closed", ("closed", "approval"))

# Campus sign-in (docs/deployment.md, "Campus sign-in"): LDAP / Active Directory through
# django-auth-ldap, OpenID Connect through allauth's openid_connect provider. Both off unless
# LABPORTAL_LDAP_URI / LABPORTAL_OIDC_SERVER_URL is set; checked here, at start. Local
# accounts keep working beside them.
from labportal.campus_login import ldap_login, oidc_providers  # noqa: E402

_ldap = ldap_login()
globals().update(_ldap.settings)
LABPORTAL_LDAP_ENABLED = _ldap.enabled
LABPORTAL_LDAP_GROUP_CATEGORIES = _ldap.group_categories
if _ldap.enabled:
    AUTHENTICATION_BACKENDS.append("accounts.directory.DirectoryBackend")
SOCIALACCOUNT_PROVIDERS = oidc_providers()
SOCIALACCOUNT_ADAPTER = "accounts.adapters.LabSocialAccountAdapter"
SOCIALACCOUNT_ONLY = False
# Only the campus provider is offered; a member's e-mail at the provider is taken as is.
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
LABPORTAL_OIDC_ENABLED = bool(SOCIALACCOUNT_PROVIDERS)
LABPORTAL_OIDC_GROUPS_CLAIM = env_str("LABPORTAL_OIDC_GROUPS_CLAIM", "groups") or "groups"
LABPORTAL_OIDC_GROUP_CATEGORIES = env_str_map(
    "LABPORTAL_OIDC_GROUP_CATEGORIES", example="phd-students=PhD,masters=Master"
)
# The name on the sign-in page: "Sign in with <campus>" (OIDC), "<campus> account" (LDAP).
LABPORTAL_CAMPUS_NAME = env_str("LABPORTAL_CAMPUS_NAME", "Campus") or "Campus"

# --- Audit log --------------------------------------------------------------
# django-auditlog records who changed which rule (labportal/audit.py: the models and
# fields). A foreign key's change reads as its name ("alice", "PhD"), not as a row id.
AUDITLOG_USE_FK_STRING_REPRESENTATION = True

# --- I18N -------------------------------------------------------------------
LANGUAGE_CODE = env_choice("LANGUAGE_CODE", "en", ("en", "zh-hans"))
LANGUAGES = [("en", _("English")), ("zh-hans", _("Simplified Chinese"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
# Our own formats first (the weekday after a Chinese date), then Django's.
FORMAT_MODULE_PATH = ["labportal.formats"]
TIME_ZONE = env_str("TIME_ZONE", "UTC") or "UTC"
USE_I18N = True
USE_TZ = True

# --- Static -----------------------------------------------------------------
STATIC_URL = "/static/"
# The container image collects static files at build time, outside the data volume.
STATIC_ROOT = Path(env_str("LABPORTAL_STATIC_ROOT", str(VAR_DIR / "static")) or "")
# htmx, uPlot and xterm.js come from the npm registry into node_modules/; see Makefile.
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("vendor/htmx", BASE_DIR / "node_modules" / "htmx.org" / "dist"),
    ("vendor/uplot", BASE_DIR / "node_modules" / "uplot" / "dist"),
    ("vendor/xterm", BASE_DIR / "node_modules" / "@xterm" / "xterm"),
    ("vendor/xterm-fit", BASE_DIR / "node_modules" / "@xterm" / "addon-fit" / "lib"),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# --- Email ------------------------------------------------------------------
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "LabPortal <labportal@localhost>")
if env_str("EMAIL_URL"):
    vars().update(environ.Env.email_url_config(env_str("EMAIL_URL") or ""))

# --- Grafana ----------------------------------------------------------------
# Where staff open the dashboards (deploy/monitoring/grafana/): a "Grafana" link in the
# staff menu and per node and GPU on the GPUs page. Empty: no links.
LABPORTAL_GRAFANA_URL = env_url(
    "LABPORTAL_GRAFANA_URL",
    "",
    schemes=("https://", "http://"),
    example="https://grafana.lab.example.org",
).rstrip("/")

# --- Error reporting --------------------------------------------------------
# With DEBUG=false, an unhandled error mails ADMINS ("Ann Lee <ann@lab.example.org>, ...");
# SENTRY_DSN sends errors of requests, tasks and ERROR log records to Sentry as well.
ADMINS = env_admins("ADMINS")
SERVER_EMAIL = env_str("SERVER_EMAIL", DEFAULT_FROM_EMAIL) or DEFAULT_FROM_EMAIL
# Sentry is started with the apps (labportal/apps.py), from these.
SENTRY_DSN = env_str("SENTRY_DSN") or ""
SENTRY_ENVIRONMENT = env_str("SENTRY_ENVIRONMENT", "production" if not DEBUG else "demo") or ""
SENTRY_RELEASE = env_str("SENTRY_RELEASE", "labportal") or "labportal"
SENTRY_TRACES_SAMPLE_RATE = env_sample_rate("SENTRY_TRACES_SAMPLE_RATE")

# --- REST API ---------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.api_auth.PersonalAccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "core.api_schema.LabPortalAutoSchema",
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "core.parsers.StrictMultiPartParser",
    ],
    # Every list's filters are django-filter FilterSets (core/api_filters.py): checked, and
    # in the schema. The version is in the path, /api/v1/ (docs/api.md: versions, deprecation).
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_VERSIONING_CLASS": "core.api_versioning.PathVersioning",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "core.api_errors.domain_exception_handler",
    # 429 with Retry-After past a rate (accounts/throttles.py; LABPORTAL_API_RATES below).
    "DEFAULT_THROTTLE_CLASSES": [
        "accounts.throttles.ApiRateThrottle",
        "accounts.throttles.ActionRateThrottle",
    ],
}


def _api_rate(name: str, default: str) -> str | None:
    """A rate as N/second, N/minute, N/hour or N/day (DRF's form, e.g. 240/min); "off" for none."""
    value = (env_str(name, default) or default).strip().lower()
    if value == "off":
        return None
    count, _slash, period = value.partition("/")
    if not (count.isdigit() and int(count) > 0 and period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(
            f"{name} must be a rate such as 240/min, 10/hour or 2/s, or off (got {value!r})"
        )
    return value


# Per token (else per member, else per address). A job array is one request: a sweep of
# 1,000 tasks counts once against the submit rate.
LABPORTAL_API_RATES = {
    scope: rate
    for scope, rate in {
        "api": _api_rate("LABPORTAL_API_RATE", "1200/min"),
        "submit": _api_rate("LABPORTAL_API_RATE_SUBMIT", "240/min"),
        "report": _api_rate("LABPORTAL_API_RATE_REPORT", "30/hour"),
    }.items()
    if rate is not None
}
SPECTACULAR_SETTINGS = {
    "TITLE": "LabPortal API",
    "DESCRIPTION": "Jobs, queues, reservations, credits and telemetry of a lab's GPU servers.",
    # The API's version (info.version) is the one the schema is asked for: 1, /api/v1/.
    "VERSION": None,
    # Versioned paths only (/api/v1/...); operation ids and tags as without the version.
    "PREPROCESSING_HOOKS": ["core.api_versioning.versioned_paths_only"],
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "ENUM_NAME_OVERRIDES": {"ReportTaskKindEnum": "reports.models.ReportTask.Kind"},
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Celery -----------------------------------------------------------------
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://") or "filesystem://"
if not CELERY_BROKER_URL.startswith(("filesystem://", "redis://", "rediss://", "memory://")):
    raise ImproperlyConfigured(
        "CELERY_BROKER_URL must start with redis://, rediss://, filesystem:// or memory:// "
        f"(got {CELERY_BROKER_URL!r}); e.g. CELERY_BROKER_URL=redis://127.0.0.1:6379/0"
    )
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "out"),
        "data_folder_out": str(BROKER_DIR / "out"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        # kombu reads one message per queue per poll; the default 1 s poll falls behind
        # two agents' heartbeats and samples.
        "polling_interval": 0.05,
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "control"
# A message the worker cannot take is dropped and shown to admins, never raised.
from protocol.broker import CONSUMER  # noqa: E402

CELERY_WORKER_CONSUMER = CONSUMER
CELERY_TASK_ROUTES = {
    "control.*": {"queue": "control"},
    # agent.* tasks go to node.<name>; the dispatcher names the queue per call.
}
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
_FILESYSTEM_BROKER = CELERY_BROKER_URL.startswith("filesystem://")
# Late acks make a crash redeliver the task (every task is safe to run twice). kombu's
# filesystem transport only acks between 2-second polls, which would cap the demo
# at one message per poll, so the demo acks on receipt and prefetches more.
CELERY_WORKER_PREFETCH_MULTIPLIER = 8 if _FILESYSTEM_BROKER else 1
CELERY_TASK_ACKS_LATE = not _FILESYSTEM_BROKER
# With late acks, a task whose worker child was killed (OOM, SIGKILL) is requeued, not
# acked and lost; every task is safe to run twice.
CELERY_TASK_REJECT_ON_WORKER_LOST = CELERY_TASK_ACKS_LATE
# Beat's crontab entries (the nightly backup at LABPORTAL_BACKUP_HOUR, the monthly grant)
# follow the lab's TIME_ZONE, not UTC.
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# How often node liveness is checked (cluster/beat.py). A check that comes more than two of
# these (and 5 s) after the previous one follows a time the control side could not hear:
# node silence is then counted from that check, not across the gap (docs/nodes.md).
LABPORTAL_LIVENESS_CHECK_S = env_int("LABPORTAL_LIVENESS_CHECK_S", 15, minimum=1)
# CELERY_BEAT_SCHEDULE is collected from the apps at the end of this file.

# --- Cache ------------------------------------------------------------------
# Login lockout counters live here, so every web worker must share it: Redis in
# production (the broker's by default); a file cache under var/ for the demo.
_redis_broker = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
CACHE_URL = env_url(
    "CACHE_URL",
    CELERY_BROKER_URL if _redis_broker else f"file://{VAR_DIR / 'cache'}",
    schemes=("redis://", "rediss://", "file://", "locmem://"),
    example="redis://127.0.0.1:6379/1",
)
if CACHE_URL.startswith(("redis://", "rediss://")):
    _cache: dict[str, object] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": CACHE_URL,
    }
elif CACHE_URL.startswith("file://"):
    _cache = {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": CACHE_URL.removeprefix("file://"),
    }
else:  # locmem:// is per process: one web worker only.
    _cache = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
CACHES = {"default": {**_cache, "KEY_PREFIX": "labportal"}}

# --- Login lockout ------------------------------------------------------------
# Failed sign-ins are counted per account and per client address separately; past
# either limit, sign-ins for that account (or from that address) wait out a short,
# announced lockout. X-Forwarded-For is believed only from these proxies.
LABPORTAL_TRUSTED_PROXIES = env_networks("LABPORTAL_TRUSTED_PROXIES", [])
LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT = env_int("LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT", 5, minimum=1)
LABPORTAL_LOGIN_FAILURES_PER_ADDRESS = env_int(
    "LABPORTAL_LOGIN_FAILURES_PER_ADDRESS", 30, minimum=1
)
LABPORTAL_LOGIN_LOCKOUT_S = env_int("LABPORTAL_LOGIN_LOCKOUT_S", 300, minimum=10)
# allauth's own per-IP failure limit would lock out everyone behind one proxy and
# cannot say for how long; accounts.lockout replaces it. allauth's flood limit on
# the sign-in form (per address, failures or not) stays above the address lockout.
ACCOUNT_RATE_LIMITS = {"login_failed": None, "login": "60/m/ip"}

# --- LabPortal policy -------------------------------------------------------
LABPORTAL_ALLOW_SIMULATION = env_bool("LABPORTAL_ALLOW_SIMULATION", DEBUG)
LABPORTAL_NODE_DOWN_AFTER_S = env_int("LABPORTAL_NODE_DOWN_AFTER_S", 60, minimum=5)
LABPORTAL_NODE_LOST_GRACE_S = env_int("LABPORTAL_NODE_LOST_GRACE_S", 300, minimum=0)
# A report an outage of the database held back is retried, backing off up to 15 s, for
# this long after the agent signed it: at least until its node could be declared lost.
# Each job's whole output is kept up to this many bytes (joblogs): past it, its head and
# its newest output are kept and the gap between them is marked.
LABPORTAL_JOB_LOG_MAX_BYTES = env_int(
    "LABPORTAL_JOB_LOG_MAX_BYTES", 100 * 1024 * 1024, minimum=64 * 1024
)
LABPORTAL_REPORT_RETRY_S = env_int(
    "LABPORTAL_REPORT_RETRY_S",
    LABPORTAL_NODE_DOWN_AFTER_S + LABPORTAL_NODE_LOST_GRACE_S,
    minimum=LABPORTAL_NODE_DOWN_AFTER_S + LABPORTAL_NODE_LOST_GRACE_S,
)
# Reports signed, or samples taken, longer ago than this are refused as stale (their nonces
# are kept this long, in the database).
LABPORTAL_REPORT_MAX_AGE_S = env_int("LABPORTAL_REPORT_MAX_AGE_S", 24 * 3600, minimum=600)
# Jobs against the node's heartbeats (docs/jobs.md, "Ways out"): a start the node has not
# acknowledged after LABPORTAL_START_ACK_S is sent again, LABPORTAL_START_RETRIES times;
# a job its node stops reporting is acted on after LABPORTAL_JOB_UNREPORTED_GRACE_S.
LABPORTAL_START_ACK_S = env_int("LABPORTAL_START_ACK_S", 120, minimum=10)
LABPORTAL_START_RETRIES = env_int("LABPORTAL_START_RETRIES", 2, minimum=0)
LABPORTAL_MAX_DISPATCHES = env_int("LABPORTAL_MAX_DISPATCHES", 3, minimum=1)
LABPORTAL_JOB_UNREPORTED_GRACE_S = env_int("LABPORTAL_JOB_UNREPORTED_GRACE_S", 60, minimum=10)
# A stop not confirmed LABPORTAL_STOP_CONFIRM_S after its SIGKILL is sent again,
# LABPORTAL_STOP_RETRIES times; then the portal ends the job itself.
LABPORTAL_STOP_CONFIRM_S = env_int("LABPORTAL_STOP_CONFIRM_S", 60, minimum=5)
LABPORTAL_STOP_RETRIES = env_int("LABPORTAL_STOP_RETRIES", 3, minimum=0)
# How far an agent's clock may be off before its job events are refused.
LABPORTAL_CLOCK_SKEW_S = env_int("LABPORTAL_CLOCK_SKEW_S", 300, minimum=0)
LABPORTAL_UID_RANGE_START = env_int("LABPORTAL_UID_RANGE_START", 20000, minimum=1000)

# --- Executor -------------------------------------------------------------------
# Who runs the jobs: LabPortal's own agents (the default), or an existing Slurm cluster
# (Slurm schedules and runs; the portal submits as each member's unix user and syncs back).
LABPORTAL_EXECUTOR = env_choice("LABPORTAL_EXECUTOR", "agents", ("agents", "slurm"))
# The executor classes by name (jobqueue/executor.py); a lab's own executor is named by
# its dotted path in LABPORTAL_EXECUTOR_CLASS and implements jobqueue.executor.Executor.
LABPORTAL_EXECUTORS = {
    "agents": "scheduling.executor.AgentsExecutor",
    "slurm": "slurm.executor.SlurmExecutor",
}
LABPORTAL_EXECUTOR_CLASS = env_str("LABPORTAL_EXECUTOR_CLASS") or ""
# slurmrestd's address (preferred): the portal signs a short-lived JWT for the member's unix
# user with Slurm's HS256 key (slurm.conf AuthAltParameters=jwt_key=...). Without it the
# portal runs the Slurm commands on its own host, sbatch/scancel through LABPORTAL_SLURM_RUN_AS.
LABPORTAL_SLURM_REST_URL = (env_str("LABPORTAL_SLURM_REST_URL", "") or "").rstrip("/")
LABPORTAL_SLURM_JWT_KEY_FILE = env_str("LABPORTAL_SLURM_JWT_KEY_FILE", "") or ""
LABPORTAL_SLURM_JWT_LIFETIME_S = env_int("LABPORTAL_SLURM_JWT_LIFETIME_S", 300, minimum=30)
# The Slurm user the portal reads the queue, nodes and accounting as (an operator).
LABPORTAL_SLURM_SERVICE_USER = env_str("LABPORTAL_SLURM_SERVICE_USER", "slurm") or "slurm"
LABPORTAL_SLURM_CONF = env_str("LABPORTAL_SLURM_CONF", "") or ""
# How the Slurm commands the portal runs as itself (sacctmgr, scontrol, squeue, sacct,
# sprio) authenticate: munge (the host's munged and key), or jwt: a short-lived token for
# LABPORTAL_SLURM_SERVICE_USER signed with LABPORTAL_SLURM_JWT_KEY_FILE in SLURM_JWT, for a
# portal in a container with no munge (docker-compose.slurm.yml). Commands run as a member
# (sbatch/scancel through LABPORTAL_SLURM_RUN_AS) never carry it.
LABPORTAL_SLURM_COMMANDS_AUTH = env_choice(
    "LABPORTAL_SLURM_COMMANDS_AUTH", "munge", ("munge", "jwt")
)
# The command prefix that runs sbatch/scancel as the member ({user}); never run as root.
LABPORTAL_SLURM_RUN_AS = env_str("LABPORTAL_SLURM_RUN_AS", "sudo -n -u {user} --") or ""
# How a job's container image runs: pyxis (srun --container-image), apptainer, or none.
LABPORTAL_SLURM_CONTAINER = env_choice(
    "LABPORTAL_SLURM_CONTAINER", "none", ("none", "pyxis", "apptainer")
)
# Where jobs write their output: a directory the nodes and the portal host share.
LABPORTAL_SLURM_OUTPUT_DIR = env_str("LABPORTAL_SLURM_OUTPUT_DIR", "/tmp") or "/tmp"
LABPORTAL_SLURM_SYNC_S = env_int("LABPORTAL_SLURM_SYNC_S", 15, minimum=2)
# The lab's rules in Slurm (docs/slurm.md). Plain-sbatch jobs no queue mapping matches are
# charged at this queue's rate; accounting is read this far back on each pass.
LABPORTAL_SLURM_DEFAULT_QUEUE = env_str("LABPORTAL_SLURM_DEFAULT_QUEUE", "normal") or "normal"
LABPORTAL_SLURM_ACCOUNTING_LOOKBACK_H = env_int(
    "LABPORTAL_SLURM_ACCOUNTING_LOOKBACK_H", 48, minimum=1
)
# Categories become accounts <prefix><name> under this parent; only those are managed.
LABPORTAL_SLURM_ACCOUNT_PREFIX = env_str("LABPORTAL_SLURM_ACCOUNT_PREFIX", "lp-") or "lp-"
LABPORTAL_SLURM_ACCOUNT_PARENT = env_str("LABPORTAL_SLURM_ACCOUNT_PARENT", "root") or "root"
LABPORTAL_SLURM_CLUSTER = env_str("LABPORTAL_SLURM_CLUSTER", "") or ""
# The emergency channel's QOS, created if missing with this priority (0: one above the
# highest QOS priority, since Slurm divides every QOS priority by the highest).
LABPORTAL_SLURM_TOP_QOS = env_str("LABPORTAL_SLURM_TOP_QOS", "lp-emergency") or "lp-emergency"
LABPORTAL_SLURM_TOP_QOS_PRIORITY = env_int("LABPORTAL_SLURM_TOP_QOS_PRIORITY", 0, minimum=0)
# The nice value of pending jobs of members at zero credit; 0: one more than the sum of
# slurm.conf's PriorityWeight* (so they start after every job of a member with credit).
LABPORTAL_SLURM_ZERO_CREDIT_NICE = env_int("LABPORTAL_SLURM_ZERO_CREDIT_NICE", 0, minimum=0)
# GPU memory (MiB) per GRES type, e.g. "a100=81920,l40s=46068": Slurm's GRES gives none. A
# monitor-only agent's report of the node's real GPUs wins over it.
LABPORTAL_SLURM_GPU_MEMORY_MB = env_int_map(
    "LABPORTAL_SLURM_GPU_MEMORY_MB", example="a100=81920,l40s=46068"
)
# The GRES type of each portal GPU model name, e.g. "NVIDIA A100-SXM4-80GB=a100" (keys
# case-insensitive): a job asking that model is sent as --gres=gpu:a100:N. Without an
# entry, a model that is itself a GRES type on the cluster (the inventory's names) is sent as is.
LABPORTAL_SLURM_GPU_TYPES = env_str_map(
    "LABPORTAL_SLURM_GPU_TYPES", example="NVIDIA A100-SXM4-80GB=a100,NVIDIA L40S=l40s"
)
if LABPORTAL_EXECUTOR == "slurm" and LABPORTAL_SLURM_REST_URL and not LABPORTAL_SLURM_JWT_KEY_FILE:
    raise ImproperlyConfigured(
        "LABPORTAL_SLURM_REST_URL is set but LABPORTAL_SLURM_JWT_KEY_FILE is not: give the path "
        "of Slurm's JWT key (slurm.conf AuthAltParameters=jwt_key=...), readable by the portal."
    )
if LABPORTAL_SLURM_COMMANDS_AUTH == "jwt" and not LABPORTAL_SLURM_JWT_KEY_FILE:
    raise ImproperlyConfigured(
        "LABPORTAL_SLURM_COMMANDS_AUTH=jwt needs LABPORTAL_SLURM_JWT_KEY_FILE: give the path of "
        "Slurm's JWT key (slurm.conf and slurmdbd.conf AuthAltParameters=jwt_key=...), "
        "readable by the portal, or set LABPORTAL_SLURM_COMMANDS_AUTH=munge."
    )

# --- Files (docs/files.md) ----------------------------------------------------
# The portal reads and writes members' files on the lab's shared storage, mounted on its
# host at the same paths as on the GPU nodes: a volume whose host path lies under none of
# these roots is listed as not reachable from the portal. Colon-separated, like the
# agent's LABPORTAL_ALLOWED_MOUNT_ROOTS; empty: no volume is reachable.
LABPORTAL_FILES_ROOTS = [
    r for r in (env_str("LABPORTAL_FILES_ROOTS", "") or "").split(":") if r.strip()
]
# Each job's working folder is <root>/<username>/<job id> (shared storage, and each
# agent's --job-dir-root); empty: jobs get none.
LABPORTAL_JOB_DIR_ROOT = env_str("LABPORTAL_JOB_DIR_ROOT", "") or ""
for _root in [*LABPORTAL_FILES_ROOTS, LABPORTAL_JOB_DIR_ROOT]:
    if _root and not _root.startswith("/"):
        raise ImproperlyConfigured(
            f"LABPORTAL_FILES_ROOTS and LABPORTAL_JOB_DIR_ROOT take absolute paths (got {_root!r})"
        )
LABPORTAL_FILE_UPLOAD_MAX_MB = env_int("LABPORTAL_FILE_UPLOAD_MAX_MB", 1024, minimum=1)

# --- Backups ------------------------------------------------------------------
# Uploaded files (none yet by default); backed up with the database when present.
MEDIA_URL = "/media/"
MEDIA_ROOT = Path(env_str("LABPORTAL_MEDIA_ROOT", str(VAR_DIR / "media")) or "")
LABPORTAL_BACKUP_DIR = Path(env_str("LABPORTAL_BACKUP_DIR", str(VAR_DIR / "backups")) or "")
LABPORTAL_BACKUP_KEEP_DAILY = env_int("LABPORTAL_BACKUP_KEEP_DAILY", 7, minimum=1)
LABPORTAL_BACKUP_KEEP_WEEKLY = env_int("LABPORTAL_BACKUP_KEEP_WEEKLY", 4, minimum=0)
LABPORTAL_BACKUP_KEEP_MONTHLY = env_int("LABPORTAL_BACKUP_KEEP_MONTHLY", 6, minimum=0)
LABPORTAL_BACKUP_HOUR = env_int("LABPORTAL_BACKUP_HOUR", 3, minimum=0)
if LABPORTAL_BACKUP_HOUR > 23:
    raise ImproperlyConfigured(
        f"LABPORTAL_BACKUP_HOUR must be an hour from 0 to 23 (got {LABPORTAL_BACKUP_HOUR})"
    )
# Nightly backups from beat (ops/beat.py); off in the demo (DEBUG), on in production.
LABPORTAL_BACKUP_ENABLED = env_bool("LABPORTAL_BACKUP_ENABLED", not DEBUG)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        # One JSON object a line, with request id, user, job id and task id (Loki, ELK).
        "json": {"()": "core.log_context.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": env_choice("LOG_FORMAT", "plain", ("plain", "json")),
        }
    },
    "root": {
        "handlers": ["console"],
        "level": env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
    },
}

# --- Request size -----------------------------------------------------------
# The largest body a member sends is a batch of jobs: 500 with 8,000-character
# commands is about 4.2 MB. Larger bodies get a 413 before they are read.
LABPORTAL_MAX_REQUEST_BYTES = env_int("LABPORTAL_MAX_REQUEST_BYTES", 5 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = LABPORTAL_MAX_REQUEST_BYTES

# --- Security headers -------------------------------------------------------
# HSTS is sent only on https responses (behind a proxy: X-Forwarded-Proto https).
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# The TLS proxy redirects http to https (deploy/, docs/deployment.md); SECURE_SSL_REDIRECT=true
# makes the portal do it too. HSTS for subdomains and preloading are the domain's decision, not
# the portal's: off unless set. So `check --deploy` does not warn about these three.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W008", "security.W021"]
# The pages load only their own scripts and styles (htmx is served locally, with
# its inline indicator style turned off in portal.js); style attributes stay
# allowed for the calendar's bars.
LABPORTAL_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "style-src-attr 'unsafe-inline'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# The terminal page only: xterm.js writes its theme and renderer rules into <style>
# elements it creates (it takes no nonce); scripts stay as strict as everywhere.
LABPORTAL_TERMINAL_CONTENT_SECURITY_POLICY = LABPORTAL_CONTENT_SECURITY_POLICY.replace(
    "style-src 'self';", "style-src 'self' 'unsafe-inline';"
)

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Periodic work -----------------------------------------------------------------
# Each app keeps its periodic work next to its tasks, in <app>/beat.py: BEAT_SCHEDULE, or
# beat_schedule(settings) given the values above (Slurm mode, backups on). They are read at
# the schedule's first use (beat's start, `manage.py check`), not when the settings are.
CELERY_BEAT_SCHEDULE = AppsBeatSchedule(LOCAL_APPS)
