"""Text that may be stored and rendered: no NUL or other control characters.

PostgreSQL refuses NUL in text, terminals and log viewers act on escape sequences, and batch
scripts and manifests must not carry characters the user cannot see. One check, used by the
spec, the API bodies and the query strings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema as cs

# Unicode category Cc (C0, DEL, C1), Cs (lone surrogates, which no UTF-8 encoder, and so no
# database, accepts) and the bidirectional controls (U+061C, U+200E-U+200F, U+202A-U+202E,
# U+2066-U+2069: they make a name or a script read otherwise than it runs, "Trojan Source").
# A regex because scripts may be a megabyte long.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{_BIDI}]")
_CONTROL_BUT_NL_TAB = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff{_BIDI}]")


def control_character(value: str, *, multiline: bool = False) -> str | None:
    """The first refused character of `value` as 'U+0000', or None. `multiline` allows
    newline and tab."""
    m = (_CONTROL_BUT_NL_TAB if multiline else _CONTROL).search(value)
    return None if m is None else f"U+{ord(m.group()):04X}"


def _plain(value: str) -> str:
    bad = control_character(value)
    if bad is not None:
        raise ValueError(f"control character {bad} is not allowed; remove it")
    return value


def _multiline(value: str) -> str:
    bad = control_character(value, multiline=True)
    if bad is not None:
        raise ValueError(
            f"control character {bad} is not allowed (only newline and tab are); "
            "use Unix line endings and no escape codes"
        )
    return value


class _SchemaPattern:
    """Says in the JSON schema (and so the OpenAPI document) what the validator refuses, so
    clients and fuzzers generate text the API accepts. A field's own pattern is kept."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def __get_pydantic_json_schema__(
        self, schema: cs.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out: dict[str, Any] = handler(schema)
        out.setdefault("pattern", self.pattern)
        return out


Text = Annotated[
    str, AfterValidator(_plain),
    _SchemaPattern(r"^[^\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$")
]
"""A string without control characters."""

TextKey = Annotated[str, AfterValidator(_plain)]
"""Text as a mapping key: JSON Schema states key rules in the mapping's `propertyNames`."""

MultilineText = Annotated[
    str, AfterValidator(_multiline),
    _SchemaPattern(r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]*$")
]
"""A string whose only control characters are newline and tab: a batch script, and what is
multi-line by nature (`bash -c` arguments, environment values such as a PEM certificate,
annotation values). The renderers carry these without letting them reach a shell."""
