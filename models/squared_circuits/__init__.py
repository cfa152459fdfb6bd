"""How to Square Tensor Networks and Circuits Without Squaring Them (Loconte, Javaloy & Vergari, ICLR 2026).

Squared (complex) circuits ``p(x) = |c(x)|^2 / Z`` whose unitary parameterisation makes ``Z = 1`` and
lets marginals be computed without squaring the circuit:

* :mod:`.circuit`: generic tensorized circuits (input / Kronecker or Hadamard product / sum layers),
  the unitarity conditions U1-U4, the semi-unitary QR parameterisation, the marginalization recursion,
  explicit squaring (the baseline, structured circuits only) and brute force; random circuit builders,
  a tree (TTN-like) structure and a two-partition structure that no tensor network expresses;
* :mod:`.tree`: vectorised binary trees and mixtures of trees over different variable orders (for 64
  pixels), with log-scale renormalisation and the explicit-squaring Gram recursion;

The validations (exactness on random circuits, learning on quantised digits) are the reproduction recipe
``interp reproduce squared_circuits`` (``benchmarks/squared_circuits/``).

Choices where the sources were unclear (see ``docs/models/squared_circuits.md``):

* semi-unitary weights via a phase-corrected QR parameterisation (raw parameters orthonormalised once at
  initialisation) trained with Adam, instead of the paper's LandingPC optimizer (update rule unknown);
* orthonormal categorical inputs as rows of a per-variable unitary ``V x V`` matrix; branches of a sum take
  disjoint row blocks (U4);
* a balanced binary tree over the 8x8 pixels in Z-order (the paper's region graphs are unknown); the
  non-tensor-network model sums two such trees over the Z-order and its transpose;
* the baseline is the same tree with unconstrained weights, started from the unitary model's initial
  function and normalised every step by the explicit-squaring Gram recursion; both use the same optimiser,
  schedule and validation-based epoch selection.
"""
from .circuit import (Circuit, CircuitBuilder, CircuitStructure, Node, NotStructuredError, as_weight,
                      random_structure, semi_unitary, tree_structure, two_partition_structure)
from .tree import TreeMixtureCircuit, morton_order

__all__ = [
    "Circuit", "CircuitBuilder", "CircuitStructure", "Node", "NotStructuredError", "as_weight", "random_structure",
    "semi_unitary", "tree_structure", "two_partition_structure", "TreeMixtureCircuit", "morton_order",
]
