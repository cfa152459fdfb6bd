"""The heads recipe's quick model (``interp reproduce heads``): the planted dead heads are the ones the paper's
best score flags, and zeroing them costs less than zeroing as many random heads."""
import interp
from interp.benchmarks.heads.experiment import PLANTED_KV, ValidationConfig, build_planted_llama, scores, validation


def test_planted_llama_heads_are_flagged_and_cheap_to_ablate(tmp_path):
    dead = build_planted_llama(tmp_path, seed=0)
    assert sorted(map(tuple, dead)) == sorted((l, kv * 2 + g) for l, kv in PLANTED_KV for g in range(2))
    model = interp.load(str(tmp_path), backend="torch")
    cfg = ValidationConfig(model="planted-llama", n_score_texts=12, n_eval_texts=6, eval_chars=120, max_length=48,
                           fraction=0.25, n_random=3)
    sc = scores(model, cfg)
    # p = 25 % of 16 heads: exactly the 4 planted heads are flagged on a majority of the inputs
    assert sorted(sc.flagged("AHON (LN)", 0.25)) == sorted(map(tuple, dead))
    res = validation(model, cfg, sc)
    abl = res.ablation_result
    assert abl.n_heads == 4 and abs(abl.delta) < 1e-3 < abl.random_delta
