"""How numbers read in every table a person sees (reports, Markdown/LaTeX exports): a missing
value or a detector that never fired is "–", step numbers are whole, differences to a baseline
carry a sign, accuracies and other levels do not, and every float has three decimals."""
from __future__ import annotations

import numbers

import pandas as pd

SIGNED = ("gain", "delta", "change")  # column-name prefixes of differences
WHOLE = ("first_", "step", "seed", "n")  # column names (or prefixes) of counts and steps
COUNTS = ("calls", "samples", "steps", "instances", "optimizer steps", "cells", "failed", "fired", "rounds")  # may be means
MISSING = "–"


def format_value(column: str, value) -> str:
    if value is None or (isinstance(value, str) and not value.strip()) or \
            (not isinstance(value, (str, bool)) and pd.isna(value)):
        return MISSING
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        return str(value)
    name = str(column)
    if name.startswith(WHOLE[0]) or name in WHOLE[1:] or isinstance(value, numbers.Integral):
        return f"{value:.0f}"
    if name.startswith(("median lead", "median delay")):  # a median of whole steps: whole or a half
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    if any(name == c or name.startswith(c + " ") or name.endswith(" " + c) for c in COUNTS):  # a count, or a mean of counts
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"
    return f"{value:+.3f}" if name.startswith(SIGNED) else f"{value:.3f}"


def display(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` with every value as the text a reader sees."""
    return pd.DataFrame({column: [format_value(column, v) for v in frame[column]] for column in frame.columns},
                        index=frame.index)


def to_markdown(frame: pd.DataFrame) -> str:
    return display(frame).to_markdown(index=False, disable_numparse=True) if len(frame) else "_none_"
