"""What a turn gathers besides its decisions' values: the Turn (turn.py) and the job's next
status (status.py).
"""
