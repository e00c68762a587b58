# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · EM by hand: a 1-D Gaussian mixture
#
# Expectation–maximisation (EM) fits a mixture model by repeating two steps. In this notebook
# everything runs in this one process, and we compute each step twice: by hand with numpy,
# and with `mixle_nb.stats`. You will see
#
# 1. what the **E-step** computes (responsibilities),
# 2. the **sufficient statistics** it sums up,
# 3. what the **M-step** computes from them,
# 4. why the log-density of the data **never decreases**,
# 5. the `EMPanel`, which steps a fit and redraws the density after each step.

# %% [markdown]
# The next cell imports numpy, matplotlib and the EM core. It also keeps torch (which the
# EM core uses for its array maths) on one thread, so timings stay steady on a small machine.

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from mixle_nb.stats import GaussianDistribution, MixtureDistribution, em_step, seq_encode
from mixle_nb.stats.values import flatten_value
from mixle_nb.widgets import EMPanel

torch.set_num_threads(1)

# %% [markdown]
# ## The data
#
# We draw 20,000 points from a mixture of three Gaussians whose parameters we know, so we
# can check later what EM finds. The histogram shows three bumps of different width and height.

# %%
truth = MixtureDistribution([GaussianDistribution(-2.5, 0.6), GaussianDistribution(0.5, 1.0),
                             GaussianDistribution(3.5, 0.4)], w=[0.3, 0.45, 0.25])
x = truth.sampler(seed=0).sample(20_000)

fig, ax = plt.subplots(figsize=(8, 2.8))
ax.hist(x, bins=120, density=True, color="#c8d3e0")
ax.set(title=f"{len(x):,} points from a mixture of three Gaussians", xlabel="x", ylabel="density")
plt.show()

# %% [markdown]
# ## The model and a starting guess
#
# A mixture of K Gaussians has density p(x) = Σₖ wₖ · N(x | μₖ, σₖ²): component k has
# weight wₖ, mean μₖ and variance σₖ². EM needs a starting model. Ours is deliberately
# poor: three equal, wide bumps at −2, 0 and 2.
#
# The next cell draws the start model (red, with its three weighted components thin)
# and the true density (dashed) over the data.

# %%
grid = np.linspace(x.min(), x.max(), 500)

def density(model, points=grid):
    """p(x) of a model at the given points."""
    return np.exp(model.seq_log_density(seq_encode(points, model=model)))

def draw(ax, model, label, colour="#c0392b", legend=True):
    """Histogram of the data, the true density, the model and its weighted components."""
    ax.hist(x, bins=120, density=True, color="#c8d3e0")
    ax.plot(grid, density(truth), "k--", lw=1, label="truth")
    for w_k, component in zip(model.w, model.components):
        ax.plot(grid, w_k * density(component), color=colour, lw=0.8)
    ax.plot(grid, density(model), color=colour, lw=2, label=label)
    if legend:
        ax.legend(loc="upper left", fontsize=8)

start = MixtureDistribution([GaussianDistribution(mu, 2.0) for mu in (-2.0, 0.0, 2.0)],
                            w=[1 / 3, 1 / 3, 1 / 3])
fig, ax = plt.subplots(figsize=(8, 2.8))
draw(ax, start, "start model")
ax.set(title="the starting guess against the data", xlabel="x")
plt.show()


# %% [markdown]
# ## The E-step: how much each component explains each point
#
# For every point xₙ and component k, the E-step computes the **responsibility**
# rₙₖ = wₖ · N(xₙ | μₖ, σₖ²) / p(xₙ): the probability, under the current model, that
# xₙ came from component k. Each point's responsibilities add up to 1.
#
# The next cell computes them with plain numpy (in logs, so nothing underflows) and compares
# them with the library's `seq_posterior`.

# %%
def parameters(model):
    """(w, mu, sigma2) as arrays of length K."""
    return (np.asarray(model.w), np.array([c.mu for c in model.components]),
            np.array([c.sigma2 for c in model.components]))

def log_joint(w, mu, sigma2, points):
    """(N, K) array of log( w_k N(x_n | mu_k, sigma2_k) )."""
    return np.log(w) - 0.5 * np.log(2 * np.pi * sigma2) - 0.5 * (points[:, None] - mu) ** 2 / sigma2

def responsibilities(model, points):
    joint = log_joint(*parameters(model), points)
    return np.exp(joint - np.logaddexp.reduce(joint, axis=1, keepdims=True))

r = responsibilities(start, x)
library = start.seq_posterior(seq_encode(x, model=start))
print("shape:", r.shape, "   every row sums to 1:", np.allclose(r.sum(axis=1), 1.0))
print(f"largest difference from the library's E-step: {np.abs(r - library).max():.1e}")

# %% [markdown]
# The picture: the responsibilities of the start model at each x, stacked. Far left the
# left component takes almost every point; between two bumps the points are shared.

# %%
fig, ax = plt.subplots(figsize=(8, 2.5))
ax.stackplot(grid, responsibilities(start, grid).T, alpha=0.85,
             labels=[f"component {k}" for k in range(3)])
ax.set(title="E-step: responsibility of each component for a point at x (start model)",
       xlabel="x", ylabel="r", ylim=(0, 1))
ax.legend(loc="center right", fontsize=8)
plt.show()

# %% [markdown]
# ## Sufficient statistics: three sums per component
#
# The M-step never needs the points themselves, only three sums per component:
#
# * Nₖ = Σₙ rₙₖ (how many points component k explains),
# * Sₖ = Σₙ rₙₖ xₙ,
# * Qₖ = Σₙ rₙₖ xₙ².
#
# These are the **sufficient statistics**. The next cell computes them by hand and shows
# they are exactly what the library's accumulator holds after one E-step pass
# (`acc.value()` is the counts, then `[N, S, Q]` per component).

# %%
N_k, S_k, Q_k = r.sum(axis=0), r.T @ x, r.T @ x**2

enc = seq_encode(x, model=start)          # encode once: each point becomes the row [1, x, x²]
est = start.estimator()
acc = est.accumulator_factory().make()
acc.seq_update(enc, None, start)          # one E-step pass over the data
counts, per_component = acc.value()

print("k       N_k (hand)      N_k (lib)        S_k (hand)      S_k (lib)        Q_k (hand)      Q_k (lib)")
for k in range(3):
    print(f"{k}  {N_k[k]:14.4f} {per_component[k][0]:14.4f}   {S_k[k]:14.4f} {per_component[k][1]:14.4f}"
          f"   {Q_k[k]:14.4f} {per_component[k][2]:14.4f}")


# %% [markdown]
# Because they are sums, the statistics of two halves of the data **add up** to the
# statistics of the whole. That is what makes EM easy to distribute (notebook 02): each
# worker sums over its own points, and only the sums travel.
#
# The next cell accumulates each half separately, combines them, and checks the result
# against the whole; the picture stacks the two halves' Nₖ.

# %%
def statistics(points, model=start):
    acc = est.accumulator_factory().make()
    acc.seq_update(seq_encode(points, model=model), None, model)
    return acc

half = len(x) // 2
first, second = statistics(x[:half]), statistics(x[half:])
both = statistics(x[:half]).combine(second.value())
whole = flatten_value(acc.value())
difference = np.abs(flatten_value(both.value()) - whole).max() / np.abs(whole).max()
print(f"half + half vs whole, largest relative difference: {difference:.1e} (rounding)")

fig, ax = plt.subplots(figsize=(5, 2.6))
n_first, n_second = first.value()[0], second.value()[0]
ax.bar(range(3), n_first, label="first half")
ax.bar(range(3), n_second, bottom=n_first, label="second half")
ax.plot(range(3), counts, "k_", ms=40, mew=2, label="whole data")
ax.set(title="Nₖ: the halves add up to the whole", xticks=range(3), xlabel="component k")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
plt.show()

# %% [markdown]
# ## The M-step: new parameters from the sums
#
# Setting the new parameters to maximise the expected log-density gives closed forms:
#
# * wₖ = Nₖ / N,
# * μₖ = Sₖ / Nₖ,
# * σₖ² = Qₖ / Nₖ − μₖ².
#
# The next cell computes them by hand, checks them against the library's M-step
# (`est.estimate`), and draws the model before and after this first EM step.

# %%
w_new, mu_new = N_k / len(x), S_k / N_k
sigma2_new = Q_k / N_k - mu_new**2
after_one = est.estimate(len(x), acc.value())
print("by hand:   w", np.round(w_new, 4), " mu", np.round(mu_new, 4), " sigma2", np.round(sigma2_new, 4))
print("library:   w", np.round(after_one.w, 4), " mu", np.round(parameters(after_one)[1], 4),
      " sigma2", np.round(parameters(after_one)[2], 4))

fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), sharey=True)
draw(axes[0], start, "before (start)")
draw(axes[1], after_one, "after one EM step", colour="#2980b9")
plt.show()

# %% [markdown]
# ## Many steps, and the log-density
#
# `em_step(enc, est, model)` does the E-step and the M-step in one pass over the data. It
# also returns the log-density of the data under the model it started from, log p(x₁…x_N),
# which the E-step gets for free while normalising the responsibilities.
#
# The next cell runs 40 steps and plots the log-density per step: it climbs fast, then
# levels off as the fit converges. Its smallest step-to-step change is printed.

# %%
model, models, log_densities = start, [start], []
for step in range(40):
    result = em_step(enc, est, model)
    log_densities.append(result.log_density)   # log-density of the model this step started from
    model = result.model
    models.append(model)
print(f"smallest change from one step to the next: {np.diff(log_densities).min():.3g} (never negative)")

fig, axes = plt.subplots(1, 2, figsize=(10, 2.6))
axes[0].plot(range(1, 41), log_densities, "o-", ms=3)
axes[0].set(title="log-density of the data per EM step", xlabel="EM step")
axes[1].semilogy(range(2, 41), np.diff(log_densities), "o-", ms=3, color="#27ae60")
axes[1].set(title="increase per step (log scale)", xlabel="EM step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Why the log-density never decreases
#
# For any responsibilities q, Jensen's inequality gives a **lower bound** on the log-density:
#
# log p(x | θ) ≥ B_q(θ) = Σₙ Σₖ qₙₖ · log( wₖ N(xₙ | μₖ, σₖ²) / qₙₖ ).
#
# * The **E-step** sets q to the responsibilities at the current θ_old. That makes the
#   bound touch the log-density there: B_q(θ_old) = log p(x | θ_old).
# * The **M-step** picks the θ_new that maximises B_q (the closed forms above do exactly that).
#
# So log p(x | θ_new) ≥ B_q(θ_new) ≥ B_q(θ_old) = log p(x | θ_old). The next cell draws
# both along the straight line from θ_old (t = 0, the start) to θ_new (t = 1, after one step):
# the bound stays below, touches at t = 0 and peaks at t = 1.

# %%
old, new = parameters(models[0]), parameters(models[1])
q = responsibilities(models[0], x)           # E-step at the old parameters
q_log_q = np.sum(q * np.log(q, where=q > 0, out=np.zeros_like(q)))

ts, log_p, bound = [], [], []
for t in np.linspace(-0.5, 1.5, 81):
    w, mu, sigma2 = ((1 - t) * a + t * b for a, b in zip(old, new))
    if np.all(w > 0) and np.all(sigma2 > 0):   # stay where the parameters make sense
        joint = log_joint(w / w.sum(), mu, sigma2, x)
        ts.append(t)
        log_p.append(np.logaddexp.reduce(joint, axis=1).sum())
        bound.append(np.sum(q * joint) - q_log_q)

fig, ax = plt.subplots(figsize=(8, 3))
ax.plot(ts, log_p, lw=2, label="log p(x | θ)")
ax.plot(ts, bound, "--", lw=2, label="lower bound B_q(θ), q from the E-step at θ_old")
ax.axvline(0, color="grey", lw=0.8)
ax.axvline(1, color="grey", lw=0.8)
ax.set(title="one EM step: the bound touches at θ_old (t=0) and is maximised at θ_new (t=1)",
       xlabel="t   (θ = θ_old + t · (θ_new − θ_old))")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Watching a fit with the EMPanel
#
# The `EMPanel` steps EM for you and redraws after each step: left the log-density per step,
# middle the model's density over the data, right the time the step took. In a live notebook
# its buttons (Step, Run N, Pause, Back, Reset) drive it; here we call their Python twins.
#
# The next cell builds a panel on the encoded data, from the same poor start.

# %%
panel = EMPanel(handle=enc, estimator=est, model=start, data_sample=x)
panel

# %% [markdown]
# One step, then five more (the **Step** and **Run N** buttons): watch the density in the
# middle plot move towards the three bumps.

# %%
panel.step()
panel.run(5)
if panel.error:  # a failed step shows in the panel; raise it here too
    raise panel.error
print(f"{len(panel.history)} steps, log-density now {panel.history[-1].log_density:.2f}")

# %% [markdown]
# `back(k)` (the **Back** button) rewinds k steps: the history drops them and the panel
# shows that earlier model again. EM is deterministic, so stepping forward again reproduces
# exactly the same models. The next cell checks that.

# %%
sixth = panel.history[-1].model
panel.back(3)
print("after back(3):", len(panel.history), "steps")
panel.run(3)
print("same sixth model again:", repr(panel.history[-1].model) == repr(sixth))

# %% [markdown]
# Now run the rest of the way to 40 steps in all; the panel above shows the converged fit.

# %%
panel.run(40 - len(panel.history))
if panel.error:
    raise panel.error
print(f"{len(panel.history)} steps, log-density {panel.history[-1].log_density:.2f}")

# %% [markdown]
# An exported notebook cannot run the widget's code, so `snapshot()` keeps a static picture
# of the panel as it is now.

# %%
panel.snapshot()

# %% [markdown]
# The panel's history keeps every model. The next cell draws the density at a few steps side
# by side: the whole fit in one picture.

# %%
shown = [0, 1, 3, 10, 40]
fig, axes = plt.subplots(1, len(shown), figsize=(14, 2.4), sharey=True)
for ax, step in zip(axes, shown):
    model = start if step == 0 else panel.history[step - 1].model
    draw(ax, model, f"step {step}", legend=False)
    ax.set_title("start" if step == 0 else f"after {step} step{'s' * (step > 1)}", fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What EM found
#
# The next cell lists the fitted components next to the true ones, ordered by mean, and the
# largest difference between a true and a fitted parameter.

# %%
fitted = panel.model
pairs = list(zip(sorted(zip(truth.w, truth.components), key=lambda p: p[1].mu),
                 sorted(zip(fitted.w, fitted.components), key=lambda p: p[1].mu)))
print("          weight          mean           variance")
print("        true  fitted   true  fitted   true  fitted")
for (tw, tc), (fw, fc) in pairs:
    print(f"      {tw:5.2f}  {fw:6.3f}  {tc.mu:5.2f}  {fc.mu:6.3f}  {tc.sigma2:5.2f}  {fc.sigma2:6.3f}")
gap = max(max(abs(tw - fw), abs(tc.mu - fc.mu), abs(tc.sigma2 - fc.sigma2)) for (tw, tc), (fw, fc) in pairs)
print(f"largest difference from the truth with {len(x):,} points: {gap:.3f}")

# %% [markdown]
# ## Where EM starts matters: random starts against k-means++
#
# Our start above was chosen by hand. On your own data, `fit(data, estimator, init=...)` picks
# one, and the choice matters. New data for this: four well-separated bumps, and an estimator
# for a mixture of four Gaussians.
#
# * `init="random"` gives every point random responsibilities, then takes an M-step. Every
#   component then sits near the overall mean with almost the same shape. By symmetry the
#   E-step shares each point almost equally between them, and the M-step barely moves them
#   apart: EM sits at a **saddle** and its gain per step is so small that it stops there.
# * `init="kmeans++"` picks centres far apart (each new one drawn with probability
#   proportional to its squared distance from the centres chosen so far), refines them with a
#   few k-means iterations, and starts EM from the clusters they make.
#
# The next cell fits both ways from five seeds each and prints, per fit, how many EM
# iterations it ran, whether it called itself converged, its final log-density and its means.

# %%
from mixle_nb.inference import fit
from mixle_nb.stats import GaussianEstimator, MixtureEstimator

bumps = MixtureDistribution([GaussianDistribution(mu, 1.0) for mu in (-10.0, -3.0, 3.0, 10.0)], w=[0.25] * 4)
x4 = bumps.sampler(seed=3).sample(20_000)
est4 = MixtureEstimator([GaussianEstimator() for _ in range(4)])
seeds = range(5)
fits = {init: [fit(x4, est4, init=init, rng=seed, out=None) for seed in seeds] for init in ("random", "kmeans++")}

best = max(f.log_density for runs in fits.values() for f in runs)
print("init       seed  iterations  converged  log-density    means")
for init, runs in fits.items():
    for seed, f in zip(seeds, runs):
        means = np.sort([c.mu for c in f.model.components])
        print(f"{init:9s}  {seed:4d}  {f.n_iter:10d}  {str(f.converged):9s}  {f.log_density:12.1f}  {np.round(means, 2)}")
for init, runs in fits.items():
    found = sum(f.log_density > best - 1e-6 * abs(best) for f in runs)
    print(f"{init}: {found} of {len(runs)} seeds reach the best log-density, {best:.1f}")

# %% [markdown]
# The picture: left, the log-density per point at each EM iteration of every fit, from the
# second iteration on (a random start that stalls stays flat, far below); right, the density of
# one stalled random fit and of a k-means++ fit over the data.

# %%
grid4 = np.linspace(x4.min(), x4.max(), 500)
stalled = min(fits["random"], key=lambda f: f.log_density)
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
for init, colour in (("random", "#c0392b"), ("kmeans++", "#2980b9")):
    for i, f in enumerate(fits[init]):
        axes[0].plot([r.step for r in f.history[1:]], [r.log_density / len(x4) for r in f.history[1:]],
                     color=colour, lw=1, label=init if i == 0 else None)
axes[0].set(title="log-density per point, five seeds each", xlabel="EM iteration", xscale="log")
axes[0].legend(fontsize=8)
axes[1].hist(x4, bins=150, density=True, color="#c8d3e0")
for f, label, colour in ((stalled, "random start (stalled)", "#c0392b"), (fits["kmeans++"][0], "k-means++ start", "#2980b9")):
    axes[1].plot(grid4, np.exp(f.model.seq_log_density(seq_encode(grid4, model=f.model))), color=colour, label=label)
axes[1].set(title="what each start leads to", xlabel="x")
axes[1].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# "Converged" only says that the gain per step fell below `delta`: at a saddle it does so
# early. `fit(..., n_init=k)` runs k starts and keeps the best; with random starts that helps
# only when one of them happens to escape the saddle. The next cell runs five random restarts
# in one call and compares the best of them with one k-means++ start.

# %%
restarted = fit(x4, est4, init="random", n_init=5, rng=0, out=None)
print("final log-density of each random restart:", np.round(restarted.restarts, 1))
print(f"best of {len(restarted.restarts)} random restarts: {restarted.log_density:.1f};"
      f" one k-means++ start: {fits['kmeans++'][0].log_density:.1f}")

# %% [markdown]
# ## Summary
#
# * E-step: responsibilities rₙₖ, and from them three sums per component (Nₖ, Sₖ, Qₖ).
# * M-step: new weights, means and variances from those sums alone.
# * The log-density never decreases, because each step maximises a lower bound that touches it.
# * Where EM starts matters: random starts can stall at a saddle; `init="kmeans++"` (the
#   default for Gaussian mixtures) spreads the starting components over the data.
# * Sums of parts add up to the sum of the whole: the idea behind distributed EM in
#   **02_distributed_em.ipynb**.
#
# This notebook started no processes, so there is nothing to stop.
