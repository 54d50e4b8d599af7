"""Kueue admission of a queue-labelled job: its Workload and standing (kueue.py), and the
Workloads' writes (kueue_writes.py).
"""
