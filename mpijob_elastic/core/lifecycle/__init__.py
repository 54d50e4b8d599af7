"""The job's life: runPolicy's start, suspend, restart, fail and finish (run_policy.py),
and the notices that warn its pods before a stop (notices.py).
"""
