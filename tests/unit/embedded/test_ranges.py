"""Address ranges of `cdi up` instances (cdi.embedded.ranges) with real claims and listeners: chosen
once per data directory, never one another live instance holds, one something listens in, or one a
stopped instance whose data directory still exists recorded. The parent networks here (127.31/16)
are ones no `cdi up` uses, so instances running on this machine meanwhile do not matter."""

from __future__ import annotations

import ipaddress
import shutil
import socket
from pathlib import Path

import pytest

from cdi.embedded.ranges import AddressPool, claim_range


@pytest.fixture(autouse=True)
def own_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


def data_dir(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir(exist_ok=True)
    return directory


def test_a_data_dir_keeps_its_range_and_another_gets_another(tmp_path: Path) -> None:
    first = claim_range("127.31.0.0/16", data_dir(tmp_path, "a") / "range")
    second = claim_range("127.31.0.0/16", data_dir(tmp_path, "b") / "range")
    assert first.network.prefixlen == 24 and first.network.subnet_of(ipaddress.IPv4Network("127.31.0.0/16"))
    assert first.network != second.network
    assert (tmp_path / "a" / "range").read_text().strip() == str(first.network)
    network = first.network
    first.close()
    again = claim_range("127.31.0.0/16", tmp_path / "a" / "range")
    assert again.network == network
    for held in (again, second):
        held.close()


def test_a_live_claim_wins_over_what_a_data_dir_recorded(tmp_path: Path) -> None:
    holder = claim_range("127.31.0.0/16", data_dir(tmp_path, "a") / "range")
    copied = data_dir(tmp_path, "copy") / "range"  # a data directory copied while its instance runs
    copied.write_text(f"{holder.network}\n")
    other = claim_range("127.31.0.0/16", copied)
    assert other.network != holder.network
    assert copied.read_text().strip() == str(other.network)
    holder.close()
    other.close()


def test_a_stopped_instances_range_is_left_to_it_while_another_is_free(tmp_path: Path) -> None:
    within = "127.31.8.0/23"  # two /24s only
    stopped = claim_range(within, data_dir(tmp_path, "a") / "range")
    stopped.close()
    running = claim_range(within, data_dir(tmp_path, "b") / "range")
    assert running.network != stopped.network
    # none other free: a record is a preference (data directories never started again must not use
    # every range up), a live claim is not
    third = claim_range(within, data_dir(tmp_path, "c") / "range")
    assert third.network == stopped.network
    with pytest.raises(RuntimeError, match=r"no free /24 left in 127\.31\.8\.0/23"):
        claim_range(within, data_dir(tmp_path, "d") / "range")
    running.close()
    third.close()


def test_a_stopped_instances_record_ends_with_its_data_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    within = "127.31.14.0/23"
    stopped = claim_range(within, data_dir(tmp_path, "a") / "range")
    stopped.close()
    shutil.rmtree(tmp_path / "a")
    held = [claim_range(within, data_dir(tmp_path, name) / "range") for name in ("b", "c")]
    assert {h.network for h in held} == set(ipaddress.IPv4Network(within).subnets(new_prefix=24))
    assert "another (stopped) cdi up recorded" not in caplog.text  # a's record did not count
    for h in held:
        h.close()


def test_a_range_something_listens_in_is_not_chosen(tmp_path: Path) -> None:
    within = ipaddress.IPv4Network("127.31.10.0/23")
    first, second = within.subnets(new_prefix=24)
    with socket.create_server((str(first.network_address + 9), 0)):
        chosen = claim_range(str(within), data_dir(tmp_path, "a") / "range")
        assert chosen.network == second
    chosen.close()


def test_a_pool_skips_addresses_in_use_and_ones_something_listens_on() -> None:
    pool = AddressPool("127.31.12.0/24")
    with socket.create_server(("127.31.12.1", 0)):
        assert pool.allocate() == "127.31.12.2"
    pool.take("127.31.12.3")
    assert pool.allocate() == "127.31.12.4"
    assert "127.31.12.200" in pool and "127.31.13.1" not in pool and "nonsense" not in pool
    pool.release("127.31.12.2")
    assert pool.in_use("127.31.12.4") and not pool.in_use("127.31.12.2")
