"""Distributed EM from a terminal: ``torchrun --nproc_per_node 2 examples/torchrun_fit.py``.

Every rank generates the same data (same seed) and keeps its ``data[rank::world]`` shard;
only the root prints the all-reduced log-density per step.
"""
import torch

from mixle_nb.parallel import TorchRunEncodedData, torchrun_out
from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step

torch.set_num_threads(1)
truth = MixtureDistribution([GaussianDistribution(-3, 1), GaussianDistribution(0, 0.5),
                             GaussianDistribution(4, 2)], [0.3, 0.3, 0.4])
data = truth.sampler(seed=0).sample(200_000)
model = MixtureDistribution([GaussianDistribution(m, 1.0) for m in (-1.0, 0.5, 1.0)], [1 / 3] * 3)
estimator = model.estimator()
out = torchrun_out()

with TorchRunEncodedData(data, estimator=estimator) as handle:
    print(f"{len(handle)} observations on {handle.world} ranks", file=out)
    for step in range(1, 31):
        result = em_step(handle, estimator, model)
        model = result.model
        print(f"step {step:2d}  log-density {result.log_density:.6f}", file=out)
    print(model, file=out)
