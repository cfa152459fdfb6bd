"""Bayesian Neural Networks for Functional ANOVA Model (Bayesian-TPNN; Park, Kim, Lee, Shin, Kong & Kim, ICLR 2026).

arXiv 2510.00545. Package layout: :mod:`.basis` (TPNN factors), :mod:`.sampler` (priors, moves, MCMC),
:mod:`.polya_gamma` (exact ``PG(1, c)`` draws). The validation (synthetic function, stepwise-birth ablations,
diabetes, breast cancer) is the reproduction recipe ``interp reproduce bayesian_tpnn``
(``benchmarks/bayesian_tpnn/``).

The regression function is a functional ANOVA model written as a sum of tensor-product neural-network (TPNN)
basis functions,

    f(x) = beta_0 + sum_{k=1..K} beta_k * phi(x_{S_k} | b_k, gamma_k),
    phi(x_S | b, gamma) = prod_{j in S} [1 - sigma((x_j - b_j)/gamma_j) / m_j],
    m_j = (1/n) sum_i sigma((x_ij - b_j)/gamma_j)      (empirical marginal of feature j),

which is the paper's factor ``1 - sigma + c_j sigma`` with ``c_j = -(1 - m_j)/m_j`` simplified. Every factor
averages to exactly zero over the training marginal, so each component ``f_S = sum_{k: S_k = S} beta_k phi_k``
satisfies the sum-to-zero (identifiability) constraint ``int f_S dmu_{n,j} = 0`` for every ``j in S``.

Priors: ``pi(K) ∝ exp(-C0 K log n)``; the set ``S_k`` comes from an input-importance distribution ``p_input``
(a fitted gradient-boosting model's importances); ``b ~ U(0, 1)`` on inputs min-max scaled to [0, 1];
``gamma ~ Gamma(a_gamma, b_gamma)``; ``sigma^2 ~ IG(nu/2, nu lambda/2)``.

Posterior sampling is Metropolis-within-Gibbs:

* architecture moves (reversible jump): birth of a node with ``S`` drawn from the prior, **stepwise birth**
  (copy an existing node and add one variable, the move that reaches higher-order interactions), death of a
  node, and per-node edge add / delete / change; accepted with
  ``min{1, L(new)/L(old) * pi(new)/pi(old) * q(old|new)/q(new|old)}``;
* Langevin (MALA) proposals for each node's ``(b, log gamma)``;
* Gibbs draws of ``beta`` and ``sigma^2`` from their Gaussian / inverse-gamma full conditionals (regression);
  for classification (``likelihood="logistic"``) Polya-Gamma augmentation, ``omega_i ~ PG(1, f_i)``, makes the
  likelihood conditionally Gaussian, so the same collapsed moves and exact ``beta`` draws apply, followed by a
  Gibbs draw of the intercept.

The posterior importance of a component ``S`` is the empirical variance of ``f_S`` over the training inputs,
averaged over the kept posterior draws (zero in draws without such a node).

Choices where the paper (or our digest of it) is silent, all documented in ``docs/models/bayesian_tpnn.md``:

* Likelihoods: Gaussian (regression) and logistic (binary classification) by Polya-Gamma augmentation
  (Polson, Scott & Windle 2013; exact sampler in :mod:`.polya_gamma`), chosen over a Metropolis step for
  ``beta`` because it keeps ``beta`` collapsible in the architecture moves; intercept ``~ N(0, 10^2)``.
* ``beta_k ~ N(0, tau^2)`` (``tau = beta_prior_sd`` on the standardised response), independent of ``sigma^2``.
  Architecture moves use the likelihood with ``beta`` integrated out (collapsed, ``y ~ N(0, sigma^2 I +
  tau^2 Phi Phi^T)``); ``beta`` is then redrawn from its exact Gaussian full conditional (a partially collapsed
  Gibbs sampler). The intercept is fixed at the training mean (every basis function is centred).
* ``gamma ~ Gamma(shape=1, scale=0.01)`` (mean 0.01: near-step factors, i.e. soft decision stumps); the
  shape/scale convention is our reading of the paper's ``(a_gamma, b_gamma) = (1, 0.01)``.
* ``sigma^2 ~ IG(nu/2, nu lambda/2)`` with ``nu = 3`` and ``lambda`` calibrated as in BART (the prior puts 90% of
  its mass below the residual variance of a linear fit).
* Prior on ``S``: ``|S| = d`` with ``P(d)`` uniform on ``1..max_order`` (``max_order = 4``, the order of the
  paper's top MADELON component; ``None`` removes the cap), then
  ``P(S | d) ∝ prod_{j in S} p_input(j)``; ``p_input`` mixes normalised ``GradientBoostingRegressor`` importances
  with a uniform distribution (weight 0.5) so every input keeps a positive proposal probability (irreducibility).
* Move probabilities (unknown in the paper): birth 0.2, stepwise birth 0.2, death 0.3, edge add / delete /
  change 0.1 each; disabling stepwise birth drops that move and renormalises the others. Ten architecture
  proposals are made per iteration, followed by one Langevin sweep over all nodes.
* Stepwise birth copies the parent's ``S``, adds one input ``j ~ p_input`` with ``(b_j, gamma_j)`` from the
  prior, and copies the parent's ``(b, log gamma)`` with Gaussian jitter whose sd is the parent's Laplace
  posterior spread (Fisher information at the conditional-mean weight plus the prior precision; see
  ``BayesianTPNN.stepwise_sd``), so the jump is dimension-matched and the copy is as close to the parent as the
  data pin the parent down. Births and stepwise births share the death move as their reverse, so both use the
  mixture creation density ``p_birth pi(theta) + p_stepwise q_step(theta | state)``. The earlier fixed jitter
  (sd 0.02 / 0.1) is ``stepwise_proposal="fixed"``.
* MALA uses a position-dependent diagonal preconditioner (inverse of the per-node Fisher information plus one)
  and a step size adapted during burn-in towards acceptance 0.574, then frozen. The paper's best step 0.001
  is in its own (unknown) parameterisation; ours starts at ``langevin_step``.
"""
from __future__ import annotations

from .basis import TPNNNode, _pad_nodes, component_name, logsumexp, node_forward, tpnn_basis, tpnn_factors
from .polya_gamma import sample_polya_gamma
from .sampler import LIKELIHOODS, MOVES, BayesianTPNN, BayesianTPNNConfig

__all__ = [
    "BayesianTPNNConfig", "TPNNNode", "BayesianTPNN", "tpnn_factors", "tpnn_basis", "node_forward", "component_name",
    "sample_polya_gamma", "MOVES", "LIKELIHOODS", "logsumexp",
]
