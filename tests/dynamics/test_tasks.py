"""Task generators: hand-checked semantics."""
import pytest
import torch

from interp.dynamics.tasks import addition, addition_problems, conditioned_majority, majority


def test_majority_outputs_are_running_majorities():
    b = majority(50, seed=3)
    seq = b.tokens[:, 1:]
    for r in range(50):
        for t in range(10, 20):
            c = torch.bincount(seq[r, :t], minlength=3)
            assert c[seq[r, t]] == c.max()
            full = torch.bincount(seq[r, :t + 1], minlength=3)
            assert torch.equal(b.features[r, t + 1], (full == full.max()).long())
    assert b.tokens[:, 0].eq(3).all() and b.vocab_size == 4


def test_conditioned_majority_and_addition():
    b = conditioned_majority(40, seed=1)
    seq = b.tokens[:, 1:]
    for r in range(40):
        follow = [int(seq[r, j + 1]) for j in range(9) if seq[r, j] == 0]
        c = torch.bincount(torch.tensor(follow, dtype=torch.long), minlength=3)
        assert all(c[int(x)] == c.max() for x in seq[r, 10:])
        assert torch.equal(b.features[r, 3], torch.nn.functional.one_hot(seq[r, 1], 3))
    a = addition(30, seed=2)
    d = a.tokens
    num = lambda x: x[:, 0] * 100 + x[:, 1] * 10 + x[:, 2]          # noqa: E731
    c = d[:, 9] * 1000 + d[:, 10] * 100 + d[:, 11] * 10 + d[:, 12]
    assert torch.equal(num(d[:, 1:4]) + num(d[:, 5:8]), c)
    assert (a.labels["carry"][:, 12] == 0).all()                   # units never receive a carry
    tens = (d[:, 3] + d[:, 7]) >= 10                               # carry into the tens column
    assert torch.equal(a.labels["carry"][:, 11].bool(), tens)
    with pytest.raises(ValueError, match="n_vocab"):
        majority(3, n_vocab=1)


def test_addition_labels_follow_the_paper():
    """POLCA's Figure 2: an answer 1433 whose skills are 1000s carry, 100s no carry, 10s carry, 1s no carry
    (706 + 727); App. E.1: a digit carries when the lower places sum past its place (cascades included)."""
    b = addition_problems(torch.tensor([706, 95, 999, 0]), torch.tensor([727, 5, 1, 0]))
    assert b.tokens[0].tolist() == [12, 7, 0, 6, 10, 7, 2, 7, 11, 1, 4, 3, 3]
    assert b.labels["carry"][:, -4:].tolist() == [[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    assert b.labels["digit"][0, -4:].tolist() == [0, 1, 2, 3] and (b.labels["digit"][:, :-4] == -1).all()
    lower = lambda x, k: x % 10 ** k                                          # noqa: E731
    a = addition(200, seed=5)
    num = lambda t: t[:, 0] * 100 + t[:, 1] * 10 + t[:, 2]                   # noqa: E731
    x, y = num(a.tokens[:, 1:4]), num(a.tokens[:, 5:8])
    for k, col in ((1, 11), (2, 10), (3, 9)):                                 # 10s, 100s, 1000s answer tokens
        assert torch.equal(a.labels["carry"][:, col].bool(), lower(x, k) + lower(y, k) >= 10 ** k)
    with pytest.raises(ValueError, match="operands"):
        addition_problems(torch.tensor([1000]), torch.tensor([1]))
