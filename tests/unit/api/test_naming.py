"""Names shortened as CDI shortens them (OpenShift's naming.GetName with FNV-1a): the same inputs give CDI's
exact names, and long names that differ only past the cut still differ."""

from __future__ import annotations

from cdi.api import naming
from cdi.api.upload import upload_resource_name, upload_service_name


def test_short_names_are_joined_unchanged() -> None:
    assert naming.resource_name("importer", "disk") == "importer-disk"
    assert upload_service_name("disk") == "cdi-upload-disk"


def test_a_long_name_keeps_its_suffix_behind_a_hash_of_its_base() -> None:
    # library-go's own example: GetName("deployment-5", "deploy", 10) drops the suffix and hashes the whole
    assert naming.shortened("deployment-5", "deploy", 10) == "d-e7bf2190"
    name = naming.shortened("b" * 70, "deploy", 63)
    assert len(name) == 63 and name.startswith("b" * 47 + "-") and name.endswith("-deploy")


def test_upload_services_of_long_names_are_dns_labels_and_distinct() -> None:
    first, second = "x" * 80 + "-1", "x" * 80 + "-2"
    services = {upload_service_name(first), upload_service_name(second)}
    assert len(services) == 2 and all(len(s) <= 63 for s in services)
    assert upload_resource_name("y" * 250).startswith("cdi-upload-") and len(upload_resource_name("y" * 250)) <= 253
