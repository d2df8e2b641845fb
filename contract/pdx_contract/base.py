"""What every contract document shares: camelCase on the wire, no unknown fields, and errors
that name the field the way the JSON spells it."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel


class ContractError(ValueError):
    """A document does not fit its contract; the message names each field and the fix."""


class Document(BaseModel):
    """Strict (a string is not a number, nor a boolean a count) and frozen."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    def to_json(self) -> dict[str, object]:
        """The wire form, with every default written out (the reader needs no defaults of its own)."""
        return self.model_dump(mode="json", by_alias=True)


def problems(err: ValidationError) -> list[str]:
    """One line per problem: `field.path[0]: what is wrong`."""
    out = []
    for e in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".") or "document"
        if e["type"] == "extra_forbidden":
            out.append(f"{where}: unknown field; remove it or fix its spelling")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            out.append(f"{where}: {msg} (got {e.get('input')!r})")
    return out


def engine_url(host: str, port: int) -> str:
    """An engine's base URL; IPv6 literals go in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def check_url(value: str) -> str:
    """An engine base URL (http(s), a host, IPv6 literals in brackets), without a trailing '/'."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("not an http(s) URL; write e.g. 'http://10.0.0.5:8000' or 'http://[fd00::5]:8000' for IPv6")
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        raise ValueError(f"bad port ({exc})") from exc
    if not host:
        raise ValueError("no host")
    if ":" in host and "[" not in parts.netloc:
        raise ValueError(f"an IPv6 literal must be in brackets: http://[{host}]:PORT")
    return value.rstrip("/")
