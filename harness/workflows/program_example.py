"""A workflow written as a Python program: the extension point for what a graph (graphs/*.yaml) cannot
express. This one is the evaluator-optimizer, `topology=eval_opt`'s graph written out (the generator
drafts, the evaluator says ACCEPT or REVISE with feedback, the generator revises; at most
`max_iterations` drafts, each judged once); a test keeps their episodes equal. Run it with
`topology=harness.workflows.program_example:EvalOptProgram`."""
from __future__ import annotations

from harness.workflows.base import Agents, Episode, RoleSpec, Workflow
from harness.workflows.contracts import ACCEPT


class EvalOptProgram(Workflow):
    name = "eval_opt"

    def roles(self):
        return [RoleSpec("generator", "answer"), RoleSpec("evaluator", "verdict")]

    async def episode(self, problem, agents: Agents) -> Episode:
        question = problem.question
        # conversation: the three calls share one chat under the qwen3 prompts, as the study's Eval-Opt
        draft = await agents.ask("generator", 0, conversation=True, question=question)
        for iteration in range(self.cfg.max_iterations):
            draft_correct = self.mark_answer(draft, problem).correct
            judgement = await agents.ask("evaluator", 0, conversation=True, question=question,
                                         draft=self.answer_of(draft), draft_text=draft.text.strip())
            verdict = self.mark_verdict(judgement, draft_correct)
            if verdict.verdict == ACCEPT or iteration == self.cfg.max_iterations - 1:
                break
            draft = await agents.ask("generator", 0, "generator_revise", conversation=True, question=question,
                                     draft=self.answer_of(draft), draft_text=draft.text.strip(),
                                     feedback=verdict.feedback or "none")
        grade = self.task.grade(problem, draft.text)
        return Episode(problem, agents.turns, draft.text, grade)
