"""How every log line looks: text for a person at a terminal, or one JSON object per line for a log
pipeline (Loki, ELK, Cloud Logging): time (ISO 8601, UTC), level, logger, message, and request_id
where a request is known. The access log (runtime/accesslog.py) writes its batched lines in the
same shape without going through `logging`.
"""

import logging
import time
from collections.abc import Mapping

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ISO_SECONDS = "%Y-%m-%dT%H:%M:%S"  # then milliseconds and Z
# Loggers that print request or command documents at DEBUG: password hashes, first-touch data and key
# digests would reach the log. They are held at INFO whatever LOG_LEVEL says.
VERBATIM_LOGGERS = ("pymongo",)


def iso_time(t: float) -> str:
    """`2026-11-25T20:30:01.123Z`."""
    return time.strftime(ISO_SECONDS, time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"time": iso_time(record.created), "level": record.levelname, "logger": record.name}
        line["message"] = record.getMessage()
        if getattr(record, "request_id", None):  # logging.info(..., extra={"request_id": ...})
            line["request_id"] = record.request_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def json_wanted(log_format: str, environment: str) -> bool:
    """LOG_FORMAT, or when empty the default of GATEWAY_ENV: json in production, text in development."""
    return log_format == "json" if log_format else environment == "production"


def configure(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in VERBATIM_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLogger().level))


def configure_from(environ: Mapping[str, str]) -> None:
    """Before the settings are read (a command, or settings that cannot be read): from the environment,
    whatever it holds that is usable."""
    level = environ.get("LOG_LEVEL", "INFO").upper()
    configure(
        level if level in logging.getLevelNamesMapping() else "INFO",
        json_wanted(environ.get("LOG_FORMAT", ""), environ.get("GATEWAY_ENV", "")),
    )
