"""Analysis: run directories -> DataFrames -> comparisons against single-agent baselines. Built in the analysis issue."""
