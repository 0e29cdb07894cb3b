"""Tool nodes for tests/test_graph.py (`tool: tests.graph_tools:<name>`)."""
from collections import Counter


def majority(answers: str) -> str:
    """The most common of the '; '-joined answers (the first of them on a tie)."""
    values = answers.split("; ")
    return Counter(values).most_common(1)[0][0]


# a graph as a Python dict, for topology=tests.graph_tools:TWO_VOTERS
TWO_VOTERS = {
    "roles": {"voter": {"contract": "answer", "instances": 2}, "aggregator": {"contract": "index"}},
    "nodes": {"votes": {"role": "voter", "fan_out": 2, "inputs": {"question": "question"}},
              "pick": {"role": "aggregator", "over": "votes",
                       "inputs": {"question": "question", "candidates": "votes.candidates"}}},
    "edges": [["votes", "pick"]],
    "final": "pick",
}
