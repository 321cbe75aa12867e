"""The listening socket, bound before the models load so a busy port fails in a second, not a minute."""

import ipaddress
import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket on host:port (port 0 picks a free one); OSError says which is busy."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror or e} "
                               "(another server there? pick another with --port)") from None
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    """True for names and addresses that only this machine can reach (a Host header's name or a bind
    address): localhost and its subdomains, 127.0.0.0/8, ::1."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
