"""Reports: per-run and per-sweep diagnostic reports. Built in the analysis-and-reports issue."""
