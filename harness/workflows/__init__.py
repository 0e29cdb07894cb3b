"""`topology=<name>` -> the cell's workflow. The study's topologies (single, eval_opt, voting, orch_workers)
and UnityMAS-O's A-D are graphs (graphs/*.yaml); a YAML path, `graph:<name>`, or `package.module:NAME` (a
graph dict or a Workflow class: program_example.py shows one) name others."""
from __future__ import annotations

from functools import lru_cache

from harness.workflows.base import Agents, Episode, Generation, RoleSpec, Sampling, Scheduler, Turn, Workflow


@lru_cache(maxsize=None)
def _study_graph(topology: str):
    """A study topology's graph, parsed once per process (a sweep's check builds thousands of workflows)."""
    from harness.workflows.graph import graph_source, load_graph

    return load_graph(graph_source(f"graph:{topology}"))


def build_workflow(cfg, task=None) -> Workflow:
    """The cell's workflow; without a task (validation only) roles are still known."""
    from harness.config import TOPOLOGIES
    from harness.workflows.graph import GraphWorkflow, graph_source, is_graph_topology, load_graph

    if cfg.topology in TOPOLOGIES:
        return GraphWorkflow(task, cfg.workflow, _study_graph(cfg.topology))
    if is_graph_topology(cfg.topology):
        source = graph_source(cfg.topology)
        if isinstance(source, type):  # a user's own Workflow class
            return source(task, cfg.workflow)
        return GraphWorkflow(task, cfg.workflow, load_graph(source))
    raise ValueError(f"unknown topology '{cfg.topology}'; valid choices: {', '.join(TOPOLOGIES)}, "
                     f"graph:<name> or a workflow graph's YAML file")


__all__ = ["Agents", "Episode", "Generation", "RoleSpec", "Sampling", "Scheduler", "Turn", "Workflow",
           "build_workflow"]
