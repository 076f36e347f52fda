"""Settings of the MedSplit coordinator.

Everything a deployment changes comes from the environment; the defaults run a local,
embedded coordinator on SQLite. See docs/deploy.md.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from kernel.cache import cache_settings
from medsplit.channel.connect import is_cluster_url
from medsplit.channel.keys import RelayKeys
from medsplit.passwords import WeakPasswordError, check_password

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("MEDSPLIT_DATA_DIR", BASE_DIR.parent / "var"))

DEBUG = os.environ.get("MEDSPLIT_DEBUG", "0") == "1"
# The development default is refused in production by `check --deploy`; set
# MEDSPLIT_SECRET_KEY in any real deployment.
SECRET_KEY = os.environ.get(
    "MEDSPLIT_SECRET_KEY", "django-insecure-medsplit-development-only-change-me-0123456789"
)
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("MEDSPLIT_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(
        ","
    )
    if h.strip()
]

INSTALLED_APPS = [
    # Django's admin, with the coordinator's own site (coordinator/admin_site.py); its
    # URLs exist only with MEDSPLIT_DJANGO_ADMIN=1 (below).
    "coordinator.admin_app.AdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Before staticfiles: its `runserver` (coordinator/dev_server.py) is the one run.
    "coordinator",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "accounts",
    "hospitals",
    "training",
    "audit",
    "monitoring",
    "reports",
    "exports",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The coordinator serves its own scripts and styles: hospital networks block CDNs.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "coordinator.urls"
WSGI_APPLICATION = "coordinator.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR.parent / "frontend" / "src"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# SQLite is the embedded default; DATABASE_URL (postgres://...) selects PostgreSQL.
DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{DATA_DIR / 'coordinator.sqlite3'}",
        conn_max_age=60,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    # Writers queue for the lock instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 20}
    # A file, not memory, so that workers started by the tests share the test database
    # (they are handed its path); in the temporary folder, one per test run, so that
    # runs side by side never share one and the tests write nothing into the tree.
    DATABASES["default"]["TEST"] = {
        "NAME": str(Path(tempfile.gettempdir()) / f"medsplit-test-{os.getpid()}.sqlite3")
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# Without `collectstatic`, files are served straight from the apps (fine for a small
# coordinator); after it, from STATIC_ROOT.
WHITENOISE_USE_FINDERS = True
# The dashboard (frontend/): its own scripts and styles, and the pinned third-party ones
# `npm ci && npm run build` copies into frontend/vendor/.
FRONTEND_DIR = BASE_DIR.parent / "frontend"
STATICFILES_DIRS = [
    ("dashboard", FRONTEND_DIR / "src"),
    ("dashboard/vendor", FRONTEND_DIR / "vendor"),
]
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns at start when it is missing

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's scripts read it to send X-CSRFToken
SESSION_COOKIE_SECURE = os.environ.get("MEDSPLIT_SECURE_COOKIES", "0") == "1"
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE


def _int_setting(name: str, default: int, *, least: int) -> int:
    raw = os.environ.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = least - 1
    if value < least:
        raise ImproperlyConfigured(
            f"{name} must be a whole number of at least {least}, got {raw!r}"
        )
    return value


# How many reverse proxies stand in front of gunicorn, each overwriting X-Forwarded-For
# with the address it was reached from (docs/deploy.md's nginx sample). 0: no proxy, the
# peer address is the client's. Throttles and the audit log read the client's address
# through kernel.actors.client_ip, the one function that applies this.
TRUSTED_PROXIES = _int_setting("MEDSPLIT_TRUSTED_PROXIES", 0, least=0)
if TRUSTED_PROXIES:
    # Behind the proxy, which terminates TLS and says so (it overwrites the header).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Shared by every gunicorn process (throttles, sign-in delays, long-poll slots, cut
# tables) in any deployment; local memory only in the embedded, one-process mode.
try:
    CACHES = cache_settings(
        os.environ.get("MEDSPLIT_CACHE_URL", "").strip(),
        key_prefix=f"{os.environ.get('MEDSPLIT_RELAY_PREFIX', 'medsplit')}-cache",
    )
except ValueError as e:
    raise ImproperlyConfigured(str(e)) from e

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes "not signed in" a 401, not a 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "hospitals.authentication.AgentTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # X-Forwarded-For is read only behind this many proxies (MEDSPLIT_TRUSTED_PROXIES).
    "NUM_PROXIES": TRUSTED_PROXIES,
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "kernel.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "kernel.errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": {
        # Secrets are long and random; these limits stop online guessing and floods.
        "sign_in": os.environ.get("MEDSPLIT_THROTTLE_SIGN_IN", "10/minute"),
        "enrolment": os.environ.get("MEDSPLIT_THROTTLE_ENROLMENT", "10/minute"),
        "token": os.environ.get("MEDSPLIT_THROTTLE_TOKEN", "30/minute"),
        # Each new input shape costs seconds of CPU (training/validation.py).
        "cut_table": os.environ.get("MEDSPLIT_THROTTLE_CUT_TABLE", "30/minute"),
    },
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "MedSplit coordinator API",
    "DESCRIPTION": "Hospitals, jobs, turns and the audit log of a MedSplit consortium.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Served by the coordinator itself: hospital networks are often closed to CDNs.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several models have a `status`; name their enums apart.
    "ENUM_NAME_OVERRIDES": {
        "HospitalStatusEnum": "hospitals.models.Hospital.Status",
        "AgentStatusEnum": "hospitals.models.Hospital.AgentStatus",
        "TurnStatusEnum": "training.models.Turn.Status",
        "JobStateEnum": "training.states.JobState",
        "AuditProblemKindEnum": "audit.selectors.ProblemKind",
    },
}

# MedSplit's own settings.
MEDSPLIT = {
    # Django's admin at /admin/ (read-only model pages; people sign in on the dashboard).
    # Off unless asked for, and off by default outside development.
    "DJANGO_ADMIN": os.environ.get("MEDSPLIT_DJANGO_ADMIN", "1" if DEBUG else "0") == "1",
    # Failed sign-ins for one username from one address: the first few are free, then
    # each further attempt waits twice as long as the one before, up to the cap
    # (accounts/sign_in_delay.py). Never a lock-out: the delay runs out by itself.
    "SIGN_IN_FREE_FAILURES": _int_setting("MEDSPLIT_SIGN_IN_FREE_FAILURES", 5, least=1),
    "SIGN_IN_MAX_DELAY_SECONDS": _int_setting("MEDSPLIT_SIGN_IN_MAX_DELAY", 900, least=1),
    # Agents' long-polls that may wait at once in one gunicorn process; beyond it a poll
    # is answered at once ("no change"), so people's requests always find a thread. Keep
    # it below gunicorn's --threads (docker-compose: 8 threads, 4 long-polls).
    "LONG_POLLS_PER_PROCESS": _int_setting("MEDSPLIT_LONG_POLLS_PER_PROCESS", 4, least=0),
    # A hospital not heard from for this long is shown offline.
    "HOSPITAL_OFFLINE_AFTER_SECONDS": int(os.environ.get("MEDSPLIT_OFFLINE_AFTER", "120")),
    # One-time enrolment codes expire after this long.
    "ENROLMENT_CODE_TTL_SECONDS": int(os.environ.get("MEDSPLIT_ENROLMENT_TTL", "86400")),
    # Metrics of one turn are kept at most this often (bounded rate).
    "METRICS_MIN_INTERVAL_SECONDS": float(os.environ.get("MEDSPLIT_METRICS_INTERVAL", "1.0")),
    # The relay as the coordinator's own (admin) user: it creates the hospitals' users.
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    # The relay as hospitals reach it, handed to agents at enrolment with their own user;
    # default: REDIS_URL without its credentials and options (hospitals.services).
    "RELAY_URL": os.environ.get("MEDSPLIT_RELAY_URL", ""),
    # Every relay key of this deployment starts with it (medsplit.channel.keys), so that
    # two deployments or test runs sharing one Redis never collide.
    "RELAY_PREFIX": os.environ.get("MEDSPLIT_RELAY_PREFIX", "medsplit"),
    # How often a worker measures what the hospital whose turn it serves stores on the
    # relay (workers/relay_guard.py); every sweep also measures every hospital.
    "RELAY_GUARD_SECONDS": float(os.environ.get("MEDSPLIT_RELAY_GUARD_SECONDS", "5")),
    # Creates and removes the per-hospital Redis ACL users (see hospitals/relay_acl.py).
    "REDIS_ACL_PROVISIONER": os.environ.get(
        "MEDSPLIT_REDIS_ACL_PROVISIONER", "hospitals.relay_acl.NoRelayProvisioner"
    ),
    # Where the workers reach the relay, as their own Redis user (default: REDIS_URL).
    "WORKER_REDIS_URL": os.environ.get("MEDSPLIT_WORKER_REDIS_URL")
    or os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    # Tells the workers at once that a job was scheduled or resumed (see
    # training/dispatch.py); without it the periodic sweep finds the job within SWEEP_SECONDS.
    "JOB_DISPATCHER": os.environ.get(
        "MEDSPLIT_JOB_DISPATCHER", "training.dispatch.SweepOnlyDispatcher"
    ),
    # Server checkpoints (safetensors files); shared storage when workers run on several hosts.
    "CHECKPOINT_DIR": Path(os.environ.get("MEDSPLIT_CHECKPOINT_DIR", DATA_DIR / "checkpoints")),
    # Steps between two checkpoints of a turn (and at its end, and on pause).
    "CHECKPOINT_EVERY": int(os.environ.get("MEDSPLIT_CHECKPOINT_EVERY", "50")),
    # A hospital that sends nothing for this long (or never shows up) fails its turn.
    "TURN_SILENCE_SECONDS": float(os.environ.get("MEDSPLIT_TURN_SILENCE", "120")),
    # A worker renews its hold on a turn well within this; a killed one loses it after.
    "TURN_LEASE_SECONDS": float(os.environ.get("MEDSPLIT_TURN_LEASE", "30")),
    # How often one attempt of a turn may be started (take-overs, retries after the
    # database or the relay went away) before it fails saying so; unset: the job's
    # retries plus two (workers/failures.py).
    "TURN_MAX_RUNS": int(os.environ["MEDSPLIT_TURN_MAX_RUNS"])
    if os.environ.get("MEDSPLIT_TURN_MAX_RUNS")
    else None,
    # How often the scheduler's sweep looks for work nobody is doing.
    "SWEEP_SECONDS": float(os.environ.get("MEDSPLIT_SWEEP_SECONDS", "5")),
    # Deterministic kernels in the workers, so that invariant 1 (exactness) holds.
    "DETERMINISTIC": os.environ.get("MEDSPLIT_DETERMINISTIC", "1") == "1",
    # Bearer token Prometheus presents at GET /metrics (monitoring/); unset: only a signed-in
    # consortium admin may read the metrics.
    "METRICS_TOKEN": os.environ.get("MEDSPLIT_METRICS_TOKEN", ""),
    # Keys of the audit rows' MACs, "<id>:<base64 of 32 random bytes>" separated by commas,
    # the first for new rows (audit/macs.py); the database never holds them. Unset: one
    # derived from MEDSPLIT_SECRET_KEY (the embedded mode; `check --deploy` warns).
    "AUDIT_MAC_KEYS": os.environ.get("MEDSPLIT_AUDIT_MAC_KEYS", ""),
    # Port (and address) where each Celery worker serves its own Prometheus metrics
    # (workers/metrics.py); unset: not served.
    "WORKER_METRICS_PORT": (
        int(os.environ["MEDSPLIT_WORKER_METRICS_PORT"])
        if os.environ.get("MEDSPLIT_WORKER_METRICS_PORT")
        else None
    ),
    "WORKER_METRICS_ADDRESS": os.environ.get("MEDSPLIT_WORKER_METRICS_ADDRESS", "0.0.0.0"),
    # Split inference (training/inference.py, workers/inference_runner.py): the largest
    # batch of images one inference frame may carry (checked as training frames are),
    # the most images one request may hold, how many jobs' final server segments a
    # worker keeps loaded, and the Celery queue the requests go to (give it workers of
    # its own, -Q inference, so that predictions never wait behind a turn; unset: the
    # default queue).
    "INFERENCE_BATCH_SIZE": _int_setting("MEDSPLIT_INFERENCE_BATCH_SIZE", 32, least=1),
    "INFERENCE_MAX_SAMPLES": _int_setting("MEDSPLIT_INFERENCE_MAX_SAMPLES", 10000, least=1),
    "INFERENCE_CACHE_SIZE": _int_setting("MEDSPLIT_INFERENCE_CACHE_SIZE", 4, least=1),
    "INFERENCE_QUEUE": os.environ.get("MEDSPLIT_CELERY_INFERENCE_QUEUE")
    or os.environ.get("MEDSPLIT_CELERY_QUEUE", "celery"),
    # Split-learning modes beyond the built-in ones, "package.module:ClassName" separated
    # by commas (medsplit.modes), loaded when the training app starts, in the coordinator
    # and in every worker: a job in a mode not named here is refused.
    "EXTRA_MODES": [
        p.strip() for p in os.environ.get("MEDSPLIT_EXTRA_MODES", "").split(",") if p.strip()
    ],
    # Modules whose factories a job may name as its model ("MODULE:FACTORY" with
    # model_args), module names separated by commas, in the coordinator and in every
    # worker; each agent lists its own too. Unset: only the registry's models. Naming a
    # factory runs its module's code on every party (docs/security.md).
    "MODEL_MODULES": [
        m.strip() for m in os.environ.get("MEDSPLIT_MODEL_MODULES", "").split(",") if m.strip()
    ],
}

# Celery (workers/): Redis as the broker, tasks acknowledged only once done, so a task
# whose worker dies is delivered again; every task is safe to run twice.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or MEDSPLIT["WORKER_REDIS_URL"]
if is_cluster_url(CELERY_BROKER_URL):
    # kombu's Redis transport speaks to one Redis only (no MOVED, no slots).
    raise ImproperlyConfigured(
        "Celery's broker cannot be a Redis Cluster (kombu has no cluster support): with a "
        "redis+cluster:// relay, set CELERY_BROKER_URL to a single Redis (docs/deploy.md, "
        "'The relay on a Redis Cluster')"
    )
# Every key Celery makes (queues, ``_kombu.binding.*``, ``unacked*``) starts with the
# deployment's relay prefix too (medsplit.channel.keys), so that deployments sharing one
# Redis never meet and the workers' Redis user needs no pattern beyond ``<prefix>:*``.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "global_keyprefix": RelayKeys(MEDSPLIT["RELAY_PREFIX"]).celery_prefix()
}


def _check_relay_passwords() -> None:
    """Every process refuses to start with a guessable relay password: Redis answers tens
    of thousands of AUTH attempts a second (medsplit.passwords)."""
    for name in (
        "REDIS_URL",
        "MEDSPLIT_WORKER_REDIS_URL",
        "CELERY_BROKER_URL",
        "MEDSPLIT_CACHE_URL",
    ):
        password = urlsplit(os.environ.get(name) or "").password
        if password:
            try:
                check_password(unquote(password), what=f"the password in {name}")
            except WeakPasswordError as e:
                raise ImproperlyConfigured(str(e)) from e


_check_relay_passwords()
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("MEDSPLIT_CELERY_QUEUE", "celery")
# A turn holds its worker process for minutes. Given a queue of their own, turns go to
# workers that consume it, and the scheduler's short tasks to workers that no turn can
# occupy (docs/deploy.md, "Scaling"). Unset: every task goes to the one queue above.
CELERY_TASK_ROUTES = {
    "medsplit.run_turn": {
        "queue": os.environ.get("MEDSPLIT_CELERY_TURN_QUEUE") or CELERY_TASK_DEFAULT_QUEUE
    }
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# No remote control over the broker (`celery inspect`/`control`): it would need a queue
# per worker node outside the workers' Redis key patterns, and is a way to command
# workers that nothing here uses.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_BEAT_SCHEDULE = {
    # A sweep not run before the next one is due is dropped: they would only pile up
    # behind long turns and each send the same follow-ups again.
    "sweep": {
        "task": "medsplit.sweep",
        "schedule": MEDSPLIT["SWEEP_SECONDS"],
        "options": {"expires": MEDSPLIT["SWEEP_SECONDS"]},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("MEDSPLIT_LOG_LEVEL", "INFO")},
}
