"""Orchestrator-workers: the orchestrator splits the problem into at most `max_subtasks`
subtasks, one worker solves each, the synthesizer composes the final answer."""
from __future__ import annotations

from asyncio import gather

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow


class OrchWorkers(Workflow):
    name = "orch_workers"

    def roles(self):
        return [RoleSpec("orchestrator", "subtasks"), RoleSpec("worker", "answer", self.cfg.max_subtasks),
                RoleSpec("synthesizer", "answer")]

    async def episode(self, problem, agents: Agents) -> Episode:
        plan = await agents.ask("orchestrator", 0, question=problem.question, max_subtasks=str(self.cfg.max_subtasks))
        subtasks = self.mark_plan(plan, problem)
        results = await gather(*(agents.ask("worker", i, subtask=s, question=problem.question)
                                 for i, s in enumerate(subtasks)))
        for subtask, result in zip(subtasks, results):
            self.mark_worker(result, problem, subtask)
        synthesis = await agents.ask("synthesizer", 0, question=problem.question,
                                     results="; ".join(self.answer_of(r) for r in results),
                                     solutions=self.numbered(results, subtasks))
        grade = self.mark_answer(synthesis, problem)
        return Episode(problem, agents.turns, synthesis.text, grade)
