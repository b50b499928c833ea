"""Go's string quoting, because upstream error messages show bad values the way Go's %q prints them."""

from __future__ import annotations

_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(s: str) -> str:
    """`strconv.Quote` / `%q`: printable runes stay, the rest become \\x, \\u or \\U escapes."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'  # nothing to escape (printable ASCII): the common case, on every validated field
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable() and not 0xD800 <= code <= 0xDFFF:
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
