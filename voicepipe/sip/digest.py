"""SIP digest authentication (RFC 3261 section 22, RFC 2617's MD5 with qop=auth): the challenge this
server sends a caller it does not know by address, the check of the caller's answer, and this server's own
answer to a registrar's challenge."""

import hashlib
import hmac
import os
import time

from sipmessage import AuthChallenge, AuthCredentials, AuthParameters

NONCE_S = 300  # how long a challenge's nonce is honoured


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def _response(user: str, realm: str, password: str, method: str, uri: str, nonce: str,
              nc: str | None = None, cnonce: str | None = None, qop: str | None = None) -> str:
    ha1, ha2 = _md5(f"{user}:{realm}:{password}"), _md5(f"{method}:{uri}")
    return _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}" if qop else f"{ha1}:{nonce}:{ha2}")


class DigestRealm:
    """Challenges and checks callers against one user name and password. Nonces carry their time and an
    HMAC of it under a key of this process, so no state is kept per challenge."""

    def __init__(self, user: str, password: str, realm: str = "voicepipe") -> None:
        self.user, self.password, self.realm = user, password, realm
        self._key = os.urandom(16)

    def challenge(self) -> AuthChallenge:
        stamp = str(int(time.time()))
        nonce = f"{stamp}.{hmac.new(self._key, stamp.encode(), 'sha256').hexdigest()[:24]}"
        return AuthChallenge("Digest", AuthParameters(realm=self.realm, nonce=nonce, algorithm="MD5", qop="auth"))

    def check(self, method: str, credentials: AuthCredentials | None) -> bool:
        """Whether `credentials` answer a fresh challenge of ours for `method` with the right password."""
        if credentials is None or credentials.parameters is None or credentials.scheme.lower() != "digest":
            return False
        p = dict(credentials.parameters)
        nonce, given = p.get("nonce", ""), p.get("response", "")
        stamp, _, mac = nonce.partition(".")
        expected_mac = hmac.new(self._key, stamp.encode(), "sha256").hexdigest()[:24]
        if not stamp.isdigit() or not hmac.compare_digest(mac, expected_mac) or time.time() - int(stamp) > NONCE_S:
            return False
        if p.get("username") != self.user or p.get("realm") != self.realm or "uri" not in p:
            return False
        expected = _response(self.user, self.realm, self.password, method, p["uri"], nonce,
                             p.get("nc"), p.get("cnonce"), p.get("qop"))
        return hmac.compare_digest(expected, given)


def authorization(challenge: AuthChallenge, user: str, password: str, method: str, uri: str) -> AuthCredentials:
    """This side's answer to a registrar's (or a proxy's) challenge."""
    p = dict(challenge.parameters)
    realm, nonce = p.get("realm", ""), p.get("nonce", "")
    qop = "auth" if "auth" in [q.strip() for q in p.get("qop", "").split(",")] else None
    nc, cnonce = ("00000001", os.urandom(8).hex()) if qop else (None, None)
    fields = dict(username=user, realm=realm, nonce=nonce, uri=uri, algorithm="MD5",
                  response=_response(user, realm, password, method, uri, nonce, nc, cnonce, qop))
    if qop:
        fields |= dict(qop=qop, nc=nc, cnonce=cnonce)  # type: ignore[arg-type]
    if "opaque" in p:
        fields["opaque"] = p["opaque"]
    return AuthCredentials("Digest", AuthParameters(**fields))  # type: ignore[arg-type]
