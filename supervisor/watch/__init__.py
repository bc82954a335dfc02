"""The watchers' own logic, each a small part the supervisor runs: drift, the learned
stall deadline, samples for the charts, the log's stamps and its size bound.
"""
