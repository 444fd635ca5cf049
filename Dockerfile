# social-gateway in a container: one process, settings from the environment (docs/operations.md).
#   docker build -t social-gateway .
#   docker run -p 8000:8000 --ulimit nofile=65536 -e MONGODB_URI=... -e JWT_SECRET=... -e SECRETS_KEY=... \
#     -e UPSTREAM_URL=... -e UPSTREAM_API_KEY=... social-gateway
# The image holds no database: production needs MONGODB_URI (the embedded SecantusDB is for development).

FROM python:3.11-slim AS build
# Every dependency has a wheel; gcc only for a platform without one.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY setup.cfg pyproject.toml README.md gateway.py ./
COPY accounting accounting
COPY alerts alerts
COPY app app
COPY billing billing
COPY config config
COPY handlers handlers
COPY metering metering
COPY payments payments
COPY portal portal
COPY runtime runtime
COPY sandbox sandbox
COPY security security
COPY services services
COPY social social
COPY storage storage
COPY streams streams
COPY webhooks webhooks
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# Liberation Sans and DejaVu Sans: billing PDFs embed one for names outside Windows-1252 (billing/pdf.py)
RUN apt-get update && apt-get install -y --no-install-recommends fonts-liberation fonts-dejavu-core \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --home-dir /data --create-home gateway
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER gateway
WORKDIR /data
ENV GATEWAY_ENV=production GATEWAY_HOST=0.0.0.0 GATEWAY_PORT=8000 DATA_DIR=/data PYTHONUNBUFFERED=1
EXPOSE 8000
# docker stop sends SIGTERM: the gateway drains and flushes within DRAIN_SECONDS; give it the time.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
ENTRYPOINT ["social-gateway"]
CMD ["serve"]
