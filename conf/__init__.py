"""Shipped defaults (trainctl.toml) and example job specs; read with importlib.resources."""
