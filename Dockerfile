# LabPortal portal image: the web server, the control worker and Celery beat all
# run from this one image (docker-compose.yml picks the role with the command).
#
#   docker build -t labportal/portal .
#   docker build --build-arg BASE_IMAGE=labportal/debian-base:bookworm -t labportal/portal .
#
# BASE_IMAGE is any Debian-based image with Python 3.11+ (python3 and its venv
# module). Without a registry, .ci/debian-base.sh builds one from Debian's packages.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# pg_dump/pg_restore for `manage.py backup`, tini to reap children and pass signals.
# The debootstrap base already has them; a stock python image gets them from apt.
RUN set -eux; \
    if ! command -v pg_dump >/dev/null || ! command -v tini >/dev/null; then \
      apt-get update; \
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        postgresql-client tini ca-certificates; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/labportal/venv; \
    groupadd --system --gid 10001 labportal; \
    useradd --system --uid 10001 --gid labportal --home-dir /var/lib/labportal \
      --shell /usr/sbin/nologin labportal; \
    install -d -o labportal -g labportal -m 0750 /var/lib/labportal

ENV PATH=/opt/labportal/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    LABPORTAL_VAR_DIR=/var/lib/labportal \
    LABPORTAL_STATIC_ROOT=/opt/labportal/static \
    DEBUG=false

WORKDIR /opt/labportal/app

# Dependencies first, in their own layer: a code change does not re-download them. They come
# from the lock (requirements/portal.txt: the portal and its reports extra, made by
# `make lock`), every file checked against its hash; the project itself follows, without
# dependencies. The lock is the whole closure, so pip installs it with --no-deps and `pip check`
# proves nothing is missing: pip 23 (Debian bookworm's) otherwise refuses a dependency asked
# for with an extra, such as weasyprint's fonttools[woff], as "not pinned with ==".
COPY requirements/portal.txt package-lock.json deploy/docker/fetch_npm_assets.py ./
# python-ldap (LDAP sign-in) has no wheel: it builds here with a compiler and the OpenLDAP and
# SASL headers, which are removed again; the image keeps only the run-time libraries.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc libc6-dev libldap2-dev libsasl2-dev python3-dev; \
    pip install --require-hashes --no-deps -r portal.txt; \
    pip check; \
    apt-mark manual libldap-2.5-0 libsasl2-2; \
    DEBIAN_FRONTEND=noninteractive apt-get purge -y --auto-remove \
      gcc libc6-dev libldap2-dev libsasl2-dev python3-dev; \
    rm -rf /var/lib/apt/lists/*; \
    python3 fetch_npm_assets.py .; \
    rm portal.txt

COPY . .
# The project itself, editable so templates, static and locale stay at BASE_DIR. The agent
# and labctl are distributions of their own (Dockerfile.agent; distributions/labctl): not installed.
# Static files are collected now, into the image: the data volume holds data only. Every
# package the portal ships is byte-compiled (the list comes from pyproject.toml).
RUN set -eux; \
    pip install --no-deps -e .; \
    SECRET_KEY=build-only ALLOWED_HOSTS=localhost LABPORTAL_VAR_DIR=/tmp/build-var \
      python3 manage.py collectstatic --noinput --verbosity 0; \
    rm -rf /tmp/build-var; \
    python3 deploy/docker/compile_packages.py .

USER labportal
VOLUME ["/var/lib/labportal"]
EXPOSE 8000
ENTRYPOINT ["tini", "--", "/opt/labportal/app/deploy/docker/entrypoint.sh"]
CMD ["web"]
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
  CMD ["python3", "/opt/labportal/app/deploy/docker/healthcheck.py"]
