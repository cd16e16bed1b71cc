"""Settings, read from the environment (django-environ).

Every variable is listed in `.env.example`. The embedded default needs no server: SQLite, Celery over
the filesystem transport, one store directory per site under ``FRP_VAR_DIR``. Production
(``DEBUG=False``) refuses to start without ``SECRET_KEY`` and the ledger's signing key.
"""

import os
from pathlib import Path
from urllib.parse import urlsplit

import environ
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=True)
VAR_DIR = Path(env.str("FRP_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700: it holds files with secrets in them."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid == os.getuid():
        path.chmod(0o700)
    return path


# The embedded default keeps its files here (database, keys, mail, queue): 0700.
private_dir(VAR_DIR)

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
    "portal.middleware.BodyLimitMiddleware",  # before anything reads a body (its process_view)
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "portal.middleware.UserSessionsMiddleware",  # allauth's, throttled (ADR 0017)
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
    _db_file = str(DATABASES["default"]["NAME"])
    if _db_file and _db_file != ":memory:" and not _db_file.startswith("file:"):
        # It holds password hashes, sessions and IdP secrets: 0600 in a 0700 folder. SQLite
        # creates its -wal and -shm files with the database file's mode.
        private_dir(Path(_db_file).parent)
        os.close(os.open(_db_file, os.O_CREAT | os.O_WRONLY, 0o600))
        if Path(_db_file).stat().st_uid == os.getuid():
            os.chmod(_db_file, 0o600)
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
# Local accounts prove their address (a confirmation link) before it counts for anything, such as
# an invitation; SSO addresses count as verified only where the IdP is trusted for them
# (portal.adapters: the institution's e-mail domain, set by the platform admin).
ACCOUNT_EMAIL_VERIFICATION = "mandatory"
ACCOUNT_UNIQUE_EMAIL = True
# Single sign-on: identity is (IdP, subject). An e-mail address never links accounts.
SOCIALACCOUNT_ADAPTER = "portal.adapters.SocialAccountAdapter"
SOCIALACCOUNT_AUTO_SIGNUP = True
# An SSO account needs no e-mail: an address its IdP is not trusted for is dropped (never the
# account's e-mail or username, so it cannot squat another institution's member's address).
SOCIALACCOUNT_EMAIL_REQUIRED = False
SOCIALACCOUNT_EMAIL_AUTHENTICATION = False
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = False
SOCIALACCOUNT_EMAIL_VERIFICATION = "none"
SOCIALACCOUNT_LOGIN_ON_GET = False  # starting a sign-in is a POST (CSRF-protected)
SOCIALACCOUNT_STORE_TOKENS = False
# OIDC issuers on loopback, private or link-local addresses are refused (server-side request
# forgery, portal/oidc_guard.py) unless named here: host names, addresses or CIDR networks.
FRP_OIDC_ALLOWED_HOSTS = env.list("FRP_OIDC_ALLOWED_HOSTS", default=[])
# Issuers must use https, except while DEBUG is on (the setting follows DEBUG at start-up).
FRP_OIDC_ALLOW_HTTP = env.bool("FRP_OIDC_ALLOW_HTTP", default=DEBUG)
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
MFA_TOTP_ISSUER = "Federated Research Portal"
USERSESSIONS_TRACK_ACTIVITY = True
ACCOUNT_LOGOUT_ON_GET = False
ACCOUNT_SESSION_REMEMBER = False
# A completed password reset signs its owner in (through allauth's login stages, MFA included):
# anyone can lock an account's password sign-in by failing it, and its owner gets in through
# the mailbox even when the lock is set again at once (issue 9, F6; portal.adapters).
ACCOUNT_LOGIN_ON_PASSWORD_RESET = True
# Accounts that sign in only through single sign-on get no reset link (portal.forms).
ACCOUNT_FORMS = {"reset_password": "portal.forms.ResetPasswordForm"}
# Secrets at rest (OIDC client secrets): Fernet keys, comma-separated, the first encrypts
# (portal/secretbox.py). Empty: the key file below, created (0600, folder 0700) on first use.
FRP_FIELD_KEYS = env.list("FRP_FIELD_KEYS", default=[])
FRP_FIELD_KEY_FILE = Path(
    env.str("FRP_FIELD_KEY_FILE", default=str(VAR_DIR / "secrets" / "field.key"))
)
if not DEBUG and not FRP_FIELD_KEYS and "FRP_FIELD_KEY_FILE" not in os.environ:
    raise ImproperlyConfigured(
        "set FRP_FIELD_KEYS (Fernet keys that encrypt secrets at rest, e.g. OIDC client secrets)"
    )

# Mail carries secrets (confirmation and password-reset links): never to a log. With EMAIL_URL
# (smtp://user:password@host:587?tls=True; compose: its mail catcher) over SMTP; otherwise the
# embedded default writes each message as a file (0600) into FRP_VAR_DIR/mail (0700).
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="portal@localhost")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
if env.str("EMAIL_URL", default=""):
    globals().update(env.email_url("EMAIL_URL"))
else:
    EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="portal.mailfiles.PrivateFileEmailBackend")
    EMAIL_FILE_PATH = private_dir(VAR_DIR / "mail")
if EMAIL_BACKEND == "django.core.mail.backends.console.EmailBackend" and not DEBUG:
    raise ImproperlyConfigured(
        "the console e-mail backend writes confirmation and reset links into the logs: set "
        "EMAIL_URL (SMTP) or leave EMAIL_BACKEND unset (files in FRP_VAR_DIR/mail)"
    )

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
    # Sign-in rate limits count the client's address, not the proxy's (every request reaches
    # gunicorn from nginx): nginx appends the client to X-Forwarded-For
    # ($proxy_add_x_forwarded_for), and allauth takes the entry that many from the end, so a
    # client's own X-Forwarded-For entries change nothing. Without it, one visitor's failed
    # sign-ins locked every visitor out (issue 9, finding 9).
    ALLAUTH_TRUSTED_PROXY_COUNT = env.int("FRP_TRUSTED_PROXY_COUNT", default=1)
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
# Pools: SuperNode health, batch-system readings (Slurm) and provider carbon forecasts.
_POOLS_REFRESH_SECONDS = env.float("FRP_POOLS_REFRESH_SECONDS", default=300.0)
CELERY_BEAT_SCHEDULE = {
    "federation-reconcile": {
        "task": "federation.job_reconcile_all",
        "schedule": _RECONCILE_SECONDS,
        # a tick not started before the next one is due is dropped: no backlog behind slow ticks
        "options": {"expires": _RECONCILE_SECONDS},
    },
    # Pools: SuperNode health, Slurm readings and provider carbon forecasts (issue 15).
    "federation-pools-refresh": {
        "task": "federation.pools_refresh",
        "schedule": _POOLS_REFRESH_SECONDS,
        "options": {"expires": _POOLS_REFRESH_SECONDS},
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

# --- Input limits (sandbox uploads and ingest) ---------------------------------------------------
# Checked while streaming; a file over a limit is refused with a message naming it. The upload limit
# matches docker-compose's nginx (client_max_body_size 64m).
FRP_MAX_UPLOAD_BYTES = env.int("FRP_MAX_UPLOAD_BYTES", default=64 * 1024 * 1024)
FRP_MAX_COLUMNS = env.int("FRP_MAX_COLUMNS", default=1000)
FRP_MAX_LINE_CHARS = env.int("FRP_MAX_LINE_CHARS", default=1_000_000)
# Columns of a dataset's profile per page on the dataset page.
FRP_PROFILE_PAGE_COLUMNS = 50

# --- Cache ----------------------------------------------------------------------------------------
# Sign-in rate limits (allauth) and other counters must be shared by every process that serves
# requests: Redis in compose and PostgreSQL deployments (default: the Redis broker's server), the
# local-memory cache only in the embedded default (SQLite, one web process).
_SQLITE = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
if _SQLITE:
    _CACHE_DEFAULT = "locmemcache://"
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    _CACHE_DEFAULT = CELERY_BROKER_URL
else:
    _CACHE_DEFAULT = ""
CACHES = {"default": env.cache("CACHE_URL", default=_CACHE_DEFAULT or "locmemcache://")}
CACHES["default"].setdefault("KEY_PREFIX", "frp")
if not _SQLITE and CACHES["default"]["BACKEND"].endswith("LocMemCache"):
    raise ImproperlyConfigured(
        "set CACHE_URL (e.g. redis://host:6379/1): with PostgreSQL several processes serve "
        "requests, and a local-memory cache would count sign-in attempts per process"
    )
if not DEBUG and CACHES["default"]["BACKEND"].endswith("DummyCache"):
    raise ImproperlyConfigured(
        "CACHE_URL=dummycache:// stores nothing, which turns the sign-in rate limits off: set a "
        "real cache (e.g. redis://host:6379/1); the dummy cache is only for DEBUG"
    )

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
# The embedded default's local federation (federation_up / federation_down / supernode_restart).
FRP_FEDERATION_DIR = Path(env.str("FRP_FEDERATION_DIR", default=str(VAR_DIR / "federation")))
# The URL the ServerApp posts round metrics to (signed, see federation/callbacks.py).
FRP_CALLBACK_BASE_URL = env.str("FRP_CALLBACK_BASE_URL", default="http://127.0.0.1:8000")
# The callback link is TLS (issue 13): https://, verified by the ServerApp against
# FRP_CALLBACK_CA_FILE in the SuperLink's environment. Plain http:// only while DEBUG (the
# embedded default: runserver on loopback), or with FRP_CALLBACK_ALLOW_HTTP=True for a link that
# never leaves the portal's host (compose: the ServerApps post to gunicorn on the stack's network).
FRP_CALLBACK_ALLOW_HTTP = env.bool("FRP_CALLBACK_ALLOW_HTTP", default=False)
# (the ServerApp's Reporter takes lower-case http:// and https:// only)
if (
    not FRP_CALLBACK_BASE_URL.startswith(("http://", "https://"))
    or not urlsplit(FRP_CALLBACK_BASE_URL).hostname
):
    raise ImproperlyConfigured(
        f"FRP_CALLBACK_BASE_URL must be an https:// URL, not {FRP_CALLBACK_BASE_URL[:60]!r}"
    )
if FRP_CALLBACK_BASE_URL.startswith("http://") and not DEBUG and not FRP_CALLBACK_ALLOW_HTTP:
    raise ImproperlyConfigured(
        f"FRP_CALLBACK_BASE_URL={FRP_CALLBACK_BASE_URL[:60]} is plain HTTP: outside DEBUG the "
        "ServerApp's callbacks (a job's results) go over https://; set FRP_CALLBACK_ALLOW_HTTP=True "
        "only for a link that never leaves the portal's host"
    )
# The platform callback key (ADR 0014): held by the portal and the SuperLink's environment only.
# Empty: the key file below, created (mode 0600, folder 0700) on first use.
FRP_CALLBACK_KEY = env.str("FRP_CALLBACK_KEY", default="")
FRP_CALLBACK_KEY_FILE = Path(
    env.str("FRP_CALLBACK_KEY_FILE", default=str(VAR_DIR / "secrets" / "callback.key"))
)
if not DEBUG and not FRP_CALLBACK_KEY and "FRP_CALLBACK_KEY_FILE" not in os.environ:
    # The web server verifies and the SuperLink's ServerApps sign: both must hold the same key.
    raise ImproperlyConfigured(
        "set FRP_CALLBACK_KEY (the same value in the SuperLink's environment), or "
        "FRP_CALLBACK_KEY_FILE on a volume both share"
    )
# The portal's model store (issue 14; ADR 0026): final models and the ServerApp's round
# checkpoints. The SuperLink's environment gets the same URL (federation.callbacks), never a run
# config. file:///abs/path (embedded default) or s3://ACCESS:SECRET@host:port/bucket.
FRP_MODEL_STORE_URL = env.str("FRP_MODEL_STORE_URL", default=(VAR_DIR / "model-store").as_uri())
# A round with no reply within this many seconds drops the silent sites (FedAvg's default: 3600 s).
FRP_ROUND_TIMEOUT = env.float("FRP_ROUND_TIMEOUT", default=120.0)
# Seconds between the ServerApp's pulls of replies from the SuperLink (run config
# ``poll-interval``; frp_flwr.contract.RunConfig's default): shorter answers a round sooner, at
# a small gRPC call per pull for both processes.
FRP_SERVERAPP_POLL_SECONDS = env.float("FRP_SERVERAPP_POLL_SECONDS", default=0.2)
if not 0.001 <= FRP_SERVERAPP_POLL_SECONDS <= 60:
    raise ImproperlyConfigured(
        f"FRP_SERVERAPP_POLL_SECONDS must be 0.001–60 s (the run config's range), "
        f"not {FRP_SERVERAPP_POLL_SECONDS}"
    )
# An active job whose SuperLink has not answered for this long (seconds) is failed; the job page
# says the SuperLink is unreachable from the first reconcile tick that finds it so.
FRP_SUPERLINK_LOST_SECONDS = env.float("FRP_SUPERLINK_LOST_SECONDS", default=120.0)
# A job LAUNCHING this long (seconds) with no run on the SuperLink carrying its launch nonce is
# queued again (the worker died before it started the run).
FRP_STALE_LAUNCH_SECONDS = env.float("FRP_STALE_LAUNCH_SECONDS", default=180.0)
# Cores a site's ClientApp is allocated (the usage record's reserved cores): a site's reported CPU
# seconds above cores × the time the ServerApp measured are refused as impossible (ADR 0024).
FRP_CLIENTAPP_CORES = env.int("FRP_CLIENTAPP_CORES", default=1)
# Optional: a folder where each job's ServerApp appends every reply it receives (an audit of exactly
# what left the sites). Empty: off.
FRP_REPLY_LOG_DIR = env.str("FRP_REPLY_LOG_DIR", default="")
# The scheduler's plan (federation.admission): grid step and horizon.
FRP_SCHED_STEP_SECONDS = env.float("FRP_SCHED_STEP_SECONDS", default=300.0)
FRP_SCHED_HORIZON_HOURS = env.float("FRP_SCHED_HORIZON_HOURS", default=168.0)
# Pools read from Slurm (federation.pool_adapters): the scontrol program, seconds per call, and
# how old a reading may be before the pool counts as down (default: three refreshes).
FRP_SLURM_SCONTROL = env.str("FRP_SLURM_SCONTROL", default="scontrol")
FRP_SLURM_TIMEOUT_SECONDS = env.float("FRP_SLURM_TIMEOUT_SECONDS", default=10.0)
FRP_POOL_READING_MAX_AGE_SECONDS = env.float(
    "FRP_POOL_READING_MAX_AGE_SECONDS", default=3 * _POOLS_REFRESH_SECONDS
)
# Carbon-intensity providers of pools whose source is a provider (federation.carbon).
FRP_CARBON_ELECTRICITYMAPS_URL = env.str(
    "FRP_CARBON_ELECTRICITYMAPS_URL", default="https://api.electricitymap.org"
)
FRP_CARBON_ELECTRICITYMAPS_TOKEN = env.str("FRP_CARBON_ELECTRICITYMAPS_TOKEN", default="")
FRP_CARBON_WATTTIME_URL = env.str("FRP_CARBON_WATTTIME_URL", default="https://api.watttime.org")
FRP_CARBON_WATTTIME_TOKEN = env.str("FRP_CARBON_WATTTIME_TOKEN", default="")
# The local federation: one SuperNode per site, each with its own store and keyring.
FRP_SITES_DIR = Path(env.str("FRP_SITES_DIR", default=str(VAR_DIR / "sites")))
# What a site kit tells a site (federation/onboarding.py): the SuperLink address its SuperNode dials
# (empty: the local federation's), the CA certificate that verifies the SuperLink (and, unless
# FRP_PORTAL_CA_FILE names another, the portal's HTTPS), and the portal URL its tool talks to.
FRP_SUPERLINK_PUBLIC_ADDRESS = env.str("FRP_SUPERLINK_PUBLIC_ADDRESS", default="")
FRP_FEDERATION_CA_FILE = Path(
    env.str("FRP_FEDERATION_CA_FILE", default=str(VAR_DIR / "federation" / "pki" / "ca.crt"))
)
FRP_PORTAL_URL = env.str("FRP_PORTAL_URL", default="") or FRP_CALLBACK_BASE_URL
FRP_PORTAL_CA_FILE = env.str("FRP_PORTAL_CA_FILE", default="")

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

# Every handler redacts secrets in request paths (reset and confirmation keys, invitation tokens,
# an IdP's code and state): runserver's access log (django.server) and Django's request warnings
# (django.request, through "django") included. gunicorn: --logger-class portal.logredact.GunicornLogger.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "portal.logredact.RedactSecretsFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "django.server": {
            "()": "django.utils.log.ServerFormatter",
            "format": "[{server_time}] {message}",
            "style": "{",
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]},
        "django.server": {
            "class": "logging.StreamHandler",
            "formatter": "django.server",
            "filters": ["redact"],
        },
    },
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": ["django.server"], "level": "INFO", "propagate": False},
        # One INFO line per Control API request (the SuperLink client) is noise in commands'
        # progress output; its warnings and errors still show.
        "httpx": {"level": "WARNING"},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
