"""Go's string quoting, because upstream error messages show bad values the way Go's %q prints them, and the
HTML-safe escapes Go's encoding/json writes into JSON text."""

from __future__ import annotations

_JSON_HTML_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                      ("\u2029", "\\u2029"))


def go_json_escape(text: str) -> str:
    """JSON text as Go's encoding/json writes it: <, >, & and the line/paragraph separators as \\u escapes."""
    for ch, esc in _JSON_HTML_ESCAPES:
        text = text.replace(ch, esc)
    return text


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
