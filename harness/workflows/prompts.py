"""Prompt sets, one per model family, and the output contracts each set asks for.

`tiny`: the short templates the tiny CPU model learns in its warm-up (harness/config.py's
DEFAULT_PROMPTS); its contracts are exact (`ACCEPT`, `REVISE: <feedback>`, a bare 0-based index,
subtasks split by `;`), parsed strictly, and a malformed turn falls back as it always has.
`qwen3`: the SP/IP study's wording for real checkpoints (math and code), each role told its
output format: a `\\boxed{}` answer or a fenced program, a verdict `\\boxed{Correct}` /
`\\boxed{Incorrect}` on the solution above (Eval-Opt's evaluator and reviser follow the shared chat,
harness/chat.py), a selection `\\boxed{N}` over solutions numbered from 1, a plan of `STRATEGY k:` lines.
Its prompts reach the model as the study renders them (Qwen's system message, thinking off).
Verdicts and selections are read as the study reads them (workflow.parse=study: the first box) or, tolerant, as the last well-formed statement anywhere;
format compliance is measured against the exact instruction (harness/workflows/contracts.py).

`workflow.prompt_set=auto` takes `tiny` on tiny scales and `qwen3` on Qwen3 scales; templates a
cell overrides (`workflow.prompts.<name>=...`) win over the set's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from harness.config import DEFAULT_PROMPTS, ConfigError

PROMPT_SETS = ("tiny", "qwen3")


@dataclass(frozen=True)
class ContractStyle:
    tolerant: bool  # parse the last well-formed statement anywhere (real models) or the exact reply (tiny)
    index_base: int  # how the aggregator's candidates are numbered
    unparsed_verdict: str  # what an unreadable verdict means: ACCEPT (tiny: ends the loop) or REVISE (the study)
    chat: str = "template"  # how prompts reach the model (harness/chat.py): one templated message, or the study's chat


STYLES: Dict[str, ContractStyle] = {
    "tiny": ContractStyle(tolerant=False, index_base=0, unparsed_verdict="ACCEPT"),
    "qwen3": ContractStyle(tolerant=True, index_base=1, unparsed_verdict="REVISE", chat="study"),
}

_MATH_SOLVE = ("You are a math problem solver. Your task is to solve the given mathematical problem step by step. "
               "You must provide the final answer in \\boxed{{}} format.\n\nProblem: {question}")
_CODE_SOLVE = ("You are an expert competitive programmer. Solve the following programming problem.\n\n"
               "Problem:\n{question}\n\nRequirements:\n- Write clean, efficient Python code\n- Handle all edge cases\n"
               "- Your solution must be complete and runnable\n- Output your code in a markdown code block with ```python\n\n"
               "Provide your solution:")

QWEN3_MATH: Dict[str, str] = {
    "solver": _MATH_SOLVE,
    "generator": _MATH_SOLVE,
    "voter": _MATH_SOLVE,
    # Eval-Opt's reviser and evaluator follow the conversation (harness/chat.py), as upstream's
    # examples/math_reasoning/prompt.json evaluator_optimizer_prompts, used unformatted
    # (evaluator_optimizer_math_workflow.py:128-165): the reviser's `\\boxed{{}}` reaches the model as written
    "generator_revise": (
        "You are a math problem solver creating a new solution based on the teacher's feedback above. Your task is "
        "to solve the problem using a completely different approach.\n\nImportant instructions:\n- You must provide "
        "the final answer in \\boxed{{{{}}}} format\n- Use a DIFFERENT method than your previous attempt\n"
        "- Address the issues identified in the teacher's feedback"),
    "evaluator": (
        "You are reviewing the solution above. Your task is to analyze it for correctness.\n\nImportant instructions:\n"
        "- Provide your verdict as \\boxed{{Correct}} or \\boxed{{Incorrect}}\n- If incorrect, briefly explain the "
        "main issue\n- Do not reveal the correct answer in your response"),
    "aggregator": (
        "You are an expert math reviewer. Your task is to review multiple solutions to the same problem and select "
        "the best one.\n\nProblem: {question}\n\nSolutions to review:{solutions}\n\nInstructions:\n"
        "1. Analyze each solution for correctness and completeness\n2. Check the mathematical reasoning and final answer\n"
        "3. Select the solution number that is most likely correct\n"
        "4. Output your selection as \\boxed{{N}} where N is the solution number (1, 2, 3, etc.)\n\nYour selection:"),
    "orchestrator": (
        "You are a math problem-solving strategist. Your task is to propose at most {max_subtasks} DIFFERENT "
        "solution strategies for the following math problem. Each strategy should represent a distinct "
        "mathematical approach.\n\nProblem: {question}\n\nInstructions:\n"
        "1. Think about different mathematical techniques that could solve this problem\n"
        "2. Propose at most {max_subtasks} distinct approaches (e.g., algebraic manipulation, coordinate "
        "geometry, trigonometric identities, combinatorial argument, etc.)\n"
        "3. Each strategy should be a brief description of the approach, NOT a solution\n"
        "4. Do NOT solve the problem — only describe the approaches\n5. Format your response as:\n"
        "   STRATEGY 1: [description of first approach]\n   STRATEGY 2: [description of second approach]\n"
        "   (and so on, up to {max_subtasks} strategies maximum)\n\nPropose strategies now:"),
    "worker": (
        "You are a math problem solver. Solve the following problem using the specified strategy.\n\n"
        "Problem: {question}\n\nAssigned strategy: {subtask}\n\nInstructions:\n"
        "1. Follow the assigned strategy as your primary approach\n2. Solve the COMPLETE problem step by step\n"
        "3. Show your work clearly\n4. Provide the final answer in \\boxed{{}} format\n\nSolve the problem:"),
    "synthesizer": (
        "You are a math problem-solving judge. Multiple solvers have each attempted to solve the same problem using "
        "different strategies. Compare their complete solutions and determine the correct answer.\n\n"
        "Original problem: {question}\n\nComplete solutions:{solutions}\n\nInstructions:\n"
        "1. Read each complete solution carefully\n2. Check the mathematical reasoning in each solution\n"
        "3. Identify which solutions arrive at the same answer (agreement = higher confidence)\n"
        "4. If solutions disagree, determine which reasoning is correct\n"
        "5. Provide the final answer in \\boxed{{}} format\n\nYour judgment:"),
}

QWEN3_CODE: Dict[str, str] = {
    "solver": _CODE_SOLVE,
    "generator": _CODE_SOLVE,
    "voter": _CODE_SOLVE,
    # examples/deepcoder/prompt.json deepcoder_evaluator_optimizer_prompts, after the conversation
    "generator_revise": (
        "Based on the reviewer's feedback above, please create an improved solution.\n\nRequirements:\n"
        "- Address the issues identified in the review\n- Use a different approach if the previous logic was "
        "fundamentally flawed\n- Ensure all edge cases are handled\n- Output your code in a markdown code block with "
        "```python\n\nProvide your improved solution:"),
    "evaluator": (
        "You are a code reviewer evaluating the solution above for correctness.\n\nYour task is to analyze the code "
        "for:\n1. Logical correctness - Does the algorithm solve the problem?\n"
        "2. Edge case handling - Are boundary conditions handled?\n3. Implementation bugs - Are there any coding "
        "errors?\n4. Efficiency - Is the solution efficient enough for the constraints?\n\nIMPORTANT:\n"
        "- You are reviewing the code LOGIC, not running tests\n- Provide your verdict as \\boxed{{Correct}} or "
        "\\boxed{{Incorrect}}\n- If incorrect, briefly explain the main issue(s)\n- Do NOT reveal the correct solution"),
    "aggregator": (
        "You are an expert code reviewer. Your task is to review multiple code solutions to the same problem and "
        "select the best one.\n\nProblem:\n{question}\n\nSolutions to review:{solutions}\n\nInstructions:\n"
        "1. Analyze each solution for logical correctness\n2. Check for proper edge case handling\n"
        "3. Look for potential bugs or errors\n4. Consider code efficiency and readability\n"
        "5. Select the solution number most likely to pass all tests\n"
        "6. Output your selection as \\boxed{{N}} where N is the solution number (1, 2, 3, etc.)\n\nYour selection:"),
    "orchestrator": (
        "You are an expert programming strategist. Your task is to propose at most {max_subtasks} DIFFERENT "
        "solution strategies for the following programming problem. Each strategy should represent a "
        "distinct algorithmic approach.\n\nProblem:\n{question}\n\nInstructions:\n"
        "1. Think about different algorithmic techniques that could solve this problem\n"
        "2. Propose at most {max_subtasks} distinct approaches (e.g., greedy, dynamic programming, brute "
        "force with pruning, divide and conquer, etc.)\n"
        "3. Each strategy should be a brief description of the approach, NOT a solution\n"
        "4. Do NOT solve the problem — only describe the approaches\n5. Format your response as:\n"
        "   STRATEGY 1: [description of first approach]\n   STRATEGY 2: [description of second approach]\n"
        "   (and so on, up to {max_subtasks} strategies maximum)\n\nPropose strategies now:"),
    "worker": (
        "You are an expert competitive programmer. Solve the following problem using the specified strategy.\n\n"
        "Problem:\n{question}\n\nAssigned strategy: {subtask}\n\nInstructions:\n"
        "1. Follow the assigned strategy as your primary approach\n2. Solve the COMPLETE problem step by step\n"
        "3. Write clean, efficient Python code\n4. Handle all edge cases\n"
        "5. Output your code in a markdown code block with ```python\n\nProvide your solution:"),
    "synthesizer": (
        "You are an expert code reviewer and judge. Multiple programmers have each attempted to solve the "
        "same problem using different strategies. Compare their complete solutions and determine the best one.\n\n"
        "Original problem:\n{question}\n\nComplete solutions:{solutions}\n\nInstructions:\n"
        "1. Read each complete solution carefully\n2. Check the algorithmic correctness of each solution\n"
        "3. Consider edge case handling and efficiency\n4. Identify which solutions are most likely correct\n"
        "5. Output the best solution as a complete, runnable Python program in a markdown code block with ```python\n"
        "\nYour judgment:"),
}

TEMPLATES: Dict[str, Dict[str, Dict[str, str]]] = {
    "tiny": {"math": DEFAULT_PROMPTS, "code": DEFAULT_PROMPTS},
    "qwen3": {"math": QWEN3_MATH, "code": QWEN3_CODE},
}


def family_of(scale: str) -> str:
    """The prompt set `auto` means for a scale: Qwen3 checkpoints (and the Qwen3-tokenizer test
    scale) get the study's prompts, tiny models the ones they were warmed up on."""
    return "qwen3" if scale.startswith("qwen3") else "tiny"


def apply_prompt_set(workflow_cfg, scale: str, task_kind: str) -> None:
    """Resolve `workflow.prompt_set` (auto -> the scale's family) and put that set's template in
    place of every template the cell left at the tiny default, so cell.yaml records the prompts
    the run used."""
    if workflow_cfg.prompt_set == "auto":
        workflow_cfg.prompt_set = family_of(scale)
    if workflow_cfg.prompt_set not in PROMPT_SETS:
        raise ConfigError(f"unknown prompt set (workflow.prompt_set) '{workflow_cfg.prompt_set}'; "
                          f"valid choices: auto, {', '.join(PROMPT_SETS)}")
    chosen = TEMPLATES[workflow_cfg.prompt_set].get(task_kind, TEMPLATES[workflow_cfg.prompt_set]["math"])
    prompts = dict(workflow_cfg.prompts)
    for name, template in chosen.items():
        if prompts.get(name, DEFAULT_PROMPTS[name]) == DEFAULT_PROMPTS[name]:
            prompts[name] = template
    workflow_cfg.prompts = prompts


def style_of(workflow_cfg) -> ContractStyle:
    """The contract style of a cell's resolved prompt set (`auto` left unresolved reads as tiny)."""
    return STYLES.get(workflow_cfg.prompt_set, STYLES["tiny"])


def resolve_prompts(overrides: Dict[str, str]) -> Dict[str, str]:
    """The built-in topologies' templates as the cell sets them (what the warm-up demonstrates for
    them); a graph's own template names are cell_prompts' (validate() has checked every name)."""
    return {**DEFAULT_PROMPTS, **{k: v for k, v in overrides.items() if k in DEFAULT_PROMPTS}}


def overridden(workflow_cfg) -> Dict[str, str]:
    """The cell's `workflow.prompts.<name>=...` that its prompt set does not give: values a user set.
    (A cell holds every built-in template, so presence alone does not tell an override.)"""
    sets = [DEFAULT_PROMPTS, *TEMPLATES.get(workflow_cfg.prompt_set, {}).values()]
    return {name: text for name, text in dict(workflow_cfg.prompts).items()
            if all(text != templates.get(name) for templates in sets)}


def cell_prompts(workflow_cfg, own: Dict[str, str]) -> Dict[str, str]:
    """The templates a cell's turns render: the built-in ones (its prompt set), the workflow's own
    over them (a graph's `prompts:`), the cell's overrides over both. So a graph's template of a
    built-in name (`voter`) is not lost to the cell's default, and `workflow.prompts.<name>=...`
    reaches a graph's template as it reaches a built-in one."""
    return {**resolve_prompts(dict(workflow_cfg.prompts)), **own, **overridden(workflow_cfg)}


__all__ = ["DEFAULT_PROMPTS", "PROMPT_SETS", "STYLES", "ContractStyle", "apply_prompt_set", "cell_prompts",
           "family_of", "overridden", "resolve_prompts", "style_of"]
