"""What the job tells its user: conditions and Events no other decision owns
(conditions.py), and warnings about its spec (spec_warnings.py, launcher_command.py).
"""
