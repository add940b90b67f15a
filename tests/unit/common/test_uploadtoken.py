"""Upload tokens: CDI's format (PS256, issuer, claims, private payload) and the checks the proxy makes."""

from __future__ import annotations

import base64
import json
import time

import pytest

from cdi.common import uploadtoken

KEY = uploadtoken.generate_private_key()
PUBLIC = uploadtoken.public_key_pem(KEY)


def parts(token: str) -> tuple[dict[str, object], dict[str, object]]:
    def decode(part: str) -> dict[str, object]:
        result: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
        return result
    header, payload, _ = token.split(".")
    return decode(header), decode(payload)


def test_a_token_has_cdis_shape() -> None:
    token = uploadtoken.issue(KEY, "ns", "disk", now=1_000_000)
    header, claims = parts(token)
    assert header["alg"] == "PS256"
    assert claims == {"operation": "Upload", "name": "disk", "namespace": "ns",
                      "resource": {"group": "", "version": "v1", "resource": "persistentvolumeclaims"},
                      "iss": "cdi-apiserver", "iat": 1_000_000, "nbf": 1_000_000, "exp": 1_000_300}
    assert KEY.startswith(b"-----BEGIN RSA PRIVATE KEY-----")  # PKCS#1, as CDI's id_rsa


def test_a_valid_token_verifies() -> None:
    payload = uploadtoken.verify(uploadtoken.issue(KEY, "ns", "disk"), PUBLIC)
    assert (payload.operation, payload.namespace, payload.name) == ("Upload", "ns", "disk")
    assert payload.is_pvc_upload


def test_expiry_has_ten_seconds_of_leeway() -> None:
    assert uploadtoken.verify(uploadtoken.issue(KEY, "ns", "disk", now=time.time() - 305), PUBLIC)
    with pytest.raises(uploadtoken.TokenError, match="expired at"):
        uploadtoken.verify(uploadtoken.issue(KEY, "ns", "disk", now=time.time() - 315), PUBLIC)


def test_another_key_or_issuer_or_garbage_is_refused() -> None:
    other = uploadtoken.generate_private_key()
    with pytest.raises(uploadtoken.TokenError, match="signature is invalid"):
        uploadtoken.verify(uploadtoken.issue(other, "ns", "disk"), PUBLIC)
    import jwt
    foreign = jwt.encode({"iss": "someone", "exp": int(time.time()) + 60, "operation": "Upload"}, KEY,
                         algorithm="PS256")
    with pytest.raises(uploadtoken.TokenError, match="not issued by cdi-apiserver"):
        uploadtoken.verify(foreign, PUBLIC)
    with pytest.raises(uploadtoken.TokenError, match="malformed"):
        uploadtoken.verify("not.a.token", PUBLIC)
    unsigned = jwt.encode({"iss": "cdi-apiserver", "exp": int(time.time()) + 60}, "s" * 32, algorithm="HS256")
    with pytest.raises(uploadtoken.TokenError):
        uploadtoken.verify(unsigned, PUBLIC)


def test_a_clone_token_is_not_an_upload_token() -> None:
    payload = uploadtoken.verify(uploadtoken.issue(KEY, "ns", "disk", operation=uploadtoken.OPERATION_CLONE), PUBLIC)
    assert not payload.is_pvc_upload
