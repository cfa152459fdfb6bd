"""GAVEL CE world (digest §2 CPU-scale validation): data generator checks. The pass criteria and the monitor check
are the claims of ``interp reproduce gavel`` (benchmarks/gavel/claims.yaml)."""
import random

from interp.benchmarks.gavel.ce_world import FAMILIES, _window_labels, make_conversation, make_tokenizer


def test_conversations_have_phrases_and_isolated_decoys():
    rng = random.Random(0)
    for _ in range(50):
        ces = [c for c in FAMILIES if rng.random() < 0.5]
        seq, owner, last = make_conversation(rng, ces, 40)
        assert len(seq) == len(owner) == len(last) == 40
        assert {o for o in owner if o} == set(ces)
        for i, w in enumerate(seq):
            if owner[i] is None and w[0] in "abcd":  # a decoy: no neighbour of its family
                for j in (i - 1, i + 1):
                    assert not (0 <= j < 40 and seq[j][0] == w[0])
        for i in range(40):
            if last[i]:  # phrase = 3 cyclically consecutive family words ending here
                fam = seq[i][0]
                ks = [int(seq[i - 2 + j][1]) for j in range(3)]
                assert all(seq[i - 2 + j][0] == fam for j in range(3))
                assert ks[1] == (ks[0] + 1) % 5 and ks[2] == (ks[1] + 1) % 5


def test_window_labels():
    owner = [None] * 12
    last = [False] * 12
    for i in (3, 4, 5):
        owner[i] = "A"
    last[5] = True
    lab = _window_labels(owner, last, ["A", "B"], 5)  # windows 0-4, 5-9, 7-11
    assert lab[:, 0].tolist() == [-1, 1, 0] and lab[:, 1].tolist() == [0, 0, 0]


def test_zoo_entry_is_declared_not_registered_at_import():
    """The CE-world LM is a zoo entry through the entry point only; its cache key is unchanged by the move."""
    from importlib.metadata import entry_points

    from interp.benchmarks.gavel import ce_world
    from interp.zoo.registry import get_entry, recipe_hash
    (ep,) = [e for e in entry_points(group="interp.zoo") if e.name == "gavel-ce-world"]
    assert ep.value == "interp.benchmarks.gavel.zoo:entries"
    assert get_entry("gavel-ce-world") is ce_world.CE_WORLD
    assert recipe_hash("gavel-ce-world") == "0f646423e7d29ddd"  # the key the entry had in probes/gavel/


def test_tokenizer_ids():
    """The CE world's 64 word ids (specials first, then w0..w39, a0..a4, ..., d0..d4); ``<bos>`` is not prepended
    (the callers add it), unknown words are ``<unk>``."""
    tok = make_tokenizer()
    assert len(tok) == 64 and tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<bos>", "<eos>", "<pad>", "<unk>"]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    ids = tok("w0 w39 a1 d4 zebra")["input_ids"]
    assert ids == [4, 43, 45, 63, 3]
    assert tok.decode(ids) == "w0 w39 a1 d4 <unk>"
