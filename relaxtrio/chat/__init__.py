"""The chat codec: messages to token ids and generated ids back to messages.

Owns: the chat-template compiler (:mod:`relaxtrio.chat.compiler`: full render at a subtree root,
observation delta below it, stop ids, template probes), the reasoning and tool-call parsers
(:mod:`relaxtrio.chat.parsers`) and the bundled templates (``templates/``).

May import: :mod:`relaxtrio.forest`, :mod:`relaxtrio.media`, :mod:`relaxtrio._errors`, jinja2 and
transformers tokenizers. Never trio, httpx, quart or torch.
"""
