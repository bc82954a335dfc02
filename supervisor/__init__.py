"""trainctl's per-job supervisor and the process-tree core (state, proctree, terminate)."""
