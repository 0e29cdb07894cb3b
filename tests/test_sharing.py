import pytest

from harness.config import ConfigError
from harness.sharing import PolicyMap
from tests.conftest import cell

VOTING = [("voter", 0), ("voter", 1), ("voter", 2), ("aggregator", 0)]


def test_modes(tmp_path):
    sp = PolicyMap.from_config(cell(tmp_path, "sharing=sp"), VOTING)
    assert sp.policies == ["shared"]
    ip = PolicyMap.from_config(cell(tmp_path, "sharing=ip"), VOTING)
    assert ip.policies == ["aggregator", "voter"] and len(ip.members("voter")) == 3
    inst = PolicyMap.from_config(cell(tmp_path, "sharing=ip_instance"), VOTING)
    assert inst.policies == ["aggregator", "voter_0", "voter_1", "voter_2"]
    custom = PolicyMap.from_config(
        cell(tmp_path, "sharing=custom", "+sharing_cfg.groups={pair:[voter:0,voter:1],rest:[voter:2,aggregator]}"),
        VOTING)
    assert custom.policy_of("voter", 1) == "pair" and custom.policy_of("aggregator", 0) == "rest"


def test_custom_groups_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="without a policy"):
        cell(tmp_path, "sharing=custom", "+sharing_cfg.groups={a:[voter]}")
    with pytest.raises(ConfigError, match="not a role of this topology"):
        cell(tmp_path, "sharing=custom", "+sharing_cfg.groups={a:[voter,aggregator,critic]}")
