"""``python -m trainctl.launcher`` runs the CLI (as the ``trainctl`` script does)."""

from .main import main

main()
