"""CDI's GCS URL forms: which bucket, object and API endpoint each one means."""

from __future__ import annotations

import pytest

from cdi.importer.errors import ImporterError
from cdi.importer.source_gcs import GcsLocation, parse_endpoint


@pytest.mark.parametrize(("url", "expected"), [
    ("gs://bucket/disk.qcow2", GcsLocation("bucket", "disk.qcow2", None)),
    ("gs://bucket/dir/sub/disk%20one.img", GcsLocation("bucket", "dir/sub/disk one.img", None)),
    # Google's own hosts mean Google's API (the library's default endpoint)
    ("https://storage.cloud.google.com/bucket/dir/disk.img", GcsLocation("bucket", "dir/disk.img", None)),
    ("https://storage.googleapis.com/bucket/disk.img", GcsLocation("bucket", "disk.img", None)),
    # any other host is the API endpoint to talk to (a private endpoint, an emulator)
    ("http://127.0.0.1:9023/images/raw.img", GcsLocation("images", "raw.img", "http://127.0.0.1:9023")),
])
def test_url_forms(url: str, expected: GcsLocation) -> None:
    assert parse_endpoint(url) == expected


@pytest.mark.parametrize("url", ["gs://bucket", "gs://bucket/", "https://storage.googleapis.com/bucket",
                                 "s3://bucket/key"])
def test_urls_without_an_object_are_refused(url: str) -> None:
    with pytest.raises(ImporterError) as caught:
        parse_endpoint(url)
    assert caught.value.reason == "InvalidConfiguration" and url in caught.value.message
