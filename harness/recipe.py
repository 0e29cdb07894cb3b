"""A cell's recipe: its parts built once from its config and handed down. The run, the warm-up and the
controller receive it instead of each rebuilding the task, the workflow, the policy map or the prompts
from the config (each rebuild was one more place to disagree)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Dict, List, Optional

from harness.config import CellConfig
from harness.monitors.roles import contracts_of
from harness.sharing import PolicyMap
from harness.tasks import Task, build_task
from harness.workflows import Workflow, build_workflow
from harness.workflows.prompts import cell_prompts


@dataclass
class CellRecipe:
    """What a cell is made of: `task` (None when built for a config check alone: roles are known without
    data), the `workflow`, which `policy_map` trains each role, and the base model's directory once asked
    for (`model_dir`: a tiny model is warmed on first use, then cached)."""

    cfg: CellConfig
    task: Optional[Task]
    workflow: Workflow
    policy_map: PolicyMap
    _model_dir: Optional[Path] = field(default=None, repr=False)

    @classmethod
    def build(cls, cfg: CellConfig, with_task: bool = True) -> "CellRecipe":
        task = build_task(cfg) if with_task else None
        workflow = build_workflow(cfg, task)
        return cls(cfg, task, workflow, PolicyMap.from_config(cfg, workflow.role_instances(), workflow.sharing_maps()))

    @cached_property
    def prompts(self) -> Dict[str, str]:
        """Each prompt name's template: the workflow's, the prompt set's, the cell's overrides."""
        return cell_prompts(self.cfg.workflow, self.workflow.templates())

    @cached_property
    def role_contracts(self) -> Dict[str, str]:
        """role -> its output contract (what the monitors judge it by)."""
        return contracts_of(self.workflow)

    @cached_property
    def role_policies(self) -> Dict[str, List[str]]:
        """role -> the policies its instances train (one under SP or IP; several where instances split)."""
        return {role.name: sorted({self.policy_map.policy_of(role.name, i) for i in range(role.instances)})
                for role in self.workflow.roles()}

    def model_dir(self, log=print) -> Path:
        """The base model's directory (built and warmed on first use if tiny), the same on every call."""
        if self._model_dir is None:
            from harness.warmup import prepare_model

            self._model_dir = prepare_model(self.cfg, self.task, log=log, workflow=self.workflow)
        return self._model_dir
