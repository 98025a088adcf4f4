"""Parallelism beyond data parallelism, on one device mesh: tensor parallelism (``tensor``), pipeline stages and
schedules (``pipeline``), the weights' materialisation on a sharded model (``materialize``), and the model a
rank trains (``model``). The layout itself is contract/mesh.py's."""
