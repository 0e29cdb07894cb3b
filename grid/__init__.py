"""Grid launcher: sweeps -> cells -> submitit jobs (local or SLURM). Built in the grid-launcher issue."""
