"""Quantities written back as the API server writes them (`cdi.api.quantity.Quantity`)."""

from __future__ import annotations

import pytest

from cdi.api.quantity import Quantity, QuantityError, parse_bytes


@pytest.mark.parametrize(("given", "canonical"), [
    ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1.5Gi", "1536Mi"), ("0.5Gi", "512Mi"), ("1000Mi", "1000Mi"),
    ("1000m", "1"), ("0.5", "500m"), ("100m", "100m"), ("1500000", "1500k"), ("2000000000", "2G"),
    ("68174084", "68174084"), ("1e3", "1e3"), ("512", "512"), ("1023Ki", "1023Ki"), ("0", "0"), ("-1Gi", "-1Gi"),
    ("0.0000000001", "1n"),
])
def test_canonical_forms(given: str, canonical: str) -> None:
    assert str(Quantity.parse(given)) == canonical


def test_a_sum_keeps_the_format_of_its_first_non_zero_term() -> None:
    assert str(Quantity() + Quantity.parse("64Mi")) == "64Mi"
    assert str(Quantity.parse("64Mi") + Quantity.parse("100M")) == "167108864"
    assert str(Quantity.parse("1G") + Quantity.parse("24Mi")) == "1025165824"
    assert str(Quantity.parse("1Gi") - Quantity.parse("1Gi")) == "0"


def test_bytes_round_up_and_bad_quantities_are_refused() -> None:
    assert parse_bytes("1.5Gi") == 1610612736 and parse_bytes("100m") == 1
    assert str(Quantity.parse("0.3").rounded_up()) == "1"
    with pytest.raises(QuantityError, match="quantities must match the regular expression"):
        Quantity.parse("lots")
