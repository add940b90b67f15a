"""Clone tokens, the controller's side (CDI's ValidateCloneTokenDV and ensureExtendedTokenDV).

A clone from another namespace goes ahead only with a token that cdi-apiserver's DataVolume mutating
webhook signed after its SubjectAccessReviews (`cdi.kubevirt.io/storage.clone.token`, 5 minutes), naming
this source and this target. The controller trades it at once for a long-lived one of its own issuer
(`cdi-deployment`), bound to the DataVolume's uid (`cdi.kubevirt.io/storage.extended.clone.token`), so
that a clone that waits long for its source still holds its permission, and a token copied onto
another DataVolume is worth nothing. Both are signed and checked with cdi-apiserver's key (Secret
`cdi-api-signing-key`, which CDI's controller mounts as well)."""

from __future__ import annotations

from collections.abc import Mapping

from cdi.api.annotations import CLONE_TOKEN, EXTENDED_CLONE_TOKEN
from cdi.common import uploadtoken

RESOURCES = {"pvc": "persistentvolumeclaims", "snapshot": "volumesnapshots"}
INVALID = "CloneTokenInvalid"  # ours: CDI only logs the error and retries


class TokenInvalid(Exception):
    """The DataVolume holds no token that allows this clone; the message says why (CDI's words)."""


def check(payload: uploadtoken.TokenPayload, kind: str, source_ns: str, source_name: str, target_ns: str,
          target_name: str, target_uid: str) -> None:
    """CDI's validateTokenData."""
    uid = payload.params.get("uid", "")
    if payload.operation != uploadtoken.OPERATION_CLONE or payload.name != source_name or \
            payload.namespace != source_ns or payload.resource.get("resource") != RESOURCES.get(kind) or \
            payload.params.get("targetNamespace") != target_ns or payload.params.get("targetName") != target_name or \
            (uid and uid != target_uid):
        raise TokenInvalid("invalid token")


def verified(annotations: Mapping[str, str], private_pem: bytes, kind: str, source_ns: str, source_name: str,
             target_ns: str, target_name: str, target_uid: str) -> str | None:
    """None when the DataVolume's extended token allows the clone; else the extended token to add, made
    from its valid short one. Raises TokenInvalid."""
    public = uploadtoken.public_key_pem(private_pem)
    extended = annotations.get(EXTENDED_CLONE_TOKEN)
    try:
        if extended is not None:
            payload = uploadtoken.verify(extended, public, issuer=uploadtoken.EXTENDED_ISSUER, what="clone token")
            check(payload, kind, source_ns, source_name, target_ns, target_name, target_uid)
            return None
        short = annotations.get(CLONE_TOKEN)
        if short is None:
            raise TokenInvalid("token missing")
        payload = uploadtoken.verify(short, public, what="clone token")
    except uploadtoken.TokenError as exc:
        raise TokenInvalid(f"error verifying token: {exc}") from None
    check(payload, kind, source_ns, source_name, target_ns, target_name, target_uid)
    return uploadtoken.issue(private_pem, payload.namespace, payload.name, operation=uploadtoken.OPERATION_CLONE,
                             resource=payload.resource, params={**payload.params, "uid": target_uid},
                             issuer=uploadtoken.EXTENDED_ISSUER, lifetime=uploadtoken.EXTENDED_LIFETIME_SECONDS)
