"""CopyPaste on a real LM: LoRA-DPO of ``zoo:smollm2-135m`` (SmolLM2-135M-Instruct) on RAG-style prompts whose
contexts contradict facts the model knows.

Pipeline (:func:`smollm_experiment`):

1. facts: country capitals and landmark cities (:data:`FACTS`); the model "knows" a fact when its greedy closed-book
   answer contains the answer string (chat template, no context);
2. the known facts are split into training and evaluation facts; each evaluation fact gets a counterfactual
   context (its answer replaced by another answer of the same relation) and its original context;
3. Alg. 2 pairs on training samples (70 % counterfactual contexts): candidates = the model's own answer and a
   memory-attributed answer (non-CopyPaste), a CP-Order answer (the context sentence, verbatim) and a CP-Link
   answer (sentence + link); a faithfulness judge (context answer named, memorised answer not), ties by κ;
   answer stamping ``SmolConfig.stamp_template`` (default ``"{response} {answer}."``: Alg. 2's "r* ⊕ gold answer"
   as plain concatenation, the answer written as the context writes it, so a stamped copy is still a verbatim copy);
4. LoRA (r 16 on the attention and MLP projections) trained with our DPO (β = 0.3), checkpointed and resumable;
5. before and after: faithfulness (share of answers naming the context's answer and not the memorised one) on
   counterfactual and on original contexts, κ of the answers, and Alg. 3's contextual share through the capture
   layer (:func:`capture_copying`).

Every generated answer (closed-book, counterfactual and original contexts, before and after DPO, the base
candidates of Alg. 2 and both answers of Alg. 3) is cut by one rule, :func:`answer_end`: the first line, ended
after the stamped answer when the line carries the ``"Answer:"`` stamp; greedy decoding makes this the same as
stopping the generation there. Answers are capped at 24 new tokens (a stamped CP-Order answer is ~15).

Stamp. Alg. 2 appends the gold answer to the best CP response (``r* ⊕ a``); the paper's exact stamp text is not in
the digest. The first runs used ``"{response} Answer: {answer}"``: the word "Answer:" (and the answer without its
period) is not in the context, so a perfectly stamped copy has κ = 0.75 while SmolLM2-Instruct's unstamped copy of
the context sentence already has κ = 1 — κ could not rise. The default now appends the answer as ``" {answer}."``
(κ = 1 for a stamped copy); :func:`answer_end` still cuts at an ``"Answer:"`` stamp when a model writes one.

Choices (the paper trains 7-8B models on ~365 RAG samples, ~5 pairs each, 2 epochs at lr 5e-5 with LoRA r 64,
α 128; this is a CPU-scale stand-in): 200 training RAG prompts (from the training facts only; the evaluation
facts stay held out) give 576 Alg. 2 pairs, of which 128 are drawn at random for training (sized for the shared
2-core CPU: a 320-pair / 40-step run did not get through its reference pass in 20 minutes under load); batch 2 x
accumulation 4, 1 epoch = 16 optimiser steps; LoRA r 16, α 32; learning rate 2e-4. The paper's 5e-5 over ~230 steps
is a cumulative lr x steps of ~1.2e-2; 16 steps at 5e-5 would be 8e-4. The first run (16 steps, 96 pairs) used
5e-4: its DPO loss reached 0 by step 2 and the answers drifted from the copied sentence to a terse stamped format
("Capital of Poland: Sofia Answer: Sofia"), so the rate was lowered to 2e-4 (cumulative 3.2e-3). Measured on the
same 128 pairs with the "Answer:" stamp (docs/models/copypaste.md): 2e-4 keeps original-context accuracy
(0.967 -> 1.000) but raises counterfactual faithfulness only 0.800 -> 0.867; 5e-4 collapses every answer onto the
stamp ("Answer: X"). With the default stamp and 2e-4: faithfulness 0.800 -> 0.967, original accuracy 0.967 -> 1.000,
κ 0.869 -> 0.767, Alg. 3 contextual share 0.780 -> 0.811. Both the learning rate and the stamp were chosen by
comparing runs on the same 30 held-out evaluation facts (there is no separate validation split), so the after-DPO
numbers of the chosen setting are optimistic; ``benchmarks/copypaste/claims.yaml`` records it under ``changed:``.
The run is ``interp reproduce copypaste --preset full`` (the stages are :class:`interp.stages.Stages`).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

from interp.models.copypaste import (Candidate, CaptureConfig, DPOConfig, PreferenceConfig, PreferencePair,
                                     build_pairs, capture_copying, copy_metrics, dpo_train)
from interp.results import Result

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "United Kingdom": "London", "Ireland": "Dublin", "Netherlands": "Amsterdam", "Belgium": "Brussels",
    "Austria": "Vienna", "Switzerland": "Bern", "Poland": "Warsaw", "Czech Republic": "Prague", "Hungary": "Budapest",
    "Greece": "Athens", "Sweden": "Stockholm", "Norway": "Oslo", "Denmark": "Copenhagen", "Finland": "Helsinki",
    "Russia": "Moscow", "Ukraine": "Kyiv", "Romania": "Bucharest", "Bulgaria": "Sofia", "Serbia": "Belgrade",
    "Croatia": "Zagreb", "Turkey": "Ankara", "Egypt": "Cairo", "Kenya": "Nairobi", "Nigeria": "Abuja",
    "Ethiopia": "Addis Ababa", "Morocco": "Rabat", "Ghana": "Accra", "Japan": "Tokyo", "China": "Beijing",
    "South Korea": "Seoul", "India": "New Delhi", "Pakistan": "Islamabad", "Bangladesh": "Dhaka",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "Philippines": "Manila",
    "Malaysia": "Kuala Lumpur", "Iran": "Tehran", "Iraq": "Baghdad", "Saudi Arabia": "Riyadh", "Israel": "Jerusalem",
    "Afghanistan": "Kabul", "Nepal": "Kathmandu", "Australia": "Canberra", "New Zealand": "Wellington",
    "Canada": "Ottawa", "United States": "Washington", "Mexico": "Mexico City", "Cuba": "Havana",
    "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Chile": "Santiago", "Peru": "Lima", "Colombia": "Bogota",
    "Venezuela": "Caracas", "Iceland": "Reykjavik", "Lebanon": "Beirut", "Syria": "Damascus", "Jordan": "Amman",
    "Qatar": "Doha", "Mongolia": "Ulaanbaatar", "Sri Lanka": "Colombo", "Uruguay": "Montevideo",
    "Ecuador": "Quito", "Bolivia": "La Paz", "Tunisia": "Tunis", "Algeria": "Algiers", "Senegal": "Dakar",
    "Uganda": "Kampala", "Zimbabwe": "Harare", "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius",
    "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Cambodia": "Phnom Penh", "Singapore": "Singapore",
}
LANDMARKS = {
    "the Eiffel Tower": "Paris", "the Colosseum": "Rome", "Big Ben": "London", "the Statue of Liberty": "New York",
    "the Brandenburg Gate": "Berlin", "the Sagrada Familia": "Barcelona", "the Acropolis": "Athens",
    "the Kremlin": "Moscow", "the Golden Gate Bridge": "San Francisco", "the Sydney Opera House": "Sydney",
    "the Leaning Tower": "Pisa", "the Louvre": "Paris", "the Forbidden City": "Beijing", "the Taj Mahal": "Agra",
    "the Space Needle": "Seattle", "the Vatican": "Rome", "the Hollywood sign": "Los Angeles",
    "the Burj Khalifa": "Dubai", "the CN Tower": "Toronto", "Buckingham Palace": "London",
    "the White House": "Washington", "the Rialto Bridge": "Venice", "the Alhambra": "Granada",
    "the Charles Bridge": "Prague", "the Blue Mosque": "Istanbul", "Times Square": "New York",
}


@dataclass(frozen=True)
class Fact:
    """One fact: ``subject``, ``relation`` (``"capital"`` or ``"landmark"``) and its ``answer``."""

    subject: str
    relation: str
    answer: str

    @property
    def question(self) -> str:
        return (f"What is the capital of {self.subject}?" if self.relation == "capital"
                else f"In which city is {self.subject}?")

    def sentence(self, answer: str) -> str:
        """The context sentence stating ``answer`` (verbatim material for CP-Order)."""
        return (f"The capital of {self.subject} is {answer}." if self.relation == "capital"
                else f"{self.subject[0].upper() + self.subject[1:]} is located in {answer}.")

    def context(self, answer: str) -> str:
        """A two-sentence RAG passage stating ``answer``."""
        if self.relation == "capital":
            return f"{self.subject} is a country with a long history. {self.sentence(answer)} It is the seat of the national government."
        return f"{self.subject[0].upper() + self.subject[1:]} is a famous landmark. {self.sentence(answer)} Many tourists visit it every year."


FACTS = [Fact(k, "capital", v) for k, v in CAPITALS.items()] + [Fact(k, "landmark", v) for k, v in LANDMARKS.items()]


@dataclass
class SmolConfig:
    """Sizes of the SmolLM2 run (see the module docstring for the choices)."""

    n_eval: int = 30
    n_train_samples: int = 200
    n_pairs: int = 128
    counterfactual_frac: float = 0.7
    max_new_tokens: int = 24
    lora_r: int = 16
    lora_alpha: int = 32
    top_k: int = 10
    stamp_template: str = "{response} {answer}."
    dpo: DPOConfig = field(default_factory=lambda: DPOConfig(lr=2e-4, batch_size=2, grad_accum=4, epochs=1,
                                                             max_length=256))
    seed: int = 0
    #: use only the first ``n_facts`` of :data:`FACTS` (``None``: all 109; a small number for a quick run)
    n_facts: int | None = None

    def __post_init__(self):
        PreferenceConfig(stamp_template=self.stamp_template)  # the stamp is checked where Alg. 2 defines it
        if self.n_facts is not None and self.n_facts < 2:
            raise ValueError(f"n_facts must be >= 2 or None, got {self.n_facts}")
        if self.n_eval < 1 or self.n_train_samples < 1 or self.n_pairs < 1:
            raise ValueError("n_eval, n_train_samples and n_pairs must be >= 1")


def chat_prompt(tokenizer, question: str, context: str | None) -> str:
    """The chat-template prompt of a (RAG) question; the model answers in one short sentence."""
    user = (f"Context: {context}\n\nAnswer the question using the context, in one short sentence.\nQuestion: {question}"
            if context is not None else f"Answer in one short sentence.\nQuestion: {question}")
    return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)


STAMP = "Answer:"
_ANSWER_END = re.compile(r"[.!?](?=\s|$)|\s+\S+:")


def answer_end(text: str) -> int:
    """Where a generated answer ends: ``text[:answer_end(text)]`` is the answer every condition is scored on.

    The answer is the first non-empty line; if that line carries the stamp (``"Answer:"``, the format DPO is
    trained on), it ends after the stamped answer, i.e. before the next ``Word:`` field (``"Question:"``, a
    repeated ``"Answer:"``) or after the first sentence-final ``.``/``!``/``?``. Applied alike before and after
    DPO, with and without context; greedy decoding makes cutting here the same as stopping the generation here.
    """
    start = len(text) - len(text.lstrip())
    nl = text.find("\n", start)
    end = len(text) if nl < 0 else nl
    k = text.find(STAMP, start, end)
    if k >= 0:
        a = k + len(STAMP)
        m = _ANSWER_END.search(text, a + (len(text[a:end]) - len(text[a:end].lstrip())), end)
        if m is not None:
            end = m.end() if m.group(0)[0] in ".!?" else m.start()
    return len(text[:end].rstrip()) if text[:end].strip() else end


def first_answer(text: str) -> str:
    """``text`` cut at :func:`answer_end` (leading / trailing whitespace removed)."""
    return text[:answer_end(text)].strip()


def stamp_suffix(answer: str, template: str, answers=()) -> int | None:
    """Where a stamp made by ``template`` starts in ``answer``, or ``None`` when it carries none.

    A stamp is the ``"Answer:"`` word anywhere (the first runs' format), or, for another template, the template's
    text after ``{response}`` filled with one of ``answers`` (e.g. ``" Berlin."`` for ``"{response} {answer}."``) at
    the end of ``answer``, after a response that ends a sentence (so ``"The capital of X is Y."`` alone is unstamped
    and ``"The capital of X is Y. Y."`` is stamped).
    """
    k = answer.find(STAMP)
    if k >= 0:
        return k
    tail = template.split("{response}", 1)[1]
    a = answer.rstrip()
    for x in sorted(answers, key=len, reverse=True):
        suf = tail.format(answer=x).rstrip()
        if suf.strip() and a.endswith(suf):
            head = a[:len(a) - len(suf)].rstrip()
            if head and head[-1] in ".!?":
                return len(a) - len(suf)
    return None


def strip_stamp(answer: str, template: str = "{response} Answer: {answer}", answers=()) -> str:
    """The response part of a stamped answer (text before the stamp, see :func:`stamp_suffix`; all if unstamped)."""
    k = stamp_suffix(answer, template, answers)
    return answer if k is None else answer[:k].rstrip()


def names(answer: str, text: str) -> bool:
    """Whether ``text`` names ``answer`` (case-insensitive substring)."""
    return answer.lower() in text.lower()


def faithful(answer: str, memory: str, text: str) -> bool:
    """Faithful to a context stating ``answer``: names it and (when it differs) not the memorised ``memory``."""
    return names(answer, text) and (answer == memory or not names(memory, text))


@dataclass
class SmolResult(Result):
    """Before / after metrics, DPO history, fact counts and example answers."""

    kind = "copypaste_smollm"
    metrics: dict[str, dict[str, float]]
    dpo_loss: list[float]
    dpo_reward_accuracy: list[float]
    n_known: int
    n_facts: int
    n_pairs: int
    examples: list[tuple[str, str, str]] = field(default_factory=list)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"metric": k, **v} for k, v in self.metrics.items()])

    def figure(self):
        import plotly.graph_objects as go

        df = self.to_frame()
        return go.Figure([go.Bar(name=t, x=df["metric"], y=df[t]) for t in ("before", "after") if t in df])


def rag_pairs(prompt: str, fact: Fact, answer: str, base_answer: str, wrong: str,
              config: PreferenceConfig | None = None) -> list[PreferencePair]:
    """Alg. 2 on one RAG sample whose context states ``answer`` for ``fact``: candidates = the model's
    ``base_answer`` and a memory-attributed answer (non-CopyPaste), CP-Order (the context sentence) and CP-Link
    (sentence + "So the answer is ..."); judge = faithfulness (:func:`faithful`), ties broken by κ; the winner is
    stamped with ``answer``, the other CP candidates with ``wrong``. Filter: κ >= 0.8, δ >= 3 (by default)."""
    config = config or PreferenceConfig(min_kappa=0.8, min_delta=3.0)
    score = lambda q, c, x: float(faithful(answer, fact.answer, x))

    def judge(q, c, x, y):
        fx, fy = score(q, c, x), score(q, c, y)
        if fx != fy:
            return float(fx > fy)
        kx, ky = copy_metrics(x, c)[0], copy_metrics(y, c)[0]
        return 0.5 if kx == ky else float(kx > ky)

    memory = fact.sentence(fact.answer)
    cands = [Candidate(base_answer.strip() or ".", "base", False),
             Candidate(f"From what I know, {memory[0].lower() + memory[1:]}", "attributed", False),
             Candidate(fact.sentence(answer), "cp_order", True),
             Candidate(f"{fact.sentence(answer)} So the answer is {answer}.", "cp_link", True)]
    pairs, _ = build_pairs(prompt, fact.question, fact.context(answer), cands, judge, gold=answer, wrong=wrong,
                           config=config, faithfulness=score)
    return pairs


def _gen(model, prompts, max_new_tokens, batch_size=16) -> list[str]:
    """Greedy answers, each cut at :func:`answer_end` (the same rule for every condition)."""
    out = []
    for i in range(0, len(prompts), batch_size):
        out.extend(first_answer(a) for a in model.generate(list(prompts[i:i + batch_size]), max_new_tokens=max_new_tokens))
    return out


def measure(model, tok, ev_facts, cf_answers, cfg: SmolConfig) -> tuple[dict[str, float], list[str]]:
    """Faithfulness / κ on counterfactual and original contexts and the Alg. 3 contextual share (counterfactual)."""
    cf_prompts = [chat_prompt(tok, f.question, f.context(c)) for f, c in zip(ev_facts, cf_answers)]
    or_prompts = [chat_prompt(tok, f.question, f.context(f.answer)) for f in ev_facts]
    cb_prompts = [chat_prompt(tok, f.question, None) for f in ev_facts]
    a_cf = _gen(model, cf_prompts, cfg.max_new_tokens)
    a_or = _gen(model, or_prompts, cfg.max_new_tokens)
    kap = lambda a, ctx: copy_metrics(a, ctx)[0] if a.split() else 0.0
    m = {
        "cf_faithfulness": sum(faithful(c, f.answer, a) for f, c, a in zip(ev_facts, cf_answers, a_cf)) / len(ev_facts),
        "cf_names_memory": sum(names(f.answer, a) for f, a in zip(ev_facts, a_cf)) / len(ev_facts),
        "orig_accuracy": sum(names(f.answer, a) for f, a in zip(ev_facts, a_or)) / len(ev_facts),
        "cf_kappa": sum(kap(a, f.context(c)) for f, c, a in zip(ev_facts, cf_answers, a_cf)) / len(ev_facts),
        "orig_kappa": sum(kap(a, f.context(f.answer)) for f, a in zip(ev_facts, a_or)) / len(ev_facts),
        "cf_delta": sum(copy_metrics(a, f.context(c))[1] if a.split() else 0.0
                        for f, c, a in zip(ev_facts, cf_answers, a_cf)) / len(ev_facts),
        "cf_kappa_response": sum(kap(strip_stamp(a, cfg.stamp_template, (c, f.answer)), f.context(c))
                                 for f, c, a in zip(ev_facts, cf_answers, a_cf)) / len(ev_facts),
        "cf_stamped": sum(stamp_suffix(a, cfg.stamp_template, (c, f.answer)) is not None
                          for f, c, a in zip(ev_facts, cf_answers, a_cf)) / len(ev_facts),
        "cf_words": sum(len(a.split()) for a in a_cf) / len(ev_facts),
    }
    cap = capture_copying(model, cf_prompts, cb_prompts, [f.context(c) for f, c in zip(ev_facts, cf_answers)],
                          CaptureConfig(top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens, stop=answer_end))
    m["contextual_share"] = cap.contextual_share
    m["contextual_per_sample"] = cap.contextual_per_sample
    return m, a_cf


def smollm_experiment(cfg: SmolConfig | None = None, stages=None, log=print) -> SmolResult:
    """Run the pipeline. With ``stages`` (an :class:`interp.stages.Stages`, as ``interp reproduce copypaste`` passes)
    the knowledge test, the before-DPO measurement, the Alg. 2 pairs and the DPO run + after-DPO measurement are
    stored stages keyed by the config and the code, so an interrupted run resumes and a changed config recomputes;
    the DPO run also checkpoints every optimiser step inside its stage's folder. Without ``stages`` nothing is
    stored."""
    import interp
    from interp.zoo.registry import path as zoo_path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg or SmolConfig()
    stage = stages if stages is not None else (lambda name, fn: fn())
    facts = FACTS if cfg.n_facts is None else FACTS[:cfg.n_facts]

    base = zoo_path("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(base)
    tok.padding_side = "left"
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    model = interp.wrap(hf, tok, backend="torch")
    rng = random.Random(cfg.seed)

    def knowledge():
        ans = _gen(model, [chat_prompt(tok, f.question, None) for f in facts], cfg.max_new_tokens)
        return [names(f.answer, a) for f, a in zip(facts, ans)]

    known_mask = stage("known", knowledge)
    known = [f for f, k in zip(facts, known_mask) if k]
    log(f"known {len(known)}/{len(facts)}")
    if len(known) <= cfg.n_eval:
        raise ValueError(f"only {len(known)} of {len(facts)} facts are known; n_eval = {cfg.n_eval} leaves none to train on")
    order = known[:]
    rng.shuffle(order)
    ev, tr = order[:cfg.n_eval], order[cfg.n_eval:]
    pool = {r: sorted({f.answer for f in FACTS if f.relation == r}) for r in ("capital", "landmark")}
    other = lambda f: rng.choice([a for a in pool[f.relation] if a != f.answer])
    cf_ev = [other(f) for f in ev]

    before = stage("before", lambda: dict(zip(("metrics", "answers"), measure(model, tok, ev, cf_ev, cfg))))
    log(f"before {before['metrics']}")

    # Alg. 2 pairs on training facts
    samples = [(rng.choice(tr), rng.random() < cfg.counterfactual_frac) for _ in range(cfg.n_train_samples)]
    samples = [(f, other(f) if is_cf else f.answer) for f, is_cf in samples]

    def make_pairs():
        prompts = [chat_prompt(tok, f.question, f.context(a)) for f, a in samples]
        base_ans = _gen(model, prompts, cfg.max_new_tokens)
        out = []
        for p, b, (f, a) in zip(prompts, base_ans, samples):
            wrong = f.answer if a != f.answer else other(f)
            out.extend([vars(x) for x in rag_pairs(p, f, a, b, wrong, PreferenceConfig(
                min_kappa=0.8, min_delta=3.0, stamp_template=cfg.stamp_template))])
        return out

    pairs_all = stage("pairs", make_pairs)
    prng = random.Random(cfg.seed + 1)
    pairs = [PreferencePair(**d) for d in prng.sample(pairs_all, min(cfg.n_pairs, len(pairs_all)))]
    log(f"pairs {len(pairs)} of {len(pairs_all)}")

    def train_and_measure():
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0, bias="none",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        torch.manual_seed(cfg.seed)                       # LoRA A initialisation
        peft_model = get_peft_model(hf, lcfg)
        tok.padding_side = "right"
        ckpt = None
        if stages is not None:                            # resumable DPO inside this run's stage folder
            stages.folder.mkdir(parents=True, exist_ok=True)
            ckpt = stages.folder / "dpo_ckpt.pt"
            if stages.fresh:
                ckpt.unlink(missing_ok=True)
        hist = dpo_train(peft_model, tok, pairs, cfg.dpo, checkpoint=ckpt)
        if ckpt is not None:
            ckpt.unlink(missing_ok=True)                  # the stage's value is stored next; the weights are not kept
        tok.padding_side = "left"
        merged = peft_model.merge_and_unload().eval()
        after_model = interp.wrap(merged, tok, backend="torch")
        m, a = measure(after_model, tok, ev, cf_ev, cfg)
        return {"metrics": m, "answers": a, "loss": hist.loss, "accuracy": hist.accuracy}

    after = stage("after", train_and_measure)
    log(f"after {after['metrics']}")
    metrics = {k: {"before": before["metrics"][k], "after": after["metrics"][k]} for k in before["metrics"]}
    ex = [(f"{f.question} [context: {c}]", b, a) for f, c, b, a in
          zip(ev[:5], cf_ev[:5], before["answers"][:5], after["answers"][:5])]
    return SmolResult(metrics=metrics, dpo_loss=after["loss"], dpo_reward_accuracy=after["accuracy"],
                      n_known=len(known), n_facts=len(facts), n_pairs=len(pairs), examples=ex)
