"""`$(VAR)` references in command, args and env values, expanded exactly as the kubelet does:
`$(NAME)` becomes the value when NAME is defined, stays as written when it is not, and `$$` is an
escaped `$` (so `$$(NAME)` yields the literal `$(NAME)`)."""

from __future__ import annotations

from collections.abc import Callable


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append(text[i:])
                break
            name = text[i + 2:close]
            value = lookup(name) if name else None
            out.append(value if value is not None else text[i:close + 1])
            i = close + 1
            continue
        out.append("$" + nxt)
        i += 2
    return "".join(out)
