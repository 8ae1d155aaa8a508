"""Serve or train a model with another chat template: ``--chat-template FILE|NAME`` (gateway, ``harness run``)
and ``chat_template=`` (the recipes).

A NAME is one of the templates shipped here: ``chatml`` and ``qwen3`` (the kit's: ChatML turns, Hermes-style
``<tool_call>`` JSON), or a family's tool-call form in its turns (``memorywalker/data/chat-templates/``:
``qwen3-coder``, ``llama3-json``, ``mistral``, ``glm45``, ``deepseek-v3``, ``harmony``). Use it for a model whose own
template renders no tools (SmolLM2 under ``chatml``), or one whose template drops what the harness sends.
The records say which template rendered them: ``meta.chat_template`` is the name or path and the first 12
hex digits of the text's sha256 (``model's own`` when none was given).

>>> text, label = load_chat_template("chatml")
>>> label.startswith("chatml sha256:") and "<tool_call>" in text
True
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from memorywalker.errors import InputError
from memorywalker.modelkit.templates import TEMPLATES

FAMILY_TEMPLATES = ("qwen3-coder", "llama3-json", "mistral", "glm45", "deepseek-v3", "harmony")
NAMES = (*TEMPLATES, *FAMILY_TEMPLATES)


def _label(name: str, text: str) -> str:
    return f"{name} sha256:{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def load_chat_template(spec: str | Path) -> tuple[str, str]:
    """(template text, label) of a shipped name or a Jinja file; an InputError names what is wrong."""
    spec = str(spec)
    if spec in TEMPLATES:
        return TEMPLATES[spec], _label(spec, TEMPLATES[spec])
    if spec in FAMILY_TEMPLATES:
        text = resources.files("memorywalker.data").joinpath(f"chat-templates/{spec}.jinja").read_text()
        return text, _label(spec, text)
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"--chat-template {spec}: not a file, nor a shipped template ({', '.join(NAMES)})")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--chat-template {spec}: unreadable ({e})") from None
    if "{{" not in text and "{%" not in text:
        raise InputError(f"--chat-template {spec}: not a Jinja chat template (no {{{{ or {{% in it)")
    return text, _label(str(path), text)


def use_chat_template(tok, spec: str | Path | None) -> str:
    """Give ``tok`` the template ``spec`` (nothing when None); the label the records carry."""
    if spec is None:
        own = getattr(tok, "chat_template", None)
        return _label("model's own", own) if isinstance(own, str) else "model's own (none)"
    text, label = load_chat_template(spec)
    tok.chat_template = text
    return label
