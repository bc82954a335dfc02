"""trainctl's client side: the CLI, the Python API it calls, and output rendering."""

__version__ = "0.1.0"
