# One image for every MedSplit process: the coordinator (gunicorn), the Celery worker and
# scheduler, and the hospital agent. Which one runs is the container's command.

# The dashboard's pinned third-party scripts (frontend/package-lock.json).
FROM node:20-bookworm-slim AS dashboard
WORKDIR /src/frontend
COPY frontend/package.json frontend/package-lock.json frontend/build.mjs ./
RUN npm ci --no-audit --no-fund && npm run build

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app:/app/platform \
    DJANGO_SETTINGS_MODULE=coordinator.settings \
    MEDSPLIT_DATA_DIR=/var/lib/medsplit
WORKDIR /app
# PyTorch's CPU build first (the default one brings CUDA: gigabytes).
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY medsplit medsplit
COPY hospital_agent hospital_agent
RUN pip install --no-cache-dir .
COPY manage.py ./
COPY platform platform
COPY workers workers
COPY frontend/src frontend/src
COPY --from=dashboard /src/frontend/vendor frontend/vendor
RUN useradd --create-home --uid 10001 medsplit \
    && mkdir -p /var/lib/medsplit /var/lib/medsplit-agent \
    && chown medsplit /var/lib/medsplit /var/lib/medsplit-agent
USER medsplit
EXPOSE 8000
CMD ["gunicorn", "coordinator.wsgi", "--chdir", "platform", "-b", "0.0.0.0:8000", \
     "--worker-class", "gthread", "--workers", "2", "--threads", "8"]
