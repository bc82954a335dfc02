"""``python -m trainctl.launcher`` runs the CLI (as the ``trainctl`` script does)."""

from .entry import main

main()
