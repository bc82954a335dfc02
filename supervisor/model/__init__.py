"""What a run is and what it leaves on disk: the spec, the state file and its sections,
the stop's reports, the control protocol's records, checkpoints and progress steps.
"""
