"""The run's life: the one owner of its state (lifecycle), why a run ended (causes),
what happens next (policy), and the user's hooks.
"""
