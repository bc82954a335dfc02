"""The kernel's interfaces, knowing nothing of trainctl's records: /proc, pidfd polls,
cgroups (v2 and v1 memory), D-Bus and systemd's transient units.
"""
