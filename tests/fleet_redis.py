"""A real ``redis-server`` on a free loopback port, for the shared-database tests (skipped
only where the binary is not installed: ``apt-get install redis-server``)."""
import shutil
import socket
import subprocess
import time

import pytest


def free_port() -> int:
    """A loopback port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, binary: str, folder: str):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", folder, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not self.answers():
            assert self.proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer in 20 s"
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the server goes away without a goodbye, as a crashed host would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def redis_server(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    server = RedisServer(binary, str(tmp_path))
    yield server
    server.kill()
