from config.settings import Settings, SettingsError, describe, load

__all__ = ["Settings", "SettingsError", "describe", "load"]
