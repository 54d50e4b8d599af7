"""Which workers are the job's hosts: who stays and who leaves (membership.py), how a
worker leaves (drain.py), which are listed to Horovod this turn (host_list.py) under its
driver's rules (host_rules.py).
"""
