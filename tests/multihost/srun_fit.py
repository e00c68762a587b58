"""Run by ``srun python srun_fit.py`` (tests/multihost/test_slurm.py): the EM fit of
test_multihost.rank_fit in a plain Slurm step, no MixleCluster; the handle joins the group from
Slurm's variables alone. Prints, as one JSON line, this task's torch launcher variables as the
handle set them and its model numbers."""

import json
import os

from test_multihost import rank_fit

numbers, log_densities = rank_fit("allreduce")
print(
    json.dumps(
        {
            **{k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURM_PROCID")},
            "numbers": numbers.tolist(),
            "log_densities": log_densities.tolist(),
        }
    )
)
