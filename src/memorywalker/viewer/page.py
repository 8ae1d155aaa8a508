"""One self-contained HTML file per trajectory: the page template with the view data inlined.

No server, no network: styles, script and data are all in the file (open it from disk).
"""

from __future__ import annotations

import html
import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any


def page_html(data: dict[str, Any]) -> str:
    """The page for ``data`` (from :func:`~memorywalker.viewer.data.view_data`)."""
    template = files("memorywalker.viewer").joinpath("page.html").read_text(encoding="utf-8")
    # Inside <script> only "</" can end the element early; JSON allows "<\/" for it.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return template.replace("__TITLE__", html.escape(data["id"])).replace("__DATA__", payload)


def page_name(trajectory_id: str) -> str:
    """A file name for a trajectory id (ids of subagents contain ``/``).

    >>> page_name("ae4a77f8/agent-aac57f5")
    'ae4a77f8__agent-aac57f5.html'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "__", trajectory_id) + ".html"


def write_page(data: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / page_name(data["id"])
    path.write_text(page_html(data), encoding="utf-8")
    return path
