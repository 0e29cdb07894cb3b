"""Orchestrator-workers: the orchestrator splits the problem into at most `max_subtasks`
subtasks, one worker solves each, the synthesizer composes the final answer."""
from __future__ import annotations

from asyncio import gather

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow
from harness.workflows.contracts import parse_subtasks


class OrchWorkers(Workflow):
    name = "orch_workers"

    def roles(self):
        return [RoleSpec("orchestrator", "subtasks"), RoleSpec("worker", "answer", self.cfg.max_subtasks),
                RoleSpec("synthesizer", "answer")]

    async def episode(self, problem, agents: Agents) -> Episode:
        plan = await agents.ask("orchestrator", 0, question=problem.question, max_subtasks=str(self.cfg.max_subtasks))
        subtasks, plan.malformed, plan.fallback = parse_subtasks(plan.text, self.cfg.max_subtasks, problem.question,
                                                                 self.style.tolerant)
        plan.role_correct = self.task.check_plan(problem, subtasks)
        results = await gather(*(agents.ask("worker", i, subtask=s, question=problem.question)
                                 for i, s in enumerate(subtasks)))
        for subtask, result in zip(subtasks, results):
            self.mark_format(result, self.task.extract_answer(result.text))
            # tiny: a worker solves its part; the study's workers solve the whole problem their own way
            result.role_correct = (self.task.grade(problem, result.text).correct if self.style.tolerant
                                   else self.task.grade_subtask(subtask, result.text))
        synthesis = await agents.ask("synthesizer", 0, question=problem.question,
                                     results="; ".join(self.answer_of(r) for r in results),
                                     solutions=self.numbered(results, subtasks))
        grade = self.mark_answer(synthesis, problem)
        return Episode(problem, agents.turns, synthesis.text, grade)
