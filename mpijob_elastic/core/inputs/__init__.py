"""What a turn reads: the caches' view of one job (observe.py), the launcher's rank reports
(ranks.py), and the growth state jobs keep on their ConfigMaps (growth_state.py).
"""
