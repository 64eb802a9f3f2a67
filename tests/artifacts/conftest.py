import pytest

from s3_server import S3Server


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The AWS variables pointing the real client at the loopback server, in this process."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()


@pytest.fixture
def s3_url(s3_server, s3_env):
    """A fresh bucket, with a prefix: ``s3://<bucket>/platform``."""
    return f"s3://{s3_server.new_bucket()}/platform"
