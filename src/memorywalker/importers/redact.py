"""``--redact``: two passes over everything an import writes, so a secret found once is gone everywhere.

1. **Detect** (:meth:`Redactor.scan`, over every string of every trajectory and of the rejects):
   token shapes (OpenAI/Anthropic ``sk-…``, Stripe ``sk_live_…``, GitHub, AWS key ids, Google, Slack,
   Hugging Face, GitLab, SendGrid, npm, JWTs), bearer tokens of any length, assignments whose name
   says what they hold (``*PASSWORD*``, ``*SECRET*``, ``*TOKEN*``, ``*_KEY``, ``*_PASS``, ``*PWD*``,
   ``*AUTH*``…, in ``NAME=value``, ``name: value`` and JSON form), ``NAME=value`` pairs whose value
   looks random whatever the name (entropy check), bare AWS secret access keys, credentials in URLs,
   PEM private-key blocks, e-mail addresses, phone numbers, private IPv4 addresses, and home
   directories in every spelling (``/home/bob``, ``/Users/bob``, ``C:\\Users\\bob``, JSON-escaped
   ``C:\\\\Users\\\\bob`` and ``\\/home\\/bob``, ``%2Fhome%2Fbob``, Claude Code's dash-encoded
   ``-home-bob-``), which make the user name itself a secret.
2. **Replace** (:meth:`Redactor.apply`): the same patterns in place, then every occurrence of every
   detected value that is specific enough to search for on its own (a password found in a URL and
   repeated bare by the assistant, or in its thinking; the user name anywhere), in every string of the
   record — message text, thinking, tool arguments of any name, tool results, metadata, lineage, ids
   (consistently, so references still resolve) — and in the rejects file.

One :class:`Redactor` serves a whole import: the same secret is the same placeholder (``<API_KEY_1>``,
``<PASSWORD_1>``, ``<CREDENTIALS_1>``, ``<EMAIL_1>``, ``<PHONE_1>``, ``<PRIVATE_IP_1>``,
``<PRIVATE_KEY_1>``, ``<HOME_1>``, ``<USER_1>``) in every call of every trajectory.

>>> r = Redactor()
>>> r.text("mail bob@example.com, key sk-abcdefghijklmnopqrstuv, cd /home/bob/src")
'mail <EMAIL_1>, key <API_KEY_1>, cd <HOME_1>/src'
>>> r.text("again sk-abcdefghijklmnopqrstuv in .claude/projects/-home-bob-src, says bob")
'again <API_KEY_1> in .claude/projects/-<HOME_1>-src, says <USER_1>'
>>> r.text("redis://:pw@cache:6379/0 and postgres://admin:Tr0ub4dor&3@db.internal/app")
'redis://<CREDENTIALS_1>@cache:6379/0 and postgres://<CREDENTIALS_2>@db.internal/app'
>>> r.text("your password Tr0ub4dor&3 is weak")
'your password <PASSWORD_1> is weak'
"""

from __future__ import annotations

import dataclasses
import getpass
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memorywalker.records import Trajectory

_TOKENS = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(f"(?:{p})" for p in [
    r"sk-ant-[A-Za-z0-9_\-]{16,}",
    r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}",
    r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe
    r"whsec_[A-Za-z0-9]{16,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}",
    r"AIza[0-9A-Za-z_\-]{35}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    r"hf_[A-Za-z0-9]{30,}",
    r"glpat-[A-Za-z0-9_\-]{20,}",
    r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",  # SendGrid
    r"npm_[A-Za-z0-9]{36}",
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # JWT
]) + ")")
_PEM = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)", re.S)
# ``scheme://user:password@host`` (the user part may be empty: ``redis://:pw@host``).
_URL_CREDENTIALS = re.compile(r"(?i)(\b[a-z][a-z0-9+.\-]*://)([^\s/@:<>\"'`]*):([^\s/@<>\"'`]+)@")
# Authorization schemes: ``Bearer <token>`` anywhere, ``Basic <base64>`` in an Authorization header.
_BEARER = re.compile(r"""(?i)(\b(authorization["']?\s*[:=]\s*["']?)?bearer\s+)([A-Za-z0-9._~+/\-]+=*)""")
_BASIC = re.compile(r"""(?i)(\bauthorization["']?\s*[:=]\s*["']?basic\s+)([A-Za-z0-9+/]{6,}={0,2})""")
# ``NAME = value`` / ``name: value`` / ``"name": "value"``: the name decides (_secret_name), the value
# is quoted or runs to a delimiter.
_ASSIGNED = re.compile(r"""(?<![\w$])([A-Za-z_][\w.\-]*)(["']?[ \t]*([:=])[ \t]*)(?:"([^"\n]{1,256})"|'([^'\n]{1,256})'|([^\s"'<>,;&)\]}]+))""")
# Bare AWS secret access keys: 40 base64 characters standing alone (checked for randomness).
_BARE_40 = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]\d{2,4}){1,4}"
                    r"|(?:\(\d{3}\)\s?|\d{3}[.\-\s])\d{3}[.\-\s]\d{4})(?![\w])")
_IPV4 = re.compile(r"(?<![\d.])(?:10|172|192|169)\.\d{1,3}\.\d{1,3}\.\d{1,3}(?![\d]|\.\d)")
# A home directory: plain, JSON-escaped, URL-encoded, Windows with 1-4 backslashes (escaped once or twice).
_HOME = re.compile(r"(?:(?<![\w.])/home/|(?<![\w.])/Users/|\\/home\\/|\\/Users\\/|%2F(?:home|Users)%2F"
                   r"|\b[A-Za-z]:(?:\\{1,4}|/)Users(?:\\{1,4}|/))(?!<)([A-Za-z0-9_.\-]*[A-Za-z0-9_])")
_PLACEHOLDER = r"<[A-Z_]+_\d+>"

# Name words that say a value is a secret: anywhere in the name, or as one of its parts (DB_PASS). A
# weak part (STRIPE_KEY, but also STORAGE_KEY) needs a value that is not a plain word: a digit in it,
# or mixed case.
_STRONG = re.compile(r"(?i)passw(?:or)?d|passphrase|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key"
                     r"|credential|auth")
_STRONG_PARTS = {"pass", "pwd", "pw"}
_WEAK_PARTS = {"key", "pat", "cookie", "dsn", "sig", "signature", "salt"}
# ... unless the name is a count or a tool setting: max_tokens, tokens_before, token_type, tokenizer, author.
_NOT_SECRET_NAMES = re.compile(r"(?i)(?:^|_)(?:max|num|n|total|input|output|prompt|completion|cached|reasoning)_?"
                               r"tokens?(?:$|_)|(?:^|_)tokens(?:$|_)|token_(?:count|used|before|after|limit|budget|len"
                               r"|length|ids?|type|usage)$|tokeniz|author|^keys?$|keys?_?(?:count|len|name|id|path|file)$")
_NOT_SECRET_VALUES = re.compile(r"(?i)^(?:true|false|none|null|nil|undefined|yes|no|on|off|bearer|basic|redacted|"
                                r"x+|\*+|\.+|-+|<.*>|\$\{?\w+\}?|%\w+%|\{\{.*\}\})$|^\d{1,7}$")
# Account names too common to search for on their own (their home paths are still redacted).
_GENERIC_USERS = {"root", "admin", "administrator", "user", "users", "ubuntu", "runner", "vscode", "codespace",
                  "node", "jenkins", "docker", "git", "guest", "nobody", "vagrant", "ec2-user", "centos", "debian",
                  "pi", "dev", "developer", "app", "test", "default", "public", "shared", "home", "work", "me",
                  "username", "your_user", "yourname", "name", "you"}


def entropy(s: str) -> float:
    """Shannon entropy in bits per character. ``entropy("aaaa") == 0``; 16 distinct characters: 4."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def looks_random(v: str) -> bool:
    """A credential rather than a word, an identifier, a version, a path or code: 16+ token characters
    (base64/base62 and ``-_.~``), upper- and lower-case letters and digits all present, at least 3.5
    bits of entropy per character.

    >>> looks_random("q8Zt3LmN0pR7vX2wK9yB4cD6"), looks_random("Spotter.Transcripts.FileSnapshot")
    (True, False)
    """
    if len(v) < 16 or not re.fullmatch(r"[A-Za-z0-9+/=_\-.~]+", v) or v.startswith(("/", "~", ".")):
        return False
    if not (any(c.islower() for c in v) and any(c.isupper() for c in v) and any(c.isdigit() for c in v)):
        return False
    return entropy(v) >= 3.5


def specific(v: str) -> bool:
    """Specific enough to replace wherever it occurs (not only where a pattern found it)."""
    has_digit, has_alpha = any(c.isdigit() for c in v), any(c.isalpha() for c in v)
    return len(v) >= 8 or (len(v) >= 5 and has_digit and has_alpha)


def _secret_name(name: str, value: str) -> bool:
    if _NOT_SECRET_NAMES.search(name):
        return False
    parts = {p.lower() for p in re.split(r"[_.\-]|(?<=[a-z])(?=[A-Z])", name) if p}
    if _STRONG.search(name) or parts & _STRONG_PARTS:
        return True
    word = not any(c.isdigit() for c in value) and (value.islower() or value.isupper())
    return bool(parts & _WEAK_PARTS) and not word


class Redactor:
    """Detected secrets and their placeholders for one import (see the module docstring)."""

    def __init__(self, local_user: bool = True) -> None:
        self.placeholders: dict[str, str] = {}  # secret value -> placeholder
        self.counts: dict[str, int] = {}  # kind -> placeholders issued
        self.users: dict[str, int] = {}  # user name -> its number (<HOME_n>, <USER_n>)
        self.searched: set[str] = set()  # values replaced wherever they occur
        # The account running the import: its name and home are secrets wherever they appear.
        self._local, self._local_home = _local_account() if local_user else (None, None)
        self._search: re.Pattern | None = None
        self._applied: dict[str, tuple[int, str]] = {}  # string -> (secrets known then, its redaction)

    # --- placeholders ---------------------------------------------------------------------------------

    def _placeholder(self, kind: str, secret: str, search: bool = False) -> str:
        ph = self.placeholders.get(secret)
        if ph is None:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            ph = self.placeholders[secret] = f"<{kind}_{self.counts[kind]}>"
        if search and secret not in self.searched and specific(secret):
            self.searched.add(secret)
            self._search = None
        return ph

    def _user(self, name: str) -> int:
        if name not in self.users:
            self.counts["HOME"] = self.counts.get("HOME", 0) + 1
            self.users[name] = self.counts["HOME"]
            self._search = None
        return self.users[name]

    # --- the patterns, in place ---------------------------------------------------------------------

    def _assigned(self, m: re.Match) -> str:
        name, sep, kind = m.group(1), m.group(2), m.group(3)
        value = m.group(4) or m.group(5) or m.group(6)
        quote = '"' if m.group(4) is not None else "'" if m.group(5) is not None else ""
        if value.startswith("<") or _NOT_SECRET_VALUES.search(value):
            return m.group(0)
        if _secret_name(name, value):
            if len(value) < 3 or (kind == ":" and not quote and not specific(value)):  # prose: "token: the"
                return m.group(0)
            if not quote and re.search(r"[()\[\]{}$`]", value):  # code: key = f(x), token: ${VAR}
                return m.group(0)
            what = "PASSWORD" if re.search(r"(?i)pass|pwd|pw$", name) else "API_KEY"
        elif kind == "=" and looks_random(value):
            what = "API_KEY"
        else:
            return m.group(0)
        return f"{name}{sep}{quote}{self._placeholder(what, value, search=True)}{quote}"

    def _url(self, m: re.Match) -> str:
        user, password = m.group(2), m.group(3)
        if password.startswith("<"):
            return m.group(0)
        if specific(password):  # the password alone, wherever it is repeated ("pw" is only redacted here)
            self._placeholder("PASSWORD", password, search=True)
        return m.group(1) + self._placeholder("CREDENTIALS", f"{user}:{password}", search=True) + "@"

    def _bearer(self, m: re.Match) -> str:
        token, header = m.group(3), m.group(2) is not None
        has_digit, has_alpha = any(c.isdigit() for c in token), any(c.isalpha() for c in token)
        if token.startswith("<") or not (header and len(token) >= 4 and not (token.isalpha() and token.islower())
                                         or len(token) >= 6 and has_digit and has_alpha):
            return m.group(0)  # "the bearer of", "bearer token", "Bearer Usage": words, not tokens
        return m.group(1) + self._placeholder("API_KEY", token, search=True)

    def _phone(self, m: re.Match) -> str:
        digits = sum(c.isdigit() for c in m.group(0))
        ok = 10 <= digits <= 15 if m.group(0).startswith("+") else digits == 10
        return self._placeholder("PHONE", m.group(0), search=True) if ok else m.group(0)

    def _ip(self, m: re.Match) -> str:
        a, b, *rest = (int(x) for x in m.group(0).split("."))
        private = a == 10 or (a == 172 and 16 <= b <= 31) or (a == 192 and b == 168) or (a == 169 and b == 254)
        if not private or any(x > 255 for x in (a, b, *rest)):
            return m.group(0)
        return self._placeholder("PRIVATE_IP", m.group(0), search=True)

    def _home(self, m: re.Match) -> str:
        return f"<HOME_{self._user(m.group(1))}>"

    def _dash_homes(self, s: str) -> str:
        # A user name may contain dashes (john-doe): names seen in plain paths are tried first, longest
        # first; otherwise the name ends at the next dash.
        known = "".join(re.escape(u) + r"(?=$|[-/\\\s])|" for u in sorted(self.users, key=len, reverse=True))
        pattern = re.compile(r"-(?:home|Users)-(?!<)(" + known + r"[A-Za-z0-9_.]+)")
        return pattern.sub(lambda m: f"-<HOME_{self._user(m.group(1))}>", s)

    def _patterns(self, s: str) -> str:
        if len(s) < 6:  # shorter than any pattern: only the known values can be in it
            return s
        # Each pattern runs only where its anchor is (a substring test costs far less than a regex pass).
        if "PRIVATE KEY" in s:
            s = _PEM.sub(lambda m: self._placeholder("PRIVATE_KEY", m.group(0)), s)
        if "://" in s:
            s = _URL_CREDENTIALS.sub(self._url, s)
        s = _TOKENS.sub(lambda m: self._placeholder("API_KEY", m.group(0), search=True), s)
        if "earer" in s or "EARER" in s:
            s = _BEARER.sub(self._bearer, s)
        if "uthorization" in s or "UTHORIZATION" in s:
            s = _BASIC.sub(lambda m: m.group(1) + self._placeholder("API_KEY", m.group(2), search=True), s)
        if "=" in s or ":" in s:
            s = _ASSIGNED.sub(self._assigned, s)
        if len(s) >= 40:
            s = _BARE_40.sub(lambda m: self._placeholder("API_KEY", m.group(0), search=True)
                             if looks_random(m.group(0)) else m.group(0), s)
        if "@" in s:
            s = _EMAIL.sub(lambda m: self._placeholder("EMAIL", m.group(0), search=True), s)
        s = _PHONE.sub(self._phone, s)
        if "." in s:
            s = _IPV4.sub(self._ip, s)
        if self._local_home and self._local_home not in ("/", "") and self._local_home in s:
            local = self._local if self._local and self._local.lower() not in _GENERIC_USERS else Path(self._local_home).name
            s = re.sub(re.escape(self._local_home) + r"(?![\w.\-])", f"<HOME_{self._user(local)}>", s)
        if "home" in s or "Users" in s:
            s = _HOME.sub(self._home, s)
        if "-home-" in s or "-Users-" in s:
            s = self._dash_homes(s)
        if self._local and self._local.lower() not in _GENERIC_USERS and len(self._local) >= 3 and \
                self._local in s and re.search(rf"(?<![A-Za-z0-9]){re.escape(self._local)}(?![A-Za-z0-9])", s):
            self._user(self._local)
        return s

    # --- the detected values, wherever they are -------------------------------------------------------

    def _searcher(self) -> re.Pattern:
        if self._search is None:
            values = sorted(self.searched, key=len, reverse=True)
            users = [u for u in sorted(self.users, key=len, reverse=True) if u.lower() not in _GENERIC_USERS and len(u) >= 3]
            alternatives = [f"(?P<ph>{_PLACEHOLDER})"]  # already replaced: keep
            alternatives += [f"(?<![A-Za-z0-9]){re.escape(v)}(?![A-Za-z0-9])" if len(v) < 12 else re.escape(v)
                             for v in values]
            if users:
                alternatives.append("(?P<user>(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, users)) + ")(?![A-Za-z0-9]))")
            self._search = re.compile("|".join(alternatives))
        return self._search

    def _replace_known(self, s: str) -> str:
        if not self.searched and not self.users:
            return s

        def one(m: re.Match) -> str:
            if m.group("ph") is not None:
                return m.group(0)
            if m.groupdict().get("user") is not None:
                return f"<USER_{self.users[m.group(0)]}>"
            return self.placeholders[m.group(0)]

        return self._searcher().sub(one, s)

    # --- the two passes -----------------------------------------------------------------------------------

    def scan(self, value: Any) -> None:
        """Pass 1: detect the secrets of every string in ``value`` (nested lists/dicts, keys included)."""
        for s in dict.fromkeys(_strings(value)):  # each distinct string once, in order
            self._patterns(s)

    def apply(self, value: Any) -> Any:
        """Pass 2: ``value`` with every detected secret replaced, in every string (keys included)."""
        if isinstance(value, str):
            done = self._applied.get(value)
            if done is None or done[0] != len(self.placeholders) + len(self.users):
                done = self._applied[value] = (len(self.placeholders) + len(self.users),
                                               self._replace_known(self._patterns(value)))
            return done[1]
        if isinstance(value, list):
            return [self.apply(x) for x in value]
        if isinstance(value, dict):
            return {self.apply(k): self.apply(x) for k, x in value.items()}
        return value

    def text(self, s: str) -> str:
        """Both passes on one string."""
        self.scan(s)
        return self.apply(s)

    def trajectory(self, traj: Trajectory) -> Trajectory:
        """Both passes on one trajectory (an import scans all of them first: :func:`redact_import`)."""
        data = traj.to_json_dict()
        self.scan(data)
        return Trajectory.model_validate(self.apply(data))


def _local_account() -> tuple[str | None, str | None]:
    try:
        return getpass.getuser(), str(Path.home())
    except (OSError, KeyError, RuntimeError):  # no login name, no passwd entry (some containers)
        return None, None


def _strings(value: Any) -> Iterable[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            yield v
        elif isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, dict):
            for k, x in reversed(list(v.items())):
                stack.append(x)
                stack.append(k)


def redact_import(result, redactor: Redactor | None = None) -> Redactor:
    """Redact an :class:`~memorywalker.importers.base.ImportResult` in place: detect over every
    trajectory and every reject first, then replace everywhere (trajectories and rejects alike)."""
    redactor = redactor or Redactor()
    data = [t.to_json_dict() for t in result.trajectories]
    rejects = [dataclasses.asdict(r) for r in result.rejects]
    redactor.scan(data)
    redactor.scan(rejects)
    result.trajectories = [Trajectory.model_validate(redactor.apply(d)) for d in data]
    result.rejects = [dataclasses.replace(r, source=redactor.apply(r.source), message=redactor.apply(r.message),
                                          detail=None if r.detail is None else redactor.apply(_drop_cut_fragment(r.detail)))
                      for r in result.rejects]
    return redactor


# A reject's ``detail`` (what an unknown record carried, ``--debug`` prints it) is cut at a fixed length
# (importers.base.carried): a secret cut in two is too short for its pattern, so the run of token
# characters the cut ends in is dropped.
_CUT = re.compile(r"(?s)^(.*?)[A-Za-z0-9_.~+/=%@:\\-]*(… \(\d+ chars\))$")


def _drop_cut_fragment(detail: str) -> str:
    """``detail`` without the partial token its cut ends in.

    >>> _drop_cut_fragment('{"note":"key sk_live_51Hq… (90 chars)')
    '{"note":"key … (90 chars)'
    >>> _drop_cut_fragment('{"type":"x"}')
    '{"type":"x"}'
    """
    m = _CUT.match(detail)
    return m.group(1) + m.group(2) if m else detail
