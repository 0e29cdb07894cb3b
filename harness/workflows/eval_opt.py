"""Evaluator-optimizer: the generator drafts, the evaluator says ACCEPT or REVISE with feedback,
the generator revises; at most `max_iterations` drafts, each judged once."""
from __future__ import annotations

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow
from harness.workflows.contracts import ACCEPT, parse_verdict


class EvalOpt(Workflow):
    name = "eval_opt"

    def roles(self):
        return [RoleSpec("generator", "answer"), RoleSpec("evaluator", "verdict")]

    async def episode(self, problem, agents: Agents) -> Episode:
        question = problem.question
        draft = await agents.ask("generator", 0, question=question)
        vocabulary = getattr(self.task, "feedback_vocabulary", lambda: [])()
        for iteration in range(self.cfg.max_iterations):
            draft_correct = self.mark_answer(draft, problem).correct
            judgement = await agents.ask("evaluator", 0, question=question, draft=self.answer_of(draft),
                                         draft_text=draft.text.strip())
            verdict = parse_verdict(judgement.text, vocabulary, self.style.tolerant, self.style.unparsed_verdict)
            judgement.malformed, judgement.fallback = verdict.malformed, verdict.fallback
            # a verdict read from reasoning still judged; the tiny contract also wants its feedback vocabulary
            judged = not verdict.fallback and (self.style.tolerant or not verdict.malformed)
            judgement.role_correct = judged and ((verdict.verdict == ACCEPT) == draft_correct)
            if verdict.verdict == ACCEPT or iteration == self.cfg.max_iterations - 1:
                break
            draft = await agents.ask("generator", 0, "generator_revise", question=question,
                                     draft=self.answer_of(draft), draft_text=draft.text.strip(),
                                     feedback=verdict.feedback or "none")
        grade = self.task.grade(problem, draft.text)
        return Episode(problem, agents.turns, draft.text, grade)
