"""Synthetic data generators for the training-dynamics papers (vectorised, seeded, no Python loop per example).

* :func:`majority` — Rofin et al.'s Majority task: ``n_in`` uniform tokens from a vocabulary of ``n_vocab``,
  then ``n_out`` tokens each drawn uniformly among the *current* majority tokens (counts include the outputs
  generated so far). Features ``is_majority_v`` at every position. At input positions they are useless for
  the next token (the next input is uniform), yet a model must compute them later.
* :func:`addition` / :func:`addition_problems` — POLCA's 3-digit addition: ``a+b=`` then the 4 result digits
  most-significant first, with per-output-token digit-position and carry labels (the paper's definitions).

Token ids: every sequence starts with a BOS token so that the first real token also has a prediction
(choice of ours; the official code has no BOS in its Majority sampler).
"""
from __future__ import annotations

import dataclasses

import torch

#: examples a generator draws when called without ``n``
DEFAULT_N = 1024


@dataclasses.dataclass
class TaskBatch:
    """``tokens`` ``[n, seq]``; ``features`` ``[n, seq, n_features]`` (0/1) or ``labels`` dict of ``[n, seq]``."""

    tokens: torch.Tensor
    features: torch.Tensor | None = None
    feature_names: tuple[str, ...] = ()
    labels: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    vocab_size: int = 0
    output_positions: tuple[int, ...] = ()


def majority(n: int = DEFAULT_N, n_vocab: int = 3, n_in: int = 10, n_out: int = 10, seed: int = 0) -> TaskBatch:
    """Majority task. ``tokens`` ``[n, 1 + n_in + n_out]`` (BOS = ``n_vocab``), ``features[b, p, v]`` = token ``v``
    is a (possibly tied) majority of the tokens up to and including position ``p`` (0 at BOS)."""
    for name, v, lo in (("n", n, 1), ("n_vocab", n_vocab, 2), ("n_in", n_in, 1), ("n_out", n_out, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    seq = torch.empty(n, n_in + n_out, dtype=torch.long)
    seq[:, :n_in] = torch.randint(0, n_vocab, (n, n_in), generator=g)
    counts = torch.nn.functional.one_hot(seq[:, :n_in], n_vocab).sum(1)                 # [n, V]
    for t in range(n_out):  # sequential by definition (each output changes the counts); vectorised over n
        is_max = counts == counts.max(-1, keepdim=True).values
        choice = torch.multinomial(is_max.float(), 1, generator=g).squeeze(-1)
        seq[:, n_in + t] = choice
        counts = counts + torch.nn.functional.one_hot(choice, n_vocab)
    running = torch.nn.functional.one_hot(seq, n_vocab).cumsum(1)                      # [n, S, V]
    feats = (running == running.max(-1, keepdim=True).values).long()
    tokens = torch.cat([torch.full((n, 1), n_vocab, dtype=torch.long), seq], 1)
    feats = torch.cat([torch.zeros(n, 1, n_vocab, dtype=torch.long), feats], 1)
    return TaskBatch(tokens=tokens, features=feats, feature_names=tuple(f"is_majority_{v}" for v in range(n_vocab)),
                     vocab_size=n_vocab + 1, output_positions=tuple(range(1 + n_in, 1 + n_in + n_out)))


PLUS, EQ, BOS_ADD = 10, 11, 12


def addition(n: int = DEFAULT_N, n_digits: int = 3, seed: int = 0) -> TaskBatch:
    """3-digit addition ``BOS a + b = c`` on ``n`` uniformly drawn operand pairs: see :func:`addition_problems`."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _check_digits(n_digits)
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 10 ** n_digits, (n,), generator=g)
    b = torch.randint(0, 10 ** n_digits, (n,), generator=g)
    return addition_problems(a, b, n_digits)


def _check_digits(n_digits) -> None:
    if isinstance(n_digits, bool) or not isinstance(n_digits, int) or not 1 <= n_digits <= 6:
        raise ValueError(f"n_digits must be an integer in 1..6, got {n_digits!r}")


def addition_problems(a: torch.Tensor, b: torch.Tensor, n_digits: int = 3) -> TaskBatch:
    """``BOS a + b = c`` for given operands ``a``, ``b`` ``[n]`` (``0 <= a, b < 10**n_digits``), ``c`` as
    ``n_digits + 1`` digits, most significant first (zero-padded). Tokens: digits 0-9, ``+`` = 10, ``=`` = 11,
    BOS = 12. Labels ``[n, seq]`` at each answer digit (−1 elsewhere): ``digit`` (0 = the most significant answer
    digit ... n_digits = the units) and ``carry`` — the paper's definition (POLCA, App. E.1): the sum of the lower
    places carries into this digit's place (e.g. the 10s digit carries when the units sum to 10 or more), i.e. the
    digit differs from the carry-free digit sum. The units digit never carries."""
    _check_digits(n_digits)
    a, b = torch.as_tensor(a, dtype=torch.long), torch.as_tensor(b, dtype=torch.long)
    if a.dim() != 1 or a.shape != b.shape or a.numel() == 0:
        raise ValueError(f"a and b must be non-empty [n] tensors of the same shape, got {tuple(a.shape)}, {tuple(b.shape)}")
    if bool((a < 0).any() | (b < 0).any() | (a >= 10 ** n_digits).any() | (b >= 10 ** n_digits).any()):
        raise ValueError(f"operands must lie in [0, 10**{n_digits})")
    n = a.shape[0]
    pw = 10 ** torch.arange(n_digits, -1, -1)                                      # most significant first
    dig = lambda x, k: (x[:, None] // pw[-k:]) % 10                                 # noqa: E731
    c = a + b
    tokens = torch.cat([torch.full((n, 1), BOS_ADD), dig(a, n_digits), torch.full((n, 1), PLUS), dig(b, n_digits),
                        torch.full((n, 1), EQ), dig(c, n_digits + 1)], 1)
    # carry into column k (10^k): carry-free digit sum differs from the true digit
    carry_free = (dig(a, n_digits + 1) + dig(b, n_digits + 1)) % 10
    carry = (carry_free != dig(c, n_digits + 1)).long()
    S = tokens.shape[1]
    start = S - (n_digits + 1)
    digit_lab = torch.full((n, S), -1, dtype=torch.long)
    carry_lab = torch.full((n, S), -1, dtype=torch.long)
    digit_lab[:, start:] = torch.arange(n_digits + 1)
    carry_lab[:, start:] = carry
    return TaskBatch(tokens=tokens, labels={"digit": digit_lab, "carry": carry_lab}, vocab_size=13,
                     output_positions=tuple(range(start, S)))


def conditioned_majority(n: int = DEFAULT_N, n_vocab: int = 3, n_in: int = 10, n_out: int = 10, seed: int = 0) -> TaskBatch:
    """Conditioned Majority: ``n_in`` uniform tokens, then ``n_out`` tokens each drawn uniformly among the
    majority of the input tokens that *follow the key token 0* (all tokens tie when none does). Outputs do not
    change the counts. Features ``prev_is_v`` (one-hot of the previous game token; 0 at BOS and the first token)
    need a 2-layer, induction-like circuit. BOS = ``n_vocab``."""
    for name, v, lo in (("n", n, 1), ("n_vocab", n_vocab, 2), ("n_in", n_in, 2), ("n_out", n_out, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    g = torch.Generator().manual_seed(seed)
    inp = torch.randint(0, n_vocab, (n, n_in), generator=g)
    counted = (inp[:, :-1] == 0)[..., None] * torch.nn.functional.one_hot(inp[:, 1:], n_vocab)
    counts = counted.sum(1)                                                         # [n, V]
    legal = (counts == counts.max(-1, keepdim=True).values).float()
    out = torch.multinomial(legal, n_out, replacement=True, generator=g)
    seq = torch.cat([inp, out], 1)
    prev = torch.nn.functional.one_hot(seq[:, :-1], n_vocab)
    feats = torch.cat([torch.zeros(n, 2, n_vocab, dtype=torch.long), prev], 1)       # BOS, first token: no prev
    tokens = torch.cat([torch.full((n, 1), n_vocab, dtype=torch.long), seq], 1)
    return TaskBatch(tokens=tokens, features=feats, feature_names=tuple(f"prev_is_{v}" for v in range(n_vocab)),
                     labels={"legal": legal.long()}, vocab_size=n_vocab + 1,
                     output_positions=tuple(range(1 + n_in, 1 + n_in + n_out)))
