"""One turn put together: the desired children (desired.py), the ordered writes
(write_order.py), the handover of another controller's children first (handover.py),
and the two steps in one (plan.py).
"""
