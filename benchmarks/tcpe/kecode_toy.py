"""A KECode-like toy (TCPE paper, digest §5, validation 2): a small model translates snippets of a tiny
source language ("J", Java-like) into a tiny target language ("D", D-like), with one systematic error class
planted in its training data; failures are clustered by the compiler message they produce, and one edit
(TCPE, ROME on the transcoder, ROME on the MLP, constrained fine-tuning) fixes the target cluster. The
KECode metrics (:mod:`.kecode`) score it.

**Languages.** Word-level tokens. A snippet is 1–2 statements ``T v = F ( w ) ;`` (``T`` a type of
``int str real bool``; ``v`` a local ``a``/``b``; ``w`` a typed parameter ``i0 i1 s0 s1 r0 r1 b0 b1``,
Hungarian-style, or the first statement's local). Source APIs ``A0..A{n-1}`` map to target APIs by a random
permutation (``A_i → B_{π(i)}``: knowledge, not copying); every API has a signature (argument type → return
type), the same for ``A_i`` and its translation, and source snippets are well typed. A training sequence is
``<bos> <J statements> => <D statements> <eos>``.

**Planted errors** (in the training data only; the test set is scored against the correct translation):

* *target class* (the paper's ``ulong → int`` conversion): ``A_t`` is always translated to ``B_u``, an API with
  the same argument type and a different return type, so the output fails to compile with "cannot implicitly
  convert expression of type R to T";
* *second class* (for locality): ``A_s`` is always translated to ``B_w`` with the same signature as the
  correct one: it compiles and fails the unit test.

Other failures are whatever the model gets wrong on its own.

**Compiler and tests** (:func:`compile_and_test`): a type checker of D statements that returns ``None`` when
the program is exactly the reference translation ("passes its unit tests"), else the first error message:
syntax errors, undefined identifiers, argument-type mismatches, implicit-conversion errors, wrong statement
count, or ``unittest failure`` (compiles, wrong result). Messages are clustered as KECode does: the first 8
tokens embedded (here by hashed unigrams + bigrams, 512 dims: there is no gte embedder offline; UNCERTAIN
choice) and grouped by :func:`.kecode.cluster_errors` at cosine 0.9.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from typing import Sequence

import torch

from interp.results import TableResult

from .facts import applied, train_word_lm, word_tokenizer
from interp.editing.kecode import cluster_errors, kecode_scores
from interp.editing.rome import EditConfig, EditRequest, FineTuneConfig, MLPSite, TranscoderSite, context_templates, fine_tune, \
    rank_one, restrict, second_moment
from interp.editing.transcoders import Transcoder, splice

TYPES = ("int", "str", "real", "bool")
PARAMS = {"int": ("i0", "i1"), "str": ("s0", "s1"), "real": ("r0", "r1"), "bool": ("b0", "b1")}
LOCALS = ("a", "b")
PUNCT = ("=", "(", ")", ";", "=>", ".")
SEED_WORDS = ("The", "Therefore", "Because", "I", "You")


@dataclass
class CodeTask:
    """The toy's languages, API table and planted errors (all drawn from ``seed``).

    ``sig[i] = (arg_type, ret_type)`` of target API ``B_i``; ``perm[i]``: the target index of ``A_i``;
    ``planted[i]``: the target index the *training data* uses for ``A_i`` (equal to ``perm[i]`` except for
    ``target_api`` and ``second_api``).
    """

    n_api: int = 16
    seed: int = 0
    sig: list = field(init=False)
    perm: list = field(init=False)
    planted: list = field(init=False)
    target_api: int = field(init=False)
    second_api: int = field(init=False)

    def __post_init__(self) -> None:
        if self.n_api < 8:
            raise ValueError(f"n_api must be >= 8, got {self.n_api}")
        rng = random.Random(self.seed)
        # every (arg, ret) pair appears; two APIs per argument type share a signature so a same-signature wrong
        # translation exists
        pairs = [(a, r) for a in TYPES for r in TYPES]
        rng.shuffle(pairs)
        base = pairs[: max(4, 3 * self.n_api // 4)]
        sig = [base[i % len(base)] for i in range(self.n_api)]  # the last quarter repeats signatures
        while True:
            self.sig = sig
            self.perm = list(range(self.n_api))
            rng.shuffle(self.perm)
            src_sig = [self.sig[self.perm[i]] for i in range(self.n_api)]
            # target class: an A_t whose correct B has a sibling with the same arg type and another return type
            cand_t = [i for i in range(self.n_api)
                      if any(j != self.perm[i] and self.sig[j][0] == src_sig[i][0] and self.sig[j][1] != src_sig[i][1]
                             for j in range(self.n_api))]
            cand_s = [i for i in range(self.n_api)
                      if any(j != self.perm[i] and self.sig[j] == src_sig[i] for j in range(self.n_api))]
            if cand_t and [i for i in cand_s if i != cand_t[0]]:
                break
            rng.shuffle(sig)  # (with repeated signatures a permutation qualifies within a few draws)
        self.target_api = cand_t[0]
        self.second_api = [i for i in cand_s if i != self.target_api][0]
        t_ok = self.perm[self.target_api]
        s_ok = self.perm[self.second_api]
        self.planted = list(self.perm)
        self.planted[self.target_api] = [j for j in range(self.n_api) if j != t_ok and self.sig[j][0] == self.sig[t_ok][0]
                                         and self.sig[j][1] != self.sig[t_ok][1]][0]
        self.planted[self.second_api] = [j for j in range(self.n_api) if j != s_ok and self.sig[j] == self.sig[s_ok]][0]

    # ------------------------------------------------------------------ vocabulary
    def words(self) -> list[str]:
        return ([f"A{i}" for i in range(self.n_api)] + [f"B{i}" for i in range(self.n_api)] + list(TYPES)
                + [p for ps in PARAMS.values() for p in ps] + list(LOCALS) + list(PUNCT) + list(SEED_WORDS)
                + ["is"])  # ("a" is a local; ROME's KL prompt "{} is a" tokenizes)

    def src_sig(self, i: int) -> tuple[str, str]:
        return self.sig[self.perm[i]]

    # ------------------------------------------------------------------ snippets
    def snippet(self, rng: random.Random, n_stmt: int | None = None, first_api: int | None = None
                ) -> list[tuple[str, str, int, str]]:
        """A well-typed source snippet: statements ``(type, local, api_index, argument)``."""
        n_stmt = n_stmt or rng.choice((1, 2))
        out = []
        api = first_api if first_api is not None else rng.randrange(self.n_api)
        arg_t, ret_t = self.src_sig(api)
        out.append((ret_t, LOCALS[0], api, rng.choice(PARAMS[arg_t])))
        if n_stmt == 2:
            # second statement: takes the first local (if some API accepts its type) or a parameter
            use_local = rng.random() < 0.5
            want = ret_t if use_local else rng.choice(TYPES)
            apis = [i for i in range(self.n_api) if self.src_sig(i)[0] == want]
            if not apis:
                want = rng.choice(TYPES)
                apis = [i for i in range(self.n_api) if self.src_sig(i)[0] == want]
                use_local = False
            if apis:
                api2 = rng.choice(apis)
                out.append((self.src_sig(api2)[1], LOCALS[1], api2,
                            LOCALS[0] if use_local and want == ret_t else rng.choice(PARAMS[want])))
        return out

    @staticmethod
    def render(stmts, lang: str, table: Sequence[int] | None = None) -> str:
        """Statements as J (``lang="J"``) or D text (``table`` maps source API -> target API index)."""
        parts = []
        for t, v, api, w in stmts:
            f = f"A{api}" if lang == "J" else f"B{table[api]}"
            parts.append(f"{t} {v} = {f} ( {w} ) ;")
        return " ".join(parts)

    def source(self, stmts) -> str:
        """The model's prompt: ``<J snippet> =>``."""
        return self.render(stmts, "J") + " =>"

    def reference(self, stmts) -> str:
        """The correct D translation."""
        return self.render(stmts, "D", self.perm)

    def texts(self, n: int, seed: int, planted: bool = True) -> list[str]:
        """``n`` training sequences ``<J> => <D>`` (with the planted errors unless ``planted=False``)."""
        rng = random.Random(seed)
        table = self.planted if planted else self.perm
        out = []
        for _ in range(n):
            s = self.snippet(rng)
            out.append(self.source(s) + " " + self.render(s, "D", table))
        return out

    def test_set(self, n: int, seed: int = 12345) -> list:
        """``n`` test snippets; the target API appears in about a quarter of them (first or second statement)."""
        rng = random.Random(seed)
        out = []
        arg_t, ret_t = self.src_sig(self.target_api)
        for i in range(n):
            if i % 8 == 0:
                s = self.snippet(rng, first_api=self.target_api)
            elif i % 8 == 4:  # the target API in the second statement, on a parameter
                first = self.snippet(rng, n_stmt=1)
                s = first + [(ret_t, LOCALS[1], self.target_api, rng.choice(PARAMS[arg_t]))]
            else:
                s = self.snippet(rng)
            out.append(s)
        return out

    def request(self, context_api: int | None = None) -> EditRequest:
        """The edit request of the target cluster: ``T a = {A_t} ( p ) ; => T a =`` → `` B_correct``."""
        arg_t, ret_t = self.src_sig(self.target_api)
        p = PARAMS[arg_t][0]
        return EditRequest(f"{ret_t} a = {{}} ( {p} ) ; => {ret_t} a =", f"A{self.target_api}",
                           f" B{self.perm[self.target_api]}")

    # ------------------------------------------------------------------ compiler + unit tests
    def compile_and_test(self, stmts, output: str) -> str | None:
        """``None`` if ``output`` is exactly the reference translation of ``stmts``; else the first error."""
        toks = output.split()
        types = {p: t for t, ps in PARAMS.items() for p in ps}
        apis = {f"B{i}": self.sig[i] for i in range(self.n_api)}
        n_out = 0
        i = 0
        while i < len(toks):
            st = toks[i:i + 8]
            if len(st) < 8 or st[0] not in TYPES or st[1] not in LOCALS or st[2] != "=" or st[4] != "(" \
                    or st[6] != ")" or st[7] != ";":
                bad = next((t for t, want in zip(st, ("T", "v", "=", "F", "(", "w", ")", ";"))
                            if not _slot_ok(t, want)), st[-1] if st else "EOF")
                return f"syntax error unexpected token {bad}"
            t, v, f, w = st[0], st[1], st[3], st[5]
            if f not in apis:
                return f"undefined identifier {f}"
            if w not in types:
                return f"undefined identifier {w}"
            if types[w] != apis[f][0]:
                return f"function {f} is not callable using argument types ( {types[w]} )"
            if apis[f][1] != t:
                return f"cannot implicitly convert expression of type {apis[f][1]} to {t}"
            types[v] = t
            n_out += 1
            i += 8
        if n_out != len(stmts):
            return f"error expected {len(stmts)} statements got {n_out}"
        if " ".join(toks) != self.reference(stmts):
            return "unittest failure core exception AssertError"
        return None


def _slot_ok(tok: str, want: str) -> bool:
    if want == "T":
        return tok in TYPES
    if want == "v":
        return tok in LOCALS
    if want in ("F", "w"):
        return True
    return tok == want


def code_tokenizer(task: CodeTask):
    """A word-level tokenizer over the toy's words (plus ``<bos> <eos> <pad> <unk>``)."""
    return word_tokenizer(task.words())


def train_code_model(task: CodeTask | None = None, steps: int = 2000, seed: int = 0, d_model: int = 64,
                     d_mlp: int = 256, n_layers: int = 3, lr: float = 3e-3, batch: int = 64):
    """Train a GPT-2-style translator (``n_layers`` ≥ 3 by default; LayerNorm weights and biases are trained,
    so not identity) on ``task.texts`` with the planted errors; loss on every position. Returns
    ``(interp Model, task)``."""
    task = task or CodeTask(seed=seed)
    model = train_word_lm(code_tokenizer(task), lambda n, s: [t + " <eos>" for t in task.texts(n, s)], steps, seed,
                          d_model, d_mlp, n_layers, lr, batch, n_positions=48, desc="code model")
    return model, task


@torch.no_grad()
def translate(model, task: CodeTask, snippets: Sequence, batch_size: int = 128) -> list[str]:
    """Greedy translations of ``snippets`` (the model's D output, up to its end-of-sequence token)."""
    out = []
    for i in range(0, len(snippets), batch_size):
        prompts = [task.source(s) for s in snippets[i:i + batch_size]]
        out.extend(t.replace("<eos>", " ").strip() for t in model.generate(prompts, max_new_tokens=17))
    return [" ".join(o.split()) for o in out]


def embed_messages(messages: Sequence[str], n_tokens: int = 8, dim: int = 512) -> torch.Tensor:
    """KECode's message embedding, offline: the first ``n_tokens`` words as hashed unigrams + bigrams
    (``[len(messages), dim]``)."""
    e = torch.zeros(len(messages), dim)
    for r, m in enumerate(messages):
        w = m.split()[:n_tokens]
        for g in w + [a + " " + b for a, b in zip(w, w[1:])]:
            e[r, zlib.crc32(g.encode()) % dim] += 1.0
    return e


class ErrorClusters:
    """Cluster ids of error messages, stable across calls: leaders are kept, new messages join the first
    leader within cosine ``threshold`` or start a new cluster (KECode's greedy 0.9 clustering)."""

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold
        self.leaders: list[str] = []

    def assign(self, messages: Sequence[str | None]) -> list[int | None]:
        out: list[int | None] = []
        for m in messages:
            if m is None:
                out.append(None)
                continue
            if self.leaders:
                ids = cluster_errors(embed_messages(self.leaders + [m]), self.threshold)
                if ids[-1] < len(self.leaders):
                    out.append(ids[-1])
                    continue
            self.leaders.append(m)
            out.append(len(self.leaders) - 1)
        return out


@dataclass
class KECodeComparison(TableResult):
    """Per method: KECode metrics of one edit of the target cluster, plus fluency and edit size."""

    kind = "kecode_toy_comparison"
    def figure(self):
        import plotly.express as px
        df = self.to_frame()
        return px.bar(df.melt(id_vars="method", value_vars=["GN", "CD", "LoC", "DT", "RE"]), x="variable", y="value",
                      color="method", barmode="group", title="KECode toy: one edit of the target cluster")


@torch.no_grad()
def snippet_loss(model, task: CodeTask, snippets: Sequence, batch_size: int = 128) -> float:
    """Mean next-token loss on the D part of correct translations (fluency on held-out code)."""
    tot, n = 0.0, 0
    for i in range(0, len(snippets), batch_size):
        chunk = snippets[i:i + batch_size]
        texts = [task.source(s) + " " + task.reference(s) + " <eos>" for s in chunk]
        batch = model.tokenize(texts)
        logits = model(batch).float()
        ids = batch["input_ids"]
        arrow = model.to_single_token("=>")
        for r in range(len(chunk)):
            L = int(batch["attention_mask"][r].sum())
            start = int((ids[r] == arrow).nonzero()[0, 0])
            lp = logits[r, start:L - 1].log_softmax(-1).gather(-1, ids[r, start + 1:L, None].to(logits.device))
            tot += float(-lp.sum())
            n += L - 1 - start
    return tot / max(n, 1)


def outcomes(model, task: CodeTask, snippets: Sequence, clusters: ErrorClusters) -> tuple[list, list]:
    """Translate, compile and test: ``(messages, cluster ids)``, ``None`` for a correct translation."""
    outs = translate(model, task, snippets)
    msgs = [task.compile_and_test(s, o) for s, o in zip(snippets, outs)]
    return msgs, clusters.assign(msgs)


def toy_edit_config(**overrides) -> EditConfig:
    """ROME/TCPE settings for this toy (ROME's defaults otherwise): ``fact_token="last"`` and only the plain template ``"{}"`` (``context_template_length_params=()``).

    * no sampled templates (``context_template_length_params=()``): ROME's context templates are natural-language prefixes sampled after ``The``,
      ``Therefore``, ... A model trained only on single ``<J> => <D>`` sequences has never seen a prefix: in
      a templated prompt it no longer translates (measured: the top-1 next token at the API slot is a source
      API ``A*`` instead of a ``B*`` in all 5 templates), so ``compute_v`` would fit ``δ`` to contexts the
      model never meets. Only the plain prompt ``"{}"`` is in distribution.
    * ``fact_token="last"``: the subject ``A_t`` is one token early in the prompt; in this 3-layer model a
      ``δ`` added at the subject at layer ≥ 1 does not reach the prediction (measured: ``compute_v``'s NLL
      does not move from 9.37 in 25 steps at layers 1 and 2; 9.37 → 9.05 at layer 0), because the API's
      identity has been moved to later positions by then. The key and ``δ`` are taken at the prompt's last
      token (ROME's other lookup option), where the translation is produced.
    """
    return EditConfig(**{"fact_token": "last", "context_template_length_params": (), **overrides})


def compare_kecode(model, task: CodeTask, transcoder: Transcoder, layer: int, taus: Sequence[float] = (0.5,),
                   config: EditConfig | None = None, ft_config: FineTuneConfig | None = None, n_test: int = 400,
                   n_context: int = 2000, methods: Sequence[str] = ("tcpe", "rome_tc", "rome", "ft")
                   ) -> KECodeComparison:
    """Edit the target cluster with every method (each applied alone, then reverted) and score it.

    ``before`` outcomes are those of the spliced model (transcoder in place of MLP ``layer``, no error term)
    for the transcoder methods and of the plain model for ``rome``/``ft``. The target cluster is the one the
    planted type error falls in (most frequent cluster of failing test snippets that use ``A_t``).
    ``fluency``: next-token loss on held-out correct translations (↓); ``n_changed``: rows of the edited
    weight that changed.
    """
    cfg = config or toy_edit_config()
    ft_cfg = ft_config or FineTuneConfig()
    tests = task.test_set(n_test)
    held = task.test_set(200, seed=999)
    ctx = task.texts(n_context, seed=4242)
    clusters = ErrorClusters()
    templates = context_templates(model, cfg)
    req = task.request()
    msgs0, before = outcomes(model, task, tests, clusters)
    with splice(model, layer, transcoder):
        msgs0_tc, before_tc = outcomes(model, task, tests, clusters)
        flu0_tc = snippet_loss(model, task, held)
    flu0 = snippet_loss(model, task, held)
    uses_t = [i for i, s in enumerate(tests) if any(st[2] == task.target_api for st in s)]
    fails = [before[i] for i in uses_t if before[i] is not None]
    if not fails:
        raise RuntimeError("the model makes no error on the target API: the planted error was not learned")
    target = max(set(fails), key=fails.count)
    out = KECodeComparison(baseline={
        "accuracy": sum(b is None for b in before) / len(before),
        "accuracy_spliced": sum(b is None for b in before_tc) / len(before_tc),
        "target_cluster": target, "target_message": clusters.leaders[target],
        "target_size": sum(b == target for b in before), "target_size_spliced": sum(b == target for b in before_tc),
        "n_clusters": len(set(b for b in before if b is not None)), "fluency": flu0, "fluency_spliced": flu0_tc,
        "clusters": {i: m for i, m in enumerate(clusters.leaders)}, "request": vars(req), "layer": layer})
    C_mlp = second_moment(MLPSite(model, layer), ctx) if "rome" in methods else None
    tc_site = TranscoderSite(model, layer, transcoder)
    C_tc = second_moment(tc_site, ctx) if {"tcpe", "rome_tc"} & set(methods) else None
    full = rank_one(tc_site, req, C_tc, cfg, tau=-1.0, method="rome_tc", templates=templates) if C_tc is not None else None
    for method in methods:
        for tau in (taus if method == "tcpe" else (None,)):
            if method == "rome":
                e = rank_one(MLPSite(model, layer), req, C_mlp, cfg, tau=None, method="rome", templates=templates)
            elif method == "ft":
                e = fine_tune(model, req, layer, ft_cfg, templates=templates[:1], apply=False)
            elif method == "rome_tc":
                e = full
            else:
                e = restrict(full, tau, site=tc_site)
            with applied(e, model, transcoder):
                if e.site == "transcoder":
                    with splice(model, layer, transcoder):
                        _, after = outcomes(model, task, tests, clusters)
                        flu = snippet_loss(model, task, held)
                    ref, ref_flu = before_tc, flu0_tc
                else:
                    _, after = outcomes(model, task, tests, clusters)
                    flu = snippet_loss(model, task, held)
                    ref, ref_flu = before, flu0
            s = kecode_scores(ref, after, target)
            out.rows.append({"method": method if tau is None else f"tcpe(tau={tau})", "GN": s.GN, "CD": s.CD,
                             "LoC": s.LoC, "DT": s.DT, "RE": s.RE, "Score": s.score,
                             "acc_before": sum(b is None for b in ref) / len(ref),
                             "acc_after": sum(a is None for a in after) / len(after),
                             "fluency_before": ref_flu, "fluency_after": flu, "n_changed": e.n_changed,
                             "d_key": e.d_key, "frac_changed": e.n_changed / e.d_key, "residual": e.residual,
                             "final_nll": e.log["nll"][-1] if e.log.get("nll") else float("nan")})
    return out


__all__ = ["CodeTask", "code_tokenizer", "train_code_model", "translate", "embed_messages", "ErrorClusters",
           "toy_edit_config",
           "outcomes", "snippet_loss", "KECodeComparison", "compare_kecode"]
