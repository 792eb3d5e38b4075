"""What a Ray instance still holds (for the cluster tests)."""

from __future__ import annotations


def live_actors(class_name: str = "") -> list[str]:
    """Class names of the actors this Ray instance holds that are not dead (``class_name``: only
    those whose class name ends with it).

    Read from Ray's actor table in the GCS: the state API (``ray.util.state.list_actors``) is
    served by the dashboard's modules, which a ``ray`` install without ``[default]`` (ours) does
    not run.
    """
    from ray._private import state

    names = [str(a["ActorClassName"]) for a in state.actors().values() if a["State"] != "DEAD"]
    return [n for n in names if n.endswith(class_name)]
