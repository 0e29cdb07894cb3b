"""Which roles the monitors watch, found by what a role's contract is rather than by its name.

A judging role answers with a short, fixed form: a verdict (Eval-Opt's evaluator), an index
(Voting's aggregator), a plan (the orchestrator, a decomposer), a search action (`SEARCH: <query>`
or `STOP`: M-ASK's planner and searcher). Such a role growing its replies, or
being paid to, is the early sign of role capture; an answer role (generator, voter, worker, coder)
lengthening its reasoning is not. Found from the workflow's RoleSpecs, so every study topology, every
UnityMAS-O graph and a user's own graph is covered; a setting may still name roles explicitly.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence

JUDGING_CONTRACTS = ("verdict", "index", "subtasks", "search")
# runs logged before status.json recorded each role's contract named their judging roles
LEGACY_CONTRACTS = {"aggregator": "index", "evaluator": "verdict", "orchestrator": "subtasks"}


def contracts_of(workflow) -> Dict[str, str]:
    """role -> its contract, from the workflow's RoleSpecs."""
    return {role.name: role.contract for role in workflow.roles()}


def judging_roles(role_contracts: Optional[Mapping[str, str]], explicit: Sequence[str] = (),
                  contracts: Iterable[str] = JUDGING_CONTRACTS) -> List[str]:
    """The roles a monitor setting watches: those it names, else every role whose contract is one of
    `contracts`. Without a contract map (an old run's log) the judging roles of the study topologies."""
    if explicit:
        return sorted(explicit)
    known = dict(role_contracts) if role_contracts else LEGACY_CONTRACTS
    wanted = set(contracts)
    return sorted(role for role, contract in known.items() if contract in wanted)


def unknown_roles(named: Iterable[str], role_contracts: Mapping[str, str]) -> List[str]:
    """Names a setting gives that are not roles of the cell's workflow."""
    return sorted(set(named) - set(role_contracts))
