"""Example agents, environments and tasks. Each trains on the built-in tiny model with no download.

Importing the package registers the example datasets: ``frozenlake``, ``copy``, ``countdown``, ``arithmetic``.
"""

from examples import arithmetic, copy_task, countdown_workflow, frozenlake  # noqa: F401
