"""Distributed EM from a terminal: ``torchrun --nproc_per_node 2 examples/torchrun_fit.py [x.npy]``.

Without a file, every rank generates the same data (same seed) and keeps its
``data[rank::world]`` shard. With a ``.npy`` file of 1-D observations, each rank reads only its
own rows from disk (``TorchRunEncodedData.from_npy``): no process ever holds the whole data.
Only the root prints the all-reduced log-density per step.
"""

import sys

import torch

from mixle_nb.parallel import TorchRunEncodedData, torchrun_out
from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step

torch.set_num_threads(1)
model = MixtureDistribution([GaussianDistribution(m, 1.0) for m in (-1.0, 0.5, 1.0)], [1 / 3] * 3)
estimator = model.estimator()
out = torchrun_out()

if len(sys.argv) > 1:
    handle = TorchRunEncodedData.from_npy(sys.argv[1], estimator=estimator, sub_chunks=8)
else:
    truth = MixtureDistribution(
        [GaussianDistribution(-3, 1), GaussianDistribution(0, 0.5), GaussianDistribution(4, 2)], [0.3, 0.3, 0.4]
    )
    handle = TorchRunEncodedData(truth.sampler(seed=0).sample(200_000), estimator=estimator)

with handle:
    print(f"{len(handle)} observations on {handle.world} ranks", file=out)
    for step in range(1, 31):
        result = em_step(handle, estimator, model)
        model = result.model
        print(f"step {step:2d}  log-density {result.log_density:.6f}", file=out)
    print(model, file=out)
