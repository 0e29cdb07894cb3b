"""Voting: n voters answer independently, the aggregator picks one candidate by index."""
from __future__ import annotations

from asyncio import gather

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow
from harness.workflows.contracts import parse_index


class Voting(Workflow):
    name = "voting"

    def roles(self):
        return [RoleSpec("voter", "answer", self.cfg.n_votes), RoleSpec("aggregator", "index")]

    async def episode(self, problem, agents: Agents) -> Episode:
        n = self.cfg.n_votes
        votes = await gather(*(agents.ask("voter", i, question=problem.question) for i in range(n)))
        correct = [self.mark_answer(v, problem).correct for v in votes]
        answers = [self.answer_of(v) for v in votes]
        candidates = "\n".join(f"{i}: {a}" for i, a in enumerate(answers))
        pick = await agents.ask("aggregator", 0, question=problem.question, candidates=candidates,
                                solutions=self.numbered(votes))
        pick.stats["distinct_candidates"] = float(len(set(answers)))  # 1: the aggregator's pick cannot matter
        index, pick.malformed, pick.fallback = parse_index(pick.text, n, self.style.tolerant, self.style.index_base)
        pick.role_correct = (not pick.fallback) and correct[index]
        final = votes[index].text
        return Episode(problem, agents.turns, final, self.task.grade(problem, final))
