"""Images: loading, data URIs, placeholders and processor inputs.

Owns: image loading and ``data:`` URIs (:mod:`relaxtrio.media.images`) and the vision processor that
expands image placeholders and builds training inputs (:mod:`relaxtrio.media.vision`), shared by
the compiler, the dataset loader and the embedded engine.

May import: :mod:`relaxtrio._errors`, pillow, numpy, transformers' image processors. Never trio,
httpx, quart or torch.
"""
