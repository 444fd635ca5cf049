from importlib.metadata import PackageNotFoundError, version

from config.reference import describe
from config.settings import Settings, SettingsError, load, load_for_command

try:
    VERSION = version("social-gateway")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0+unknown"

__all__ = ["VERSION", "Settings", "SettingsError", "describe", "load", "load_for_command"]
