"""What the C extension `_tlsfront.c` offers (`cdi.common.tlsfront` uses it): OpenSSL server contexts and
the connections they accept, for the threaded fronts. Timeouts are milliseconds, -1 for none."""

class Context:
    """A server context: certificate chain and key, optional client CA (a client certificate is then asked
    for, and must chain to it when given), minimum version, TLS 1.2 cipher list, OpenSSL option bits."""

    def __init__(self, certfile: str, keyfile: str, cafile: str | None = None, minimum: int = ...,
                 ciphers: str | None = None, *, options: int | None = None) -> None: ...
    def accept(self, fd: int, timeout_ms: int, /) -> Conn:
        """The server's handshake on a connected descriptor (which stays the caller's)."""

class Conn:
    def fill(self, buffer: bytearray | memoryview, first_ms: int, pause_ms: int, /) -> tuple[int, int, int | str]:
        """(bytes read, why it stopped, detail): until the buffer is full, the peer pauses or the end."""
    def sendall(self, data: bytes | bytearray | memoryview, timeout_ms: int, /) -> None: ...
    def shutdown(self, timeout_ms: int, /) -> None:
        """close_notify both ways; the TCP connection stays."""
    def pending(self) -> int: ...
    def peer_subject(self) -> tuple[tuple[tuple[str, str]], ...] | None:
        """The client certificate's subject as the ssl module gives it; None without one."""
    def close(self) -> None:
        """Free the TLS state (not the descriptor); a call inside on another thread is cut."""
