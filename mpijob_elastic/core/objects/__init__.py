"""The children's API objects, rendered: ServiceAccount, Role, ConfigMap and the rest
(render.py), the pods (render_pods.py), the gang scheduler's PodGroup (podgroups.py), and a
turn's assembly of them (children.py).
"""
