"""Credentials never reach a log line or a run directory.

Cloud runs put credentials where users can easily leak them: ``s3://KEY:SECRET@bucket/...``
URLs, ``?token=...`` query strings, ``*_secret`` / ``*_token`` / ``password`` values. Every
text fedray writes about a run (config.yaml, error messages, the closing line) goes through
``mask``, which keeps the shape of the value (so a user still sees which URL was meant) and
replaces the secret part with ``***``.
"""

from __future__ import annotations

import re

MASK = "***"
_SECRET_NAME = r"[\w.-]*(?:secret|token|passw(?:or)?d|api[_-]?key|access[_-]?key|credential)s?"
# scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@'\"]+:)[^@\s'\"]+@")
# ?token=abc / &password=abc in URLs and key=value overrides
_QUERY = re.compile(rf"(?i)(\b{_SECRET_NAME}=)[^&\s'\"]+")
# YAML / JSON style: access_key: abc, "api_key": "abc"
_MAPPING = re.compile(rf"(?i)(\b{_SECRET_NAME}[\"']?[ \t]*:[ \t]*)[\"']?[^\s,\"'}}]+[\"']?")


def mask(text: str) -> str:
    """``text`` with every credential-looking value replaced by ``***``."""
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)
    text = _QUERY.sub(rf"\g<1>{MASK}", text)
    return _MAPPING.sub(rf"\g<1>{MASK}", text)


def mask_tree(obj):
    """A copy of a JSON-like tree with credential-looking strings and values masked."""
    if isinstance(obj, dict):
        return {k: MASK if isinstance(k, str) and re.fullmatch(_SECRET_NAME, k, re.I)
                and v not in (None, "") else mask_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [mask_tree(v) for v in obj]
    return mask(obj) if isinstance(obj, str) else obj
