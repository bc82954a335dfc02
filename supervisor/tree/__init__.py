"""The job's processes: launching them (with their terminal), finding every member
(proctree, roster, forest), and stopping them (terminate, stop, handoff, stacks).
"""
