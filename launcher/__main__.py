"""``python -m trainctl.launcher`` runs the CLI (as the ``trainctl`` script does)."""

from .cli import main

main()
