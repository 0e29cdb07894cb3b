"""Workflows as graphs (UnityMAS-O's G = (V, E)), written in YAML or as a dict, compiled to the same
async episode program the scheduler batches.

A graph names its roles (each with an output contract and an instance count) and its nodes; a
node is one LLM role call, several calls of one role at once, or a tool (a Python callable).
Execution starts at the first node and, after each node, follows the first outgoing edge whose
condition holds (`when: <node>.<field>`, true when the field is; or `<node>.<field> != <text>`
and `== <text>`, comparing its text, e.g. a tool's 'pass') and that has not fired `max_rounds` times
yet; it ends where no edge fires. A cycle must pass through an edge with `max_rounds`, so every loop
is bounded.

    name: vote3
    roles: {voter: {contract: answer, instances: 3}, aggregator: {contract: index}}
    nodes:
      votes: {role: voter, fan_out: 3, inputs: {question: question}}
      pick:  {role: aggregator, over: votes,
              inputs: {question: question, candidates: votes.candidates, solutions: votes.solutions}}
    edges: [[votes, pick]]
    final: pick

Nodes by their role's contract, and the state fields they write (read as `<node>.<field>`):
- answer: `text` (the reply, stripped), `answer` (what the task extracts, '?' when none), `correct`; with `fan_out: n`
  (n instances at once; a number or `workflow.<field>`) or `for_each: <node>.items` (one instance
  per item, the item bound as `item`): `candidates` ('0: 12' lines), `solutions` (full replies
  numbered as the prompt set numbers them), `results` (the answers joined by '; '). `grade:
  problem` (default: graded against the problem) or `item` (a worker's part, as orch_workers).
- index (`over: <answer node with several replies>`): picks one; `chosen` (its text), `index`.
- verdict (`judges: <answer node>`): `accept`, `revise` (booleans for edge conditions), `feedback`.
- subtasks: `items` (at most `workflow.max_subtasks`).
- search (`SEARCH: <query>` or `STOP`): `search`, `stop` (booleans for edges), `query`, `text`.
- text (free text: evidence, notes, a plan): `text`, `correct`. Search and text nodes may name a
  `check:` that the task judges the reply by (Task.check_text: the role's own accuracy).
- tool (`tool: package.module:function`, no role; `params:` literal keyword arguments besides the
  inputs; inputs may also be `task` and `problem`, the objects): `value` (and `text`), the
  callable's return, e.g. `harness.tasks.qa:search`; with `for_each: <node>.items` one call per
  item (parallel retrieval per sub-query), `text` their results joined by newlines.
A graph may define its own templates under `prompts:` (name -> text with `{field}`s), and per
prompt set under `prompt_sets: {qwen3: {...}}` (real models' wording over the tiny one); a cell's
`workflow.prompts.<name>=...` overrides them (harness/workflows/prompts.py cell_prompts). A role
may say it needs at least `max_new_tokens`; `partial: {policy: [roles]}` is what `sharing=partial`
means for the graph, `paper: {policy: [roles]}` what `sharing=paper` means (UnityMAS-O's paper's mapping); `count: {metric: node}` logs how often a node ran per episode
(`episode/<metric>`, e.g. a loop's rounds); `rewards: {role: {node: 0.5}}` are the graph's default
reward weights per role (a cell's reward.per_role wins). `conversation: [nodes]` (single calls) share
one chat under a prompt set that renders chats (qwen3, as the study's Eval-Opt): each sees the first's
prompt and every earlier reply before its own prompt; one-message prompt sets (tiny) ignore it.
`chat: template` renders a chat-rendering prompt set's prompts with the tokenizer's own template
instead of the study's framing (harness/chat.py): UnityMAS-O's workflows, as its trainer renders them.
Inputs map a prompt field to `question`, `item`, `workflow.<field>` or `<node>.<field>`, the
last with a default while the node has not run (`"update.text ?? none"`: a loop's first round); a node
may `writes: <other node>` to replace that node's result (a revision replaces the draft); `prompt`
names its template (default: the role's). `final` is the node whose text is the episode's answer.
Load-time checks (unknown role or node, a cycle without a bound, an unreachable node, a field no
node writes) raise one ConfigError naming what is wrong.
"""
from __future__ import annotations

import re
from asyncio import gather
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from harness.chat import CHATS
from harness.config import GRAPH_FILE_SUFFIXES, GRAPH_SHARING_MODES, REWARD_TERMS, ConfigError
from harness.episodes import PromptTooLong
from harness.imports import import_object
from harness.workflows.base import Agents, Episode, RoleSpec, Turn, Workflow
from harness.workflows.contracts import ACCEPT

CONTRACTS = ("answer", "index", "verdict", "subtasks", "search", "text")
FIELDS = {
    "answer": ("text", "answer", "correct"),
    "answers": ("candidates", "solutions", "results"),
    "index": ("chosen", "index"),
    "verdict": ("accept", "revise", "feedback"),
    "subtasks": ("items",),
    "search": ("search", "stop", "query", "text"),
    "text": ("text", "correct"),
    "tool": ("value", "text", "answer"),
}
NODE_KEYS = {"role", "prompt", "inputs", "fan_out", "for_each", "over", "judges", "writes", "grade", "tool", "params",
             "check"}
ROLE_KEYS = {"contract", "instances", "max_new_tokens"}
OBJECT_INPUTS = ("task", "problem")  # a tool node's inputs may be the cell's Task or the episode's Problem


class GraphError(ConfigError):
    """A graph that cannot run; the message names the node or field."""


@dataclass(frozen=True)
class NodeSpec:
    id: str
    role: Optional[str]
    kind: str  # answer | answers | index | verdict | subtasks | tool
    prompt: Optional[str] = None
    inputs: Dict[str, str] = field(default_factory=dict)
    fan_out: Any = None
    for_each: Optional[str] = None
    over: Optional[str] = None
    judges: Optional[str] = None
    writes: Optional[str] = None
    grade: str = "problem"
    tool: Optional[str] = None
    params: Dict[str, Any] = field(default_factory=dict)  # a tool's literal keyword arguments
    check: Optional[str] = None  # search/text roles: what the task checks of the reply (Task.check_text)


@dataclass(frozen=True)
class EdgeSpec:
    source: str
    target: str
    when: Optional[str] = None  # "<node>.<boolean field>", or "<node>.<field> == <text>" / "!= <text>"
    max_rounds: Optional[int] = None


@dataclass(frozen=True)
class GraphSpec:
    name: str
    roles: Dict[str, Tuple[str, Any]]  # role -> (contract, instances: int or "workflow.<field>")
    nodes: Dict[str, NodeSpec]
    edges: List[EdgeSpec]
    final: str
    prompts: Dict[str, str] = field(default_factory=dict)  # the graph's own templates, by name
    budgets: Dict[str, int] = field(default_factory=dict)  # role -> max_new_tokens the graph asks for
    sharing: Dict[str, Dict[str, List[str]]] = field(default_factory=dict)  # sharing=partial|paper: policy -> roles
    counts: Dict[str, str] = field(default_factory=dict)  # episode metric -> the node whose runs it counts
    prompt_sets: Dict[str, Dict[str, str]] = field(default_factory=dict)  # e.g. qwen3: templates for real models
    rewards: Dict[str, Dict[str, float]] = field(default_factory=dict)  # role -> reward term weights (defaults)
    conversation: Tuple[str, ...] = ()  # nodes that share the episode's chat (the study's chat only)
    chat: Optional[str] = None  # how a chat-rendering prompt set frames prompts here (default: the set's)


def read_graph(source) -> dict:
    """A graph's plain data from a YAML file (a path) or a dict."""
    if isinstance(source, dict):
        return source
    path = Path(source).expanduser()
    if not path.is_file():
        raise GraphError(f"workflow graph {source} does not exist")
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        from harness.yaml_errors import describe_yaml_error

        raise GraphError(f"workflow graph is not valid YAML: {describe_yaml_error(exc, str(source))}") from None
    if not isinstance(data, dict):
        raise GraphError(f"workflow graph {source} must be a mapping with roles, nodes, edges and final")
    data.setdefault("name", path.stem)
    return data


def parse_graph(data: dict) -> GraphSpec:
    """Check a graph's plain data and build its spec; GraphError on the first problem."""
    missing = [k for k in ("roles", "nodes", "final") if k not in data]
    if missing:
        raise GraphError(f"workflow graph {data.get('name', '?')} lacks {', '.join(missing)}")
    roles, budgets = {}, {}
    for name, role in (data["roles"] or {}).items():
        role = role or {}
        unknown = sorted(map(str, set(role) - ROLE_KEYS))
        if unknown:
            raise GraphError(f"role {name}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(ROLE_KEYS))}")
        contract = role.get("contract", "answer")
        if contract not in CONTRACTS:
            raise GraphError(f"role {name}: unknown contract '{contract}'; valid choices: {', '.join(CONTRACTS)}")
        roles[str(name)] = (contract, role.get("instances", 1))
        if "max_new_tokens" in role:
            budgets[str(name)] = int(role["max_new_tokens"])
    nodes: Dict[str, NodeSpec] = {}
    for node_id, raw in (data["nodes"] or {}).items():
        raw = dict(raw or {})
        unknown = sorted(map(str, set(raw) - NODE_KEYS))
        if unknown:
            raise GraphError(f"node {node_id}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(NODE_KEYS))}")
        nodes[str(node_id)] = _node(str(node_id), raw, roles)
    edges = []
    for edge in data.get("edges") or []:
        edge = list(edge)
        options = edge[2] if len(edge) > 2 else {}
        if len(edge) < 2 or not isinstance(options, dict):
            raise GraphError(f"edge {edge}: write [source, target] or [source, target, {{when: ..., max_rounds: ...}}]")
        edges.append(EdgeSpec(str(edge[0]), str(edge[1]), options.get("when"), options.get("max_rounds")))
    prompts = {str(k): str(v) for k, v in (data.get("prompts") or {}).items()}
    sharing = {mode: {str(k): [str(m) for m in v] for k, v in data[mode].items()}
               for mode in GRAPH_SHARING_MODES if data.get(mode)}
    counts = {str(k): str(v) for k, v in (data.get("count") or {}).items()}
    prompt_sets = {str(s): {str(k): str(v) for k, v in (t or {}).items()} for s, t in (data.get("prompt_sets") or {}).items()}
    rewards = {}
    for role, terms in (data.get("rewards") or {}).items():
        unknown = sorted(set(terms or {}) - set(REWARD_TERMS))
        if str(role) not in roles or unknown:
            raise GraphError(f"rewards: {role} must be a role of the graph with terms {', '.join(REWARD_TERMS)}"
                             + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
        rewards[str(role)] = {str(k): float(v) for k, v in (terms or {}).items()}
    conversation = tuple(str(n) for n in data.get("conversation") or ())
    chat = data.get("chat")
    if chat is not None and chat not in CHATS:
        raise GraphError(f"chat: unknown '{chat}'; valid choices: {', '.join(CHATS)}")
    spec = GraphSpec(str(data.get("name", "graph")), roles, nodes, edges, str(data["final"]), prompts, budgets,
                     sharing, counts, prompt_sets, rewards, conversation, chat)
    _check(spec)
    return spec


def _node(node_id: str, raw: dict, roles) -> NodeSpec:
    if "tool" in raw:
        return NodeSpec(node_id, None, "tool", inputs={str(k): str(v) for k, v in (raw.get("inputs") or {}).items()},
                        for_each=raw.get("for_each"), tool=str(raw["tool"]), params=dict(raw.get("params") or {}))
    role = raw.get("role")
    if role not in roles:
        raise GraphError(f"node {node_id}: unknown role '{role}'; the graph's roles: {', '.join(roles)}")
    kind = roles[role][0]
    if kind == "answer" and (raw.get("fan_out") is not None or raw.get("for_each")):
        kind = "answers"
    grade = raw.get("grade", "problem")
    if grade not in ("problem", "item"):
        raise GraphError(f"node {node_id}: grade must be problem or item, got '{grade}'")
    if raw.get("check") is not None and kind not in ("search", "text"):
        raise GraphError(f"node {node_id}: check: goes with a search or text role, not {kind}")
    return NodeSpec(node_id, str(role), kind, raw.get("prompt"), {str(k): str(v) for k, v in (raw.get("inputs") or {}).items()},
                    raw.get("fan_out"), raw.get("for_each"), raw.get("over"), raw.get("judges"), raw.get("writes"), grade,
                    check=raw.get("check"))


def _check(spec: GraphSpec) -> None:
    nodes = spec.nodes
    if not nodes:
        raise GraphError(f"workflow graph {spec.name} has no nodes")
    for edge in spec.edges:
        for end in (edge.source, edge.target):
            if end not in nodes:
                raise GraphError(f"edge {edge.source} -> {edge.target}: unknown node '{end}'")
        if edge.max_rounds is not None and not isinstance(edge.max_rounds, (int, str)):
            raise GraphError(f"edge {edge.source} -> {edge.target}: max_rounds is a number or workflow.<field>")
        if edge.when is not None:
            _field_ref(spec, parse_condition(edge.when)[0], f"edge {edge.source} -> {edge.target}")
    if spec.final not in nodes:
        raise GraphError(f"final names unknown node '{spec.final}'")
    for node in nodes.values():
        where = f"node {node.id}"
        for name, ref in node.inputs.items():
            ref = _default(ref)[0]
            if ref in OBJECT_INPUTS and node.kind != "tool":
                raise GraphError(f"{where}: input {name} reads '{ref}', which only a tool node takes (a prompt gets text)")
            if ref not in ("question", "item") + OBJECT_INPUTS and not ref.startswith("workflow."):
                _field_ref(spec, ref, where)
            if ref == "item" and not node.for_each:
                raise GraphError(f"{where}: input {name} reads 'item', which only a for_each node has")
        for attr, kinds in (("over", ("answers",)), ("judges", ("answer",)), ("writes", (node.kind,))):
            target = getattr(node, attr)
            if target is not None and (target not in nodes or nodes[target].kind not in kinds):
                raise GraphError(f"{where}: {attr} must name a node of kind {'/'.join(kinds)}, got '{target}'")
        if node.kind == "index" and node.over is None:
            raise GraphError(f"{where}: an index node picks among the replies of a fan-out node: add over: <node>")
        if node.kind == "verdict" and node.judges is None:
            raise GraphError(f"{where}: a verdict node judges an answer node: add judges: <node>")
        if node.for_each:
            _field_ref(spec, node.for_each, where)
    for mode, groups in spec.sharing.items():
        for policy, members in groups.items():
            unknown = [m for m in members if m not in spec.roles]
            if unknown:
                raise GraphError(f"{mode} sharing group {policy} names unknown role(s) {', '.join(unknown)}")
    for metric, node in spec.counts.items():
        if node not in nodes:
            raise GraphError(f"count: {metric} names unknown node '{node}'")
    single_calls = [n.id for n in nodes.values() if n.kind not in ("tool", "answers")]
    for node in spec.conversation:
        if node not in single_calls:
            raise GraphError(f"conversation: '{node}' must be a node that makes one role call; "
                             f"such nodes: {', '.join(single_calls)}")
    _check_reachable(spec)
    _check_bounded(spec)


def _default(ref: str) -> Tuple[str, Optional[str]]:
    """'update.text ?? none': read update.text, or 'none' while node update has not run yet (a
    loop's first round)."""
    ref, sep, default = ref.partition("??")
    return ref.strip(), (default.strip() if sep else None)


def parse_condition(when: str) -> Tuple[str, Optional[str], Optional[str]]:
    """An edge's condition as (field reference, operator, text): 'verify.revise' holds when the
    field is true; 'run.text != pass' compares a field's text (a tool's result: the code ran clean)."""
    for op in ("==", "!="):
        ref, sep, text = str(when).partition(op)
        if sep:
            return ref.strip(), op, text.strip()
    return str(when).strip(), None, None


def _holds(condition: Tuple[str, Optional[str], Optional[str]], state) -> bool:
    ref, op, text = condition
    node, _, name = ref.partition(".")
    value = state[node].fields.get(name)
    if op is None:
        return bool(value)
    return (str(value) == text) == (op == "==")


def _field_ref(spec: GraphSpec, ref: str, where: str) -> None:
    node, _, name = ref.partition(".")
    if node not in spec.nodes:
        raise GraphError(f"{where}: '{ref}' names unknown node '{node}'")
    target = spec.nodes[node]
    written = FIELDS[target.kind] + (FIELDS["answer"] if target.kind == "answers" else ())
    writers = [n for n in spec.nodes.values() if n.writes == node]  # a revision that replaces this node's result
    written += tuple(f for n in writers for f in FIELDS[n.kind])
    if name not in written:
        raise GraphError(f"{where}: no node writes '{ref}' (node {node} writes {', '.join(written)})")


def _check_reachable(spec: GraphSpec) -> None:
    start = next(iter(spec.nodes))
    seen, frontier = {start}, [start]
    while frontier:
        here = frontier.pop()
        for edge in spec.edges:
            if edge.source == here and edge.target not in seen:
                seen.add(edge.target)
                frontier.append(edge.target)
    unreachable = [n for n in spec.nodes if n not in seen]
    if unreachable:
        raise GraphError(f"node(s) {', '.join(unreachable)} cannot be reached from the first node {start}")


def _check_bounded(spec: GraphSpec) -> None:
    """Without its bounded (max_rounds) edges the graph must have no cycle."""
    free = [e for e in spec.edges if e.max_rounds is None]
    state: Dict[str, int] = {}

    def visit(node: str, path: List[str]) -> None:
        state[node] = 1
        for edge in free:
            if edge.source != node:
                continue
            if state.get(edge.target) == 1:
                cycle = path[path.index(edge.target):] + [edge.target]
                raise GraphError(f"unbounded loop {' -> '.join(cycle)}: give one of its edges max_rounds")
            if edge.target not in state:
                visit(edge.target, path + [edge.target])
        state[node] = 2

    for node in spec.nodes:
        if node not in state:
            visit(node, [node])


def load_graph(source) -> GraphSpec:
    return parse_graph(read_graph(source))


@dataclass
class _Result:
    turns: List[Turn]
    fields: Dict[str, Any]
    grade: Any = None


class GraphWorkflow(Workflow):
    """A graph's episode program: the same asks, in the same order, as a hand-written workflow."""

    def __init__(self, task, cfg, spec: GraphSpec):
        self.spec = spec
        self.name = spec.name
        super().__init__(task, cfg)
        self.tools = {n.id: import_object(n.tool, f"node {n.id}: tool") for n in spec.nodes.values() if n.kind == "tool"}

    def _count(self, value) -> int:
        """A number, or `workflow.<field>` with an optional `+ k` / `- k` (e.g. `workflow.max_iterations - 1`)."""
        if isinstance(value, str):
            match = re.fullmatch(r"workflow\.(\w+)\s*(?:([+-])\s*(\d+))?", value.strip())
            if not match or not hasattr(self.cfg, match.group(1)):
                raise GraphError(f"'{value}' is not a number or workflow.<field> [+- k]")
            offset = int(match.group(3) or 0) * (-1 if match.group(2) == "-" else 1)
            return int(getattr(self.cfg, match.group(1))) + offset
        return int(value)

    @property
    def chat(self) -> str:
        """workflow.chat when set; else one-message prompt sets stay one message and a chat-rendering one
        frames as the graph says, if it does."""
        chosen = getattr(self.cfg, "chat", "auto")
        if chosen != "auto":
            return chosen
        return self.style.chat if self.style.chat == "template" else (self.spec.chat or self.style.chat)

    def templates(self) -> Dict[str, str]:
        """The graph's templates, those of the cell's prompt set (`prompt_sets: {qwen3: ...}`) over them."""
        return {**self.spec.prompts, **self.spec.prompt_sets.get(getattr(self.cfg, "prompt_set", "tiny"), {})}

    def template_names(self) -> List[str]:
        """Every template the graph declares (any prompt set) or a node renders: what
        `workflow.prompts.<name>=...` may override for this graph."""
        used = {n.prompt or n.role for n in self.spec.nodes.values() if n.role is not None}
        declared = set(self.spec.prompts).union(*self.spec.prompt_sets.values())
        return sorted(used | declared)

    def check_templates(self, cell_prompts: Dict[str, str]) -> None:
        """Every node's template exists, the cell's `workflow.prompts` or the graph's own."""
        templates = {**self.templates(), **cell_prompts}
        for node in self.spec.nodes.values():
            name = node.prompt or node.role
            if node.role is not None and name not in templates:
                raise ConfigError(f"graph node {node.id} uses prompt template '{name}', which neither the cell nor the "
                                  f"graph's prompts: define; defined: {', '.join(sorted(templates))}")

    def role_budgets(self) -> Dict[str, int]:
        return dict(self.spec.budgets)

    def sharing_maps(self) -> Dict[str, Dict[str, List[str]]]:
        return {mode: {k: list(v) for k, v in groups.items()} for mode, groups in self.spec.sharing.items()}

    def roles(self) -> List[RoleSpec]:
        """A role whose instances fan out over one input (voters) is a trajectory per instance in
        GRPO's groups, as the study's voters; one run per item (workers) shares the role's group."""
        fanned = {n.role for n in self.spec.nodes.values() if n.fan_out is not None}
        return [RoleSpec(name, contract, self._count(instances), "instance" if name in fanned else "role")
                for name, (contract, instances) in self.spec.roles.items()]

    async def episode(self, problem, agents: Agents) -> Episode:
        state: Dict[str, _Result] = {}
        rounds: Dict[int, int] = {}
        runs: Dict[str, int] = {}
        node, capped = next(iter(self.spec.nodes)), False
        while node is not None:
            spec = self.spec.nodes[node]
            runs[node] = runs.get(node, 0) + 1
            kept = len(agents.turns)
            try:
                result = await self._run(spec, problem, agents, state)
            except PromptTooLong:  # the episode ends here; the answer is the final node's so far, if any,
                del agents.turns[kept:]  # and the node's other calls (a fan-out's) are dropped, as upstream
                capped = True            # commits a gather's trajectories only once all of it returned
                break
            state[spec.writes or spec.id] = result
            if spec.writes:
                state[spec.id] = result
            node = self._next(node, state, rounds)
        final = state.get(self.spec.final, _Result([], {"text": ""}))
        if "chosen" in final.fields:
            text = final.fields["chosen"]
        else:
            text = final.turns[0].text if final.turns else final.fields["text"]
        grade = final.grade if final.grade is not None and "chosen" not in final.fields else self.task.grade(problem, text)
        stats = {metric: float(runs.get(node, 0)) for metric, node in self.spec.counts.items()}
        if agents.max_prompt_tokens is not None:
            stats["prompt_capped"] = float(capped)
        return Episode(problem, agents.turns, text, grade, stats=stats)

    def _next(self, node: str, state, rounds) -> Optional[str]:
        for index, edge in enumerate(self.spec.edges):
            if edge.source != node:
                continue
            if edge.when is not None and not _holds(parse_condition(edge.when), state):
                continue
            if edge.max_rounds is not None:
                if rounds.get(index, 0) >= self._count(edge.max_rounds):
                    continue
                rounds[index] = rounds.get(index, 0) + 1
            return edge.target
        return None

    def _fields(self, spec: NodeSpec, problem, state, item: Optional[str] = None) -> Dict[str, Any]:
        values: Dict[str, Any] = {}
        for name, ref in spec.inputs.items():
            ref, default = _default(ref)
            if ref == "task":
                values[name] = self.task
            elif ref == "problem":
                values[name] = problem
            elif default is not None and ref.partition(".")[0] not in state:
                values[name] = default
            elif ref == "question":
                values[name] = problem.question
            elif ref == "item":
                values[name] = item
            elif ref.startswith("workflow."):
                values[name] = str(getattr(self.cfg, ref.split(".", 1)[1]))
            else:
                node, _, key = ref.partition(".")
                values[name] = state[node].fields[key]
        return values

    async def _run(self, spec: NodeSpec, problem, agents: Agents, state) -> _Result:
        if spec.kind == "tool":
            return await self._tool(spec, problem, agents, state)
        if spec.kind == "answers":
            return await self._answers(spec, problem, agents, state)
        turn = await agents.ask(spec.role, 0, spec.prompt, spec.id in self.spec.conversation,
                                **self._fields(spec, problem, state))
        if spec.kind == "answer":
            grade = self.mark_answer(turn, problem)
            return _Result([turn], {"text": turn.text.strip(), "answer": self.answer_of(turn), "correct": grade.correct}, grade)
        if spec.kind == "index":
            over = state[spec.over]
            index = self.mark_pick(turn, over.turns)
            return _Result([turn], {"chosen": over.turns[index].text, "index": index})
        if spec.kind == "search":
            return _Result([turn], self.mark_search(turn, problem, spec.check, self._fields(spec, problem, state)))
        if spec.kind == "text":
            text = self.mark_text(turn, problem, spec.check, self._fields(spec, problem, state))
            return _Result([turn], {"text": text, "correct": bool(turn.role_correct)})
        if spec.kind == "verdict":
            verdict = self.mark_verdict(turn, bool(state[spec.judges].fields["correct"]))
            return _Result([turn], {"accept": verdict.verdict == ACCEPT, "revise": verdict.verdict != ACCEPT,
                                    "feedback": verdict.feedback or "none"})
        return _Result([turn], {"items": self.mark_plan(turn, problem)})

    async def _tool(self, spec: NodeSpec, problem, agents: Agents, state) -> _Result:
        """A tool's call, or one call per item of a list (`for_each`: parallel retrieval per sub-query),
        their texts joined by newlines; served with the other episodes' calls (Scheduler.call_tool)."""
        tool = self.tools[spec.id]
        if not spec.for_each:
            value = await agents.tool(tool, **spec.params, **self._fields(spec, problem, state))
            return _Result([], {"value": value, "text": str(value), "answer": str(value)})
        node, _, key = spec.for_each.partition(".")
        values = await gather(*(agents.tool(tool, **spec.params, **self._fields(spec, problem, state, item))
                                for item in state[node].fields[key]))
        text = "\n".join(str(v) for v in values)
        return _Result([], {"value": values, "text": text, "answer": text})

    async def _answers(self, spec: NodeSpec, problem, agents: Agents, state) -> _Result:
        if spec.for_each:
            node, _, key = spec.for_each.partition(".")
            items = list(state[node].fields[key])
        else:
            items = [None] * self._count(spec.fan_out)
        turns = await gather(*(agents.ask(spec.role, i, spec.prompt, **self._fields(spec, problem, state, item))
                               for i, item in enumerate(items)), return_exceptions=True)
        for error in (t for t in turns if isinstance(t, BaseException)):  # once every call has returned
            raise error
        for turn, item in zip(turns, items):
            if spec.grade == "item":
                self.mark_worker(turn, problem, item)
            else:
                self.mark_answer(turn, problem)
        answers = [self.answer_of(t) for t in turns]
        labels = items if spec.for_each else None
        return _Result(list(turns), {"candidates": "\n".join(f"{i}: {a}" for i, a in enumerate(answers)),
                                     "solutions": self.numbered(list(turns), labels), "results": "; ".join(answers),
                                     "text": turns[0].text.strip() if turns else "", "answer": answers[0] if answers else "?",
                                     "correct": bool(turns and turns[0].role_correct)})


GRAPH_DIR = Path(__file__).resolve().parent / "graphs"  # the study topologies and UnityMAS-O workflows A-D


def is_graph_topology(topology: str) -> bool:
    """`topology=` names a graph rather than a registered workflow: one of UnityMAS-O's workflows
    (`qd_retrieve_answer`, ...), a YAML path, `graph:<name>`, or an import path
    `package.module:NAME` to a graph dict or a Workflow class."""
    from harness.config import GRAPH_TOPOLOGIES

    return topology in GRAPH_TOPOLOGIES or topology.endswith(GRAPH_FILE_SUFFIXES) or ":" in topology


def graph_source(topology: str):
    """What `topology=` names: a YAML path, a graph dict, or a Workflow subclass (import paths)."""
    if ":" in topology and not topology.startswith("graph:"):
        target = import_object(topology, "topology")
        if isinstance(target, dict) or (isinstance(target, type) and issubclass(target, Workflow)):
            return target
        raise GraphError(f"topology={topology} names neither a graph dict nor a Workflow class")
    if topology.startswith("graph:") or ":" not in topology and not topology.endswith(GRAPH_FILE_SUFFIXES):
        name = topology.split(":", 1)[-1]
        path = GRAPH_DIR / f"{name}.yaml"
        if not path.is_file():
            choices = ", ".join(f"graph:{p.stem}" for p in sorted(GRAPH_DIR.glob("*.yaml")))
            raise GraphError(f"unknown graph '{topology}'; valid choices: {choices}, or a path to a graph YAML file")
        return path
    return topology


def apply_graph_rewards(cfg) -> None:
    """A workflow graph's own reward weights per role (`rewards:`, e.g. M-ASK's turn-level rewards
    for its search and knowledge agents) under the cell's: reward.per_role.<role>.<term> set by the
    cell wins, and cell.yaml records the result."""
    if not is_graph_topology(cfg.topology):
        return
    try:
        source = graph_source(cfg.topology)
        if isinstance(source, type):
            return
        defaults = load_graph(source).rewards
    except ConfigError:
        return  # validate() reports the graph's problem
    per_role = {role: dict(terms) for role, terms in cfg.reward.per_role.items()}
    for role, terms in defaults.items():
        per_role[role] = {**terms, **per_role.get(role, {})}
    cfg.reward.per_role = per_role
