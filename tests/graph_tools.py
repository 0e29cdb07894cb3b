"""Tool nodes for tests/test_graph.py (`tool: tests.graph_tools:<name>`)."""
from collections import Counter


def majority(answers: str) -> str:
    """The most common of the '; '-joined answers (the first of them on a tie)."""
    values = answers.split("; ")
    return Counter(values).most_common(1)[0][0]
