"""Settings, read from the environment (django-environ).

Every variable is listed in `.env.example`. The embedded default needs no server: SQLite, Celery over
the filesystem transport, one store directory per site under ``FRP_VAR_DIR``. Production
(``DEBUG=False``) refuses to start without ``SECRET_KEY`` and the ledger's signing key.
"""

import os
from pathlib import Path

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=True)
VAR_DIR = Path(env.str("FRP_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)  # the embedded default keeps its files here

if DEBUG:
    SECRET_KEY = env.str("SECRET_KEY", default="insecure-development-key-do-not-use-in-production")
else:
    SECRET_KEY = env.str("SECRET_KEY")  # raises ImproperlyConfigured when missing

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    "allauth.socialaccount.providers.saml",
    "allauth.mfa",
    "allauth.usersessions",
    "portal",
    "sandbox",
    "federation",
    "accounting",
    "demo",  # above all four: seeds and drives the demo federation
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "allauth.usersessions.middleware.UserSessionsMiddleware",
    "portal.middleware.RequireMFAMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

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
                "portal.context_processors.navigation",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'portal.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The worker and the web server share the file: wait for locks rather than fail at once.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "portal:dashboard"
ACCOUNT_ADAPTER = "portal.adapters.AccountAdapter"
FRP_OPEN_SIGNUP = env.bool("FRP_OPEN_SIGNUP", default=False)
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
ACCOUNT_UNIQUE_EMAIL = True
# Single sign-on: identity is (IdP, subject). An e-mail address never links accounts.
SOCIALACCOUNT_ADAPTER = "portal.adapters.SocialAccountAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = False
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_LOGIN_ON_GET = False  # starting a sign-in is a POST (CSRF-protected)
SOCIALACCOUNT_STORE_TOKENS = False
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = "Federated Research Portal"
USERSESSIONS_TRACK_ACTIVITY = True
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_SESSION_REMEMBER = False
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "portal" / "static"]

# Behind a TLS-terminating proxy (docker-compose's nginx): trust its X-Forwarded-Proto.
if env.bool("FRP_BEHIND_TLS_PROXY", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG

# --- Celery -------------------------------------------------------------------------------------
# Embedded default: the filesystem transport, no broker server; the run command starts a worker.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = VAR_DIR / "celery-queue"
    for _d in (_queue_dir, VAR_DIR / "celery-processed", VAR_DIR / "celery-control"):
        _d.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT = "portal.broker:Transport"  # atomic puts (see portal/broker.py)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "polling_interval": 0.2,  # seconds between folder scans (kombu's default is 1 s)
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(VAR_DIR / "celery-processed"),
        "control_folder": str(VAR_DIR / "celery-control"),
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 600
CELERY_TASK_TIME_LIMIT = 660
_RECONCILE_SECONDS = env.float("FRP_RECONCILE_SECONDS", default=5.0)
_LEDGER_CHECKPOINT_SECONDS = env.float("FRP_LEDGER_CHECKPOINT_SECONDS", default=60.0)
_ACCOUNTING_SWEEP_SECONDS = env.float("FRP_ACCOUNTING_SWEEP_SECONDS", default=300.0)
CELERY_BEAT_SCHEDULE = {
    "federation-reconcile": {
        "task": "federation.job_reconcile_all",
        "schedule": _RECONCILE_SECONDS,
        # a tick not started before the next one is due is dropped: no backlog behind slow ticks
        "options": {"expires": _RECONCILE_SECONDS},
    },
    # Close last month's invoices; hourly so a missed tick is caught up (the task is idempotent).
    "accounting-invoice-close": {
        "task": "accounting.invoice_close",
        "schedule": crontab(minute=17),
        "options": {"expires": 3000},
    },
    # Queue the accounting of finished jobs whose hand-off was lost or left a step pending.
    "accounting-sweep": {
        "task": "accounting.job_accounting_sweep",
        "schedule": _ACCOUNTING_SWEEP_SECONDS,
        "options": {"expires": _ACCOUNTING_SWEEP_SECONDS},
    },
    "portal-ledger-checkpoint": {
        "task": "portal.ledger_checkpoint_create",
        "schedule": _LEDGER_CHECKPOINT_SECONDS,
        "options": {"expires": _LEDGER_CHECKPOINT_SECONDS},
    },
}

# --- Accounting ---------------------------------------------------------------------------------
# The federation's one billing currency (ISO 4217) for price rules and invoices.
FRP_BILLING_CURRENCY = env.str("FRP_BILLING_CURRENCY", default="EUR")
# Accounting steps of a finished job (ADR 0015): tries of a step after a transient error (database
# or broker away), the first wait in seconds (doubled per try, full jitter, at most 600 s), and how
# long a finished job or a pending step waits before the sweep queues it again.
FRP_ACCOUNTING_RETRIES = env.int("FRP_ACCOUNTING_RETRIES", default=5)
FRP_ACCOUNTING_RETRY_BACKOFF = env.int("FRP_ACCOUNTING_RETRY_BACKOFF", default=10)
FRP_ACCOUNTING_SWEEP_GRACE_SECONDS = env.float("FRP_ACCOUNTING_SWEEP_GRACE_SECONDS", default=900.0)

# --- Federation ---------------------------------------------------------------------------------
# Where the Flower CLI keeps its config.toml naming the SuperLink (see federation/superlink.py).
FRP_FLWR_HOME = Path(env.str("FRP_FLWR_HOME", default=str(VAR_DIR / "flwr-control")))
FRP_FEDERATION_NAME = env.str("FRP_FEDERATION_NAME", default="local")
FRP_FLWR_APP_DIR = BASE_DIR / "federation" / "flwr_app"
# The URL the ServerApp posts round metrics to (HMAC-signed, see federation/callbacks.py).
FRP_CALLBACK_BASE_URL = env.str("FRP_CALLBACK_BASE_URL", default="http://127.0.0.1:8000")
# A round with no reply within this many seconds drops the silent sites (FedAvg's default: 3600 s).
FRP_ROUND_TIMEOUT = env.float("FRP_ROUND_TIMEOUT", default=120.0)
# Optional: a folder where each job's ServerApp appends every reply it receives (an audit of exactly
# what left the sites). Empty: off.
FRP_REPLY_LOG_DIR = env.str("FRP_REPLY_LOG_DIR", default="")
# The local federation: one SuperNode per site, each with its own store and keyring.
FRP_SITES_DIR = Path(env.str("FRP_SITES_DIR", default=str(VAR_DIR / "sites")))

# --- Ledger (portal.ledger) ---------------------------------------------------------------------
# The log's origin line in its checkpoints (c2sp.org/tlog-checkpoint); default: <first host>/ledger.
_LEDGER_HOST = next((h for h in ALLOWED_HOSTS if h[:1] not in {"", ".", "*", "["}), "localhost")
FRP_LEDGER_ORIGIN = env.str("FRP_LEDGER_ORIGIN", default=f"{_LEDGER_HOST}/ledger")
# The platform's Ed25519 checkpoint signing key as a note signer key (PRIVATE+KEY+name+id+base64).
# Empty: the key file below, created (mode 0600) with a fresh key named after the origin on first use.
FRP_LEDGER_SIGNER_KEY = env.str("FRP_LEDGER_SIGNER_KEY", default="")
FRP_LEDGER_KEY_FILE = Path(
    env.str("FRP_LEDGER_KEY_FILE", default=str(VAR_DIR / "ledger" / "signer.key"))
)
if not DEBUG and not FRP_LEDGER_SIGNER_KEY and "FRP_LEDGER_KEY_FILE" not in os.environ:
    # Several processes (web shows the key, worker signs) must share one key: name it in production.
    raise ImproperlyConfigured(
        "set FRP_LEDGER_SIGNER_KEY (or FRP_LEDGER_KEY_FILE on a volume every process shares)"
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
