"""Voting: n voters answer independently, the aggregator picks one candidate by index."""
from __future__ import annotations

from asyncio import gather

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow


class Voting(Workflow):
    name = "voting"

    def roles(self):
        return [RoleSpec("voter", "answer", self.cfg.n_votes, trajectory="instance"), RoleSpec("aggregator", "index")]

    async def episode(self, problem, agents: Agents) -> Episode:
        n = self.cfg.n_votes
        votes = await gather(*(agents.ask("voter", i, question=problem.question) for i in range(n)))
        for vote in votes:
            self.mark_answer(vote, problem)
        candidates = "\n".join(f"{i}: {self.answer_of(v)}" for i, v in enumerate(votes))
        pick = await agents.ask("aggregator", 0, question=problem.question, candidates=candidates,
                                solutions=self.numbered(votes))
        final = votes[self.mark_pick(pick, votes)].text
        return Episode(problem, agents.turns, final, self.task.grade(problem, final))
