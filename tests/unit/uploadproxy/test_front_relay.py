"""How the proxy reads the upload server's answer: an upload server that closes without one is reported
in plain words (the client's 502 body), not in h11's state names."""

from __future__ import annotations

import socket

import h11
import pytest

from cdi.uploadproxy import front


def _sent_request(up: h11.Connection) -> bytes:
    return up.send(h11.Request(method=b"POST", target=b"/v1beta1/upload", headers=[(b"Host", b"x"),
                                                                                  (b"Content-Length", b"0")])) + \
        (up.send(h11.EndOfMessage()) or b"")


def test_an_upload_server_that_closes_without_an_answer_is_said_so() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        up = h11.Connection(h11.CLIENT)
        ours.sendall(_sent_request(up))
        assert not front._answered(ours, up)  # nothing yet
        theirs.recv(65536)  # the request, read (closing with it unread would reset the connection)
        theirs.close()
        assert front._answered(ours, up)  # closed counts: the answer is read next
        with pytest.raises(h11.RemoteProtocolError, match=r"^the upload server closed the connection without an "
                                                          r"answer$"):
            front._next(ours, up)


def test_an_answer_seen_early_is_read_whole() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        up = h11.Connection(h11.CLIENT)
        ours.sendall(_sent_request(up))
        theirs.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        assert front._answered(ours, up)
        response = front._next(ours, up)
        assert isinstance(response, h11.Response) and response.status_code == 200
        data = front._next(ours, up)
        assert isinstance(data, h11.Data) and data.data == b"ok"
        assert isinstance(front._next(ours, up), h11.EndOfMessage)


@pytest.mark.parametrize(("status", "relayed"), [(200, 502), (400, 400)])
def test_a_success_answered_before_the_whole_body_is_not_passed_on(status: int, relayed: int) -> None:
    """An upload server cannot have the whole image before the whole body reached it: its early 200 means
    something cut the body short, and the client must not take it as an upload that completed. An early
    refusal (400, 503, ...) is passed on as it is."""
    client, proxy_side = socket.socketpair()
    ours, theirs = socket.socketpair()
    with client, proxy_side, ours, theirs:
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(b"POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        request = conn.next_event()
        assert isinstance(request, h11.Request)
        upload = front._Upload(None, proxy_side, conn, request)  # type: ignore[arg-type]
        up = h11.Connection(h11.CLIENT)
        ours.sendall(_sent_request(up))
        theirs.sendall(b"HTTP/1.1 %d Whatever\r\nContent-Length: 0\r\n\r\n" % status)
        upload._relay(ours, up, early=True)
        proxy_side.shutdown(socket.SHUT_WR)
        answer = client.recv(65536)
        assert answer.startswith(b"HTTP/1.1 %d " % relayed), answer
        if relayed == 502:
            assert b"before the whole body was sent to it; the upload did not complete" in answer
