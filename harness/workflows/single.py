"""One agent answers: the single-agent RL baseline."""
from __future__ import annotations

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow


class Single(Workflow):
    name = "single"

    def roles(self):
        return [RoleSpec("solver", "answer")]

    async def episode(self, problem, agents: Agents) -> Episode:
        answer = await agents.ask("solver", 0, question=problem.question)
        grade = self.mark_answer(answer, problem)
        return Episode(problem, agents.turns, answer.text, grade)
