"""BM25 over a JSONL passage corpus (bm25s), for the retrieval tool nodes of search workflows.

The corpus is one passage a line: `{"id": ..., "title": ..., "text": ...}` (title optional). Its
index is built once and cached under `<cache>/bm25/<sha256 of the corpus file>/`, so every cell of
a sweep (and a resumed one) loads the same index instead of re-tokenising the corpus; a changed
corpus is a new key. `search(query, k)` returns the top-k passages with their scores.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from harness.checkpoints import sha256_of


class CorpusError(ValueError):
    """A corpus that cannot be indexed: missing, empty or malformed (one readable line)."""


def read_corpus(path: Path) -> List[dict]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(f"passage corpus {path} does not exist")
    passages = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise CorpusError(f"{path} line {number} is not JSON") from None
        if not isinstance(row, dict) or not str(row.get("text", "")).strip():
            raise CorpusError(f"{path} line {number}: a passage needs a non-empty 'text'")
        passages.append({"id": str(row.get("id", number - 1)), "title": str(row.get("title", "")), "text": str(row["text"])})
    if not passages:
        raise CorpusError(f"passage corpus {path} is empty")
    return passages


def _document(passage: dict) -> str:
    return f"{passage['title']}. {passage['text']}" if passage["title"] else passage["text"]


class BM25Retriever:
    def __init__(self, corpus: Path, cache: Optional[Path] = None):
        import bm25s

        self.passages = read_corpus(corpus)
        root = Path(cache or os.environ.get("MARL_CACHE") or "~/.cache/marl-harness").expanduser() / "bm25"
        self.index_dir = root / sha256_of(Path(corpus).expanduser())[:16]
        self.built = False
        if (self.index_dir / "params.index.json").is_file():
            self.model = bm25s.BM25.load(str(self.index_dir))
        else:
            self.model = bm25s.BM25()
            self.model.index(bm25s.tokenize([_document(p) for p in self.passages], stopwords="en", show_progress=False),
                             show_progress=False)
            root.mkdir(parents=True, exist_ok=True)
            staged = Path(tempfile.mkdtemp(dir=root, prefix=".index."))
            try:
                self.model.save(str(staged))
                if not self.index_dir.exists():
                    os.replace(staged, self.index_dir)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            self.built = True

    def search(self, query: str, k: int = 3) -> List[Dict[str, object]]:
        import bm25s

        k = max(1, min(k, len(self.passages)))
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:  # nothing but stop words: no passage matches
            return []
        indices, scores = self.model.retrieve(tokens, k=k, show_progress=False)
        return [{**self.passages[int(i)], "score": float(s)} for i, s in zip(indices[0], scores[0]) if float(s) > 0]


@lru_cache(maxsize=8)
def retriever_for(corpus: str) -> BM25Retriever:
    """One retriever per corpus per process: a tool node calls it for every episode."""
    return BM25Retriever(Path(corpus))


def retrieve(query: str, corpus: str, k: str = "3") -> str:
    """A tool node's retrieval: the top-k passages as numbered text for the next role's prompt."""
    hits = retriever_for(corpus).search(query, int(k))
    return "\n".join(f"[{i + 1}] {h['title']}: {h['text']}" if h["title"] else f"[{i + 1}] {h['text']}"
                     for i, h in enumerate(hits)) or "(no passage found)"
