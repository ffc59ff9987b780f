"""The mutual-TLS server context of the cluster's listeners: the API server's and each agent's."""
from __future__ import annotations

import ssl

# OpenSSL's X509_V_FLAG_NO_CHECK_TIME, which Python's ssl module does not name.
X509_V_FLAG_NO_CHECK_TIME = 0x200000


def mtls_server_context(cert: str, key: str, client_ca: str, *, check_time: bool = True) -> ssl.SSLContext:
    """Serve with `cert`; every client must present a certificate of `client_ca`. TLS 1.2 at
    least. `check_time=False` leaves the validity dates out of the handshake, for a server that
    checks them per request, with an answer saying why (llmgw/server/tls.py)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    if not check_time:
        ctx.verify_flags |= X509_V_FLAG_NO_CHECK_TIME
    # No TLS 1.3 session tickets: no client of the cluster resumes a session (asyncio's and
    # http.client's connections never offer one), and a ticket is good only on the process that
    # issued it, never on the server a client fails over to; the two OpenSSL makes by default
    # cost the server about a third of each handshake's CPU (hack/bench/failover.py).
    ctx.num_tickets = 0
    return ctx


def peer_client_context(cert: str, key: str, ca: str) -> ssl.SSLContext:
    """Dial another member of the cluster (an agent's listener) at the address it advertises,
    which its certificate may not name: `cert` presented, the peer's certificate verified against
    `ca`, its host name not checked. Whoever dials checks what it needs beyond the CA: the API
    server the certificate's CN against the node (llmgw/server/logs.py); a pulling node nothing,
    since it verifies every byte by its sha256 (llmgw/weights/peers.py)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=ca)
    ctx.load_cert_chain(cert, key)
    return ctx
