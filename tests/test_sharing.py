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


PAPER = {  # UnityMAS-O's paper: C's planning and answering agents share one model; A, B, D: one model per agent
    "qd_retrieve_answer": {"decomposer": ["decomposer"], "reader": ["reader"]},
    "qd_retrieve_evidence_answer": {"decomposer": ["decomposer"], "extractor": ["extractor"], "answerer": ["answerer"]},
    "mask_search": {"plan_answer": ["answerer", "planner"], "searcher": ["searcher"], "summarizer": ["summarizer"],
                    "updater": ["updater"]},
    "reflective_code": {"planner": ["planner"], "coder": ["coder"], "reflector": ["reflector"]},
}


def _groups(tmp_path, topology: str, sharing: str) -> dict:
    """policy -> its roles, as the run builds the cell's policy map from the workflow's own maps."""
    from harness.workflows import build_workflow

    cfg = cell(tmp_path, f"topology={topology}", f"task={'code-synth' if topology == 'reflective_code' else 'qa-synth'}",
               f"sharing={sharing}")
    workflow = build_workflow(cfg)
    policy_map = PolicyMap.from_config(cfg, workflow.role_instances(), workflow.sharing_maps())
    return {p: sorted({r for r, _ in policy_map.members(p)}) for p in policy_map.policies}


@pytest.mark.parametrize("topology", sorted(PAPER))
def test_paper_sharing_maps_each_unitymas_workflow_as_its_paper_does(tmp_path, topology):
    assert _groups(tmp_path, topology, "paper") == PAPER[topology]


def test_partial_sharing_keeps_its_groups_and_paper_needs_a_graph_that_declares_it(tmp_path):
    assert _groups(tmp_path, "mask_search", "partial") == {"knowledge": ["summarizer", "updater"],
                                                           "search_behaviour": ["answerer", "planner", "searcher"]}
    with pytest.raises(ConfigError, match="sharing=paper needs a workflow graph that declares its paper: groups; "
                                          "topology voting declares none"):
        cell(tmp_path, "topology=voting", "sharing=paper")
