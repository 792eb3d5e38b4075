"""The images of a Session lineage, in the order the prompt's image placeholders take them."""

from __future__ import annotations

from ..forest import ObservationNode, ResponseNode, RootNode, SessionForest

__all__ = ["lineage_image_urls"]


def lineage_image_urls(
    forest: SessionForest, node: RootNode | ObservationNode | ResponseNode
) -> tuple[str, ...]:
    """The images of ``node``'s lineage in placeholder order (what ``image_data`` must carry).

    Args:
        forest: the Session's forest.
        node: the state the generation continues (the root gives no images).

    Returns:
        The ``image_urls`` of every observation payload from the subtree root down to ``node``.
    """
    if not forest.num_multimodal_observations:  # O(1) for text Sessions, however long
        return ()
    return tuple(
        url
        for n in forest.lineage(node)
        if isinstance(n, ObservationNode) and n.multimodal is not None
        for url in getattr(n.multimodal, "image_urls", ())
    )
