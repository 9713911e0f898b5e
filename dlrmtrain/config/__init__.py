"""Run configuration: typed sections (schema.py) loaded strictly from YAML (loader.py)."""

from dlrmtrain.config.loader import ConfigError, load_config, parse_cli
from dlrmtrain.config.schema import Config

__all__ = ["Config", "ConfigError", "load_config", "parse_cli"]
