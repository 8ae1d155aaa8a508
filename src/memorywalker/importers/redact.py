"""``--redact``: replace API keys and tokens, credentials in URLs and connection strings, e-mail
addresses and home directories by placeholders.

One :class:`Redactor` is used for a whole import, so the same secret always becomes the same
placeholder (``<API_KEY_1>``, ``<CREDENTIALS_1>``, ``<EMAIL_2>``, ``<HOME_1>``) in every call of every
trajectory, in message text, tool arguments, tool results and lineage alike. A home directory is
redacted in its plain form (``/home/bob``, ``/Users/bob``, ``C:\\Users\\bob``) and in the dash-encoded
form Claude Code names its project folders with (``~/.claude/projects/-home-bob-src``).

>>> r = Redactor()
>>> r.text("mail bob@example.com, key sk-abcdefghijklmnopqrstuv, cd /home/bob/src")
'mail <EMAIL_1>, key <API_KEY_1>, cd <HOME_1>/src'
>>> r.text("again sk-abcdefghijklmnopqrstuv in .claude/projects/-home-bob-src")
'again <API_KEY_1> in .claude/projects/-<HOME_1>-src'
>>> r.text("redis://:pw@cache:6379/0 and postgres://admin:pw@db.internal/app")
'redis://<CREDENTIALS_1>@cache:6379/0 and postgres://<CREDENTIALS_2>@db.internal/app'
"""

from __future__ import annotations

import re
from typing import Any

from memorywalker.records import Trajectory

# Order matters: specific token shapes first, then assignments like ``api_key = ...``.
_SECRET_PATTERNS = [
    r"sk-ant-[A-Za-z0-9_\-]{16,}",
    r"sk-(?:proj-)?[A-Za-z0-9_\-]{16,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    r"hf_[A-Za-z0-9]{30,}",
    r"glpat-[A-Za-z0-9_\-]{20,}",
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # JWT
]
_SECRET = re.compile("|".join(f"(?:{p})" for p in _SECRET_PATTERNS))
# ``scheme://user:password@host`` (the user part may be empty: ``redis://:pw@host``): user and password.
_URL_CREDENTIALS = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://)([^\s/@:<>\"'`]*:[^\s/@<>\"'`]+)@")
# Connection strings and env files: ``Password=pw;``, ``PGPASSWORD=pw``, ``"pwd": "pw"`` - any length.
_PASSWORD = re.compile(r"(?i)(\b[\w.\-]*(?:password|passwd|pwd)\b[\"']?\s*[:=]\s*[\"']?)([^\s\"'<>,;&]+)")
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/\-]{16,}=*)")
_ASSIGNED = re.compile(
    r"(?i)(\b[\w.\-]*(?:api[_\-]?key|secret|token|password|passwd)[\w\-]*\b[\"']?\s*[:=]\s*[\"']?)"
    r"([^\s\"'<>,;]{8,})"
)
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")
_HOME = re.compile(r"(?:/home/|/Users/|[A-Za-z]:\\Users\\)(?!<)([^/\\\s\"'`:;,)]+)")

# Fields of the trajectory record that hold ids, not text.
_ID_KEYS = {"id", "context", "response", "before_call", "removed", "inserted", "tool_call_id", "schema",
            "parent", "parent_call"}


class Redactor:
    def __init__(self) -> None:
        self.placeholders: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.users: set[str] = set()  # user names seen in home paths (to cut dash-encoded ones right)

    def _placeholder(self, kind: str, secret: str) -> str:
        ph = self.placeholders.get(secret)
        if ph is None:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            ph = self.placeholders[secret] = f"<{kind}_{self.counts[kind]}>"
        return ph

    def _keep_placeholder(self, kind: str, m: re.Match) -> str:
        return m.group(1) + (m.group(2) if m.group(2).startswith("<") else self._placeholder(kind, m.group(2)))

    def _home(self, m: re.Match) -> str:
        self.users.add(m.group(1))
        return self._placeholder("HOME", "~" + m.group(1))  # one placeholder per user, whatever the OS

    def _dash_homes(self, s: str) -> str:
        # A user name may contain dashes (john-doe): names seen in plain paths are tried first, longest
        # first; otherwise the name ends at the next dash.
        known = "".join(re.escape(u) + r"(?=$|[-/\\\s])|" for u in sorted(self.users, key=len, reverse=True))
        pattern = re.compile(r"-(?:home|Users)-(?!<)(" + known + r"[A-Za-z0-9_.]+)")
        return pattern.sub(lambda m: "-" + self._placeholder("HOME", "~" + m.group(1)), s)

    def text(self, s: str) -> str:
        s = _SECRET.sub(lambda m: self._placeholder("API_KEY", m.group(0)), s)
        s = _URL_CREDENTIALS.sub(lambda m: self._keep_placeholder("CREDENTIALS", m) + "@", s)
        s = _BEARER.sub(lambda m: m.group(1) + self._placeholder("API_KEY", m.group(2)), s)
        s = _PASSWORD.sub(lambda m: self._keep_placeholder("API_KEY", m), s)
        s = _ASSIGNED.sub(lambda m: self._keep_placeholder("API_KEY", m), s)
        s = _EMAIL.sub(lambda m: self._placeholder("EMAIL", m.group(0)), s)
        s = _HOME.sub(self._home, s)
        if "-home-" in s or "-Users-" in s:
            s = self._dash_homes(s)
        return s

    def value(self, v: Any, key: str | None = None) -> Any:
        if key in _ID_KEYS:
            return v
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, list):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x, k) for k, x in v.items()}
        return v

    def trajectory(self, traj: Trajectory) -> Trajectory:
        """A copy of ``traj`` with every text field redacted (ids and numbers untouched)."""
        return Trajectory.model_validate(self.value(traj.to_json_dict()))
