"""Ports for the servers tests start (app/embedded.py free_port): two test processes can never be handed the same
one. A fresh clone's run once failed because a gateway's port, found free and let go, was taken by another test's
SMTP server before the gateway bound it."""

import subprocess
import sys

from app.embedded import free_port
from gateway_testing.stack import ROOT, wait_for

# Another test process: one port 0 bind after another, as every server that picks its own port does (the SMTP
# inbox did), and a plain bind of the port itself; prints whether either ever got `port`.
OTHER_PROCESS = """
import socket, sys
port, tries, got = int(sys.argv[1]), int(sys.argv[2]), []
for _ in range(tries):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        got.append(s.getsockname()[1])
try:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    print("bound", port in got)
except OSError:
    print("refused", port in got)
"""


def other_process_takes(port: int, tries: int = 2000) -> str:
    return subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS, str(port), str(tries)], capture_output=True, text=True, timeout=60
    ).stdout.strip()


def test_a_port_handed_out_is_no_other_process_s_yet_our_server_listens_on_it_across_restarts():
    port = free_port()
    assert other_process_takes(port) == "refused False"
    # The server it was for binds it, and again after a restart (the port stays this process's in between).
    for _ in range(2):
        sandbox = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(f"http://127.0.0.1:{port}/healthz", sandbox, 60)
        finally:
            sandbox.terminate()
            sandbox.wait(30)
        assert other_process_takes(port, 10) == "refused False"


def test_consecutive_ports_for_workers_metrics_are_all_held():
    first = free_port(2)
    assert [other_process_takes(p, 10) for p in (first, first + 1)] == ["refused False"] * 2
