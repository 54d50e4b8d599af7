"""The job's spec: its typed model (model.py), the readers of its single fields (fields.py),
parse into a JobSpec or an InvalidSpec (parse.py), and runPolicy.schedulingPolicy
(scheduling_policy.py).
"""
