"""Running plans: the seam to submitit and SLURM, the jobs the nodes run, submission and the job
registry, trials, re-planning, the doctor."""
