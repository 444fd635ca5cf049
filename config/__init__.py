from config.settings import Settings, SettingsError, describe, load, load_for_command

__all__ = ["Settings", "SettingsError", "describe", "load", "load_for_command"]
