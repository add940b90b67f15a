"""The upload proxy's rules as a proxy (`cdi.uploadproxy.front` applies them): which headers are not
forwarded, the CORS headers of an answer to a browser, and how a client that went away mid-body is
told apart from an upstream failure."""

from __future__ import annotations

from cdi.api import upload as names

# hop-by-hop headers (RFC 9110 7.6.1) and those the proxy sets itself: never passed on, either way
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"})
# not passed on to the upload server: the user's token is the proxy's business; 100-continue is answered here
NOT_FORWARDED = HOP_BY_HOP | {"authorization", "expect"}
# nor who the aggregation layer says the user is, or what a client claims (the front-proxy headers' prefixes)
IDENTITY_PREFIXES = ("x-remote-", "impersonate-")
EXPOSED = ", ".join((names.OFFSET_HEADER, names.STATE_HEADER))
# on every answer to a request with an Origin (CDI's proxy uses rs/cors AllowAll)
CORS = (("Access-Control-Allow-Origin", "*"), ("Access-Control-Expose-Headers", EXPOSED), ("Vary", "Origin"))


def preflight(method: str, headers: str | None) -> dict[str, str]:
    """The answer's headers to a CORS preflight (`OPTIONS` with `Access-Control-Request-Method`)."""
    answer = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": method.upper(),
              "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"}
    if headers:
        answer["Access-Control-Allow-Headers"] = headers
    return answer


class ClientGone(Exception):
    """The client's connection broke (or closed) before its whole body arrived: the upload server is told
    (its request is cut), and nothing is answered to a client that is not there (499 in the log)."""
