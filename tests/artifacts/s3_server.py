"""An S3-compatible server on loopback for the artifact store tests: moto's server mode, which
speaks S3's HTTP API to the real client (s3fs on botocore). It stands in for S3 or MinIO, which
these tests cannot reach; nothing in the store code knows it is not one."""

from __future__ import annotations

import socket
import uuid

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "artifact-tests", "AWS_SECRET_ACCESS_KEY": "artifact-tests-secret",
                  "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class S3Server:
    """A moto S3 server on 127.0.0.1:<port>; ``stop()`` and ``start()`` again on the same port keep
    its buckets (an outage of the store, not a loss of its data)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> "S3Server":
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def env(self) -> dict[str, str]:
        return {**S3_CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    def new_bucket(self) -> str:
        import boto3

        name = f"artifacts-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                     region_name=S3_CREDENTIALS["AWS_DEFAULT_REGION"]).create_bucket(Bucket=name)
        return name
