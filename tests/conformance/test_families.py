"""Conformance of every causal-LM family ``transformers`` ships, on every backend, to Hugging Face's own module
arithmetic (:mod:`interp.conformance`; the oracle never goes through a backend of ours).

Each family is built tiny and random (3 layers, grouped-query attention where the family has it, norm weights
not 1, peaked attention), saved with ``save_pretrained`` and loaded by path, as a lab audits a checkpoint: the
load self-check runs, then every site group is compared with the oracle on a padded batch, padded on the right
and on the left; then a vector added at four write sites must give the HF model's logits with the same vector
added by a forward hook on its own module (``check_writes``). A pair is right, or refused at load with a one-line error naming the family and the backends
to use; a site group a backend does not offer is refused by name. The committed support matrix
(``interp/support_matrix.json``, ``docs/architectures.md``) must be this suite's outcome.
"""
from __future__ import annotations

import functools

import pytest

from interp.conformance import GROUP_PROBE, SEQUENCES, run_pair, save_family
from interp.names import UnknownHookError
from interp.support import BACKENDS, matrix
from interp.testing import CAUSAL_LM_FAMILIES


@pytest.fixture(scope="session")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("families")


@functools.lru_cache(maxsize=None)
def _saved(family: str, root) -> str:
    return save_family(family, root / family)


@pytest.mark.parametrize("family,backend", [pytest.param(f, b, id=f"{f}-{b}")
                                            for f in CAUSAL_LM_FAMILIES for b in BACKENDS])
def test_family_conforms_or_is_refused(family, backend, root):
    out = run_pair(family, backend, _saved(family, root))
    if out.refusal is not None:  # refused at load: one line, naming the family and what to use instead
        assert "\n" not in out.refusal, out.refusal
        assert "family" in out.refusal and "backend=" in out.refusal, out.refusal
    else:
        assert out.model.self_check is not None and out.model.self_check.passed, out.model.self_check
        for side, result in out.results.items():
            assert result.passed, (family, backend, side, result.failures())
        for side, written in out.writes.items():  # writes: the HF model with the same vector added by its own hook
            assert written.status in ("ok", "missing"), (family, backend, side, vars(written))
        for side, message in out.padding_refusals.items():  # refused by name, never silently wrong
            assert "\n" not in message and "family" in message, message
            assert "backend=" in message or "attn_implementation=" in message, message
        offered = set(out.model.hook_names())
        for group, name in GROUP_PROBE.items():  # a group not offered is refused by name, naming the backend
            if out.statuses.get(group) == "missing" and name not in offered:
                with pytest.raises(UnknownHookError, match=f"{backend} backend"):
                    out.model.run_with_cache([SEQUENCES[1]], names=[name])
    committed = matrix().get(family, {}).get(backend)
    assert committed == out.statuses, (
        f"the committed support matrix differs from the suite for {family} on {backend}: regenerate it with "
        f"`python scripts/support_matrix.py` (suite: {out.statuses}, committed: {committed})")
