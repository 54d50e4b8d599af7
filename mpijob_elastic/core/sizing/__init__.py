"""How many workers a job has: its target within its bounds (capacity.py), growth into
idle capacity (opportunistic.py), and who took a grown worker's room (preemptors.py).
"""
