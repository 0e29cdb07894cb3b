"""Workflow registry: `topology=<name>` picks one."""
from __future__ import annotations

from typing import Dict, Type

from harness.workflows.base import Agents, Episode, Generation, RoleSpec, Sampling, Scheduler, Turn, Workflow
from harness.workflows.eval_opt import EvalOpt
from harness.workflows.orch_workers import OrchWorkers
from harness.workflows.single import Single
from harness.workflows.voting import Voting

WORKFLOWS: Dict[str, Type[Workflow]] = {w.name: w for w in (Single, EvalOpt, Voting, OrchWorkers)}


def build_workflow(cfg, task=None) -> Workflow:
    """The cell's workflow; without a task (validation only) roles are still known."""
    from harness.workflows.graph import GraphWorkflow, graph_source, is_graph_topology, load_graph

    if is_graph_topology(cfg.topology):
        source = graph_source(cfg.topology)
        if isinstance(source, type):  # a user's own Workflow class
            return source(task, cfg.workflow)
        return GraphWorkflow(task, cfg.workflow, load_graph(source))
    if cfg.topology not in WORKFLOWS:
        raise ValueError(f"unknown topology '{cfg.topology}'; valid choices: {', '.join(WORKFLOWS)}, "
                         f"graph:<name> or a workflow graph's YAML file")
    return WORKFLOWS[cfg.topology](task, cfg.workflow)


__all__ = ["Agents", "Episode", "Generation", "RoleSpec", "Sampling", "Scheduler", "Turn", "Workflow",
           "WORKFLOWS", "build_workflow"]
