"""Real-time rule enforcement: GAVEL's detectors scored on the fly inside ``model.generate``.

:class:`Monitor` opens an intervention context with a read-only function hook on every
``blocks.{l}.attn.hook_z`` of the detector's layer range (and on ``hook_embed``, to know which token each
pass reads). ``generate`` runs its usual key-value-cached loop: pass ``k > 0`` reads the ``k``-th new token,
so each hook sees that token's readout once, in the pass that computes it; there is no second forward.
When ``window`` new tokens have been read, the detector scores that window (one GRU call) and its
probabilities enter a conversation-level sliding window of the last ``history`` windows (the paper's
``W_t = {t-N+1..t}``; N is not given in the paper, choice: 8 windows = 40 tokens by default). A CE fires
when at least ``patience_c`` windows in it reach ``θ_c``; every rule is evaluated on the fired CEs after each
window and, when it fires, its action is taken:

- ``flag``: log the event, keep generating;
- ``block``: stop the generation at once (the text so far is returned, ``stopped=True``);
- ``replace``: stop and return the rule's fixed ``message`` instead of the generation;
- ``redirect``: stop and generate the turn again with the rule's ``system_prompt`` as system message
  (monitored too; a rule firing again there blocks, so a redirect cannot loop).

Every event records the rule, action, the generated-token positions and text of the windows whose
probabilities made each CE fire, those probabilities, and the CE scores. The sliding window persists over
``generate`` calls (turns of one conversation) until :meth:`Monitor.reset`; with ``score_prompt=True`` the
prompt's tokens are scored in pass 0 as well (for conversations that started unmonitored), and with
``score_prompt="assistant"`` only the prompt's assistant tokens are (the earlier assistant turns of a chat
prompt, the new turn's header and a ``prefill``; the tokens the detectors were trained on): the prompt is
then tokenised message by message, as :func:`~interp.probes.gavel.encode_conversation` does.
``generate(..., prefill=text)`` starts the assistant turn with ``text`` (a prefilled turn the model continues).

Choices: one conversation per call (batch 1); the last token of a generation is never fed back through the
model, so its readout does not exist: the monitor scores the tail (fewer than ``window`` tokens since the
last full window) together with the tokens before it as a final window ending at the last read token, as
:func:`~interp.probes.gavel.make_windows` does offline.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from interp.results import Result

from .detector import CEDetector, compute_triggers
from .rules import Rule, RuleSet

__all__ = ["Monitor", "MonitorOutput", "render_prompt"]


class _Stop(Exception):
    """Raised inside a hook to end a generation when a rule's action demands it."""

    def __init__(self, event: dict):
        super().__init__(event["rule"])
        self.event = event


def render_prompt(model, prompt, system_prompt: str | None = None) -> str:
    """A prompt string for ``model.generate``: text as is, or chat messages rendered for a new assistant turn
    (the tokenizer's chat template, else ``role: content`` lines and ``assistant:``). ``system_prompt``
    replaces any system message."""
    if isinstance(prompt, str):
        if system_prompt is None:
            return prompt
        prompt = [{"role": "user", "content": prompt}]
    msgs = [dict(m) for m in prompt if m.get("role") != "system" or system_prompt is None]
    if system_prompt is not None:
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    tok = model.tokenizer
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"


@dataclass
class MonitorOutput(Result):
    """One monitored generation: the text returned, the events, and every scored window."""

    text: str
    generated_text: str  #: what the model generated before any stop (equals ``text`` unless replaced)
    token_ids: list[int]
    stopped: bool
    action: str | None  #: the action that ended or changed the turn (None: none)
    events: list[dict]
    window_probs: torch.Tensor  #: [n_windows, C] probabilities of the windows scored in this call
    window_spans: list[list[int]]  #: generated-token positions [start, end) of each window
    ces: list[str]
    redirected: dict | None = None  #: for ``redirect``: the first attempt's ``generated_text`` and ``events``

    def to_frame(self):
        import pandas as pd
        rows = [{"rule": e["rule"], "action": e["action"], "token": e["token"], "fired": ", ".join(e["fired"]),
                 "text": e["text"]} for e in self.events]
        return pd.DataFrame(rows, columns=["rule", "action", "token", "fired", "text"])

    def figure(self):
        import plotly.graph_objects as go
        x = [f"{a}-{b}" for a, b in self.window_spans]
        fig = go.Figure(go.Heatmap(z=self.window_probs.T.numpy() if len(self.window_probs) else [[]], x=x,
                                   y=self.ces, zmin=0, zmax=1, colorscale="Viridis"))
        for e in self.events:
            fig.add_annotation(x=x[e["window"]] if x else 0, y=self.ces[0], text=f"{e['rule']}: {e['action']}",
                               showarrow=True)
        fig.update_layout(title="GAVEL monitor: CE probability per window", xaxis_title="generated tokens")
        return fig


class Monitor:
    """Enforce ``rules`` over the CEs of ``detector`` while ``model`` generates.

    ``model``: an :class:`interp.Model` with the readout the detector was trained on (``detector.spec``);
    ``rules``: a :class:`RuleSet` or a list of rules (their CEs must be the detector's);
    ``history``: the conversation-level sliding window, in detector windows.

    Defaults: ``detector=None`` is the built-in template detector of ``model``
    (:func:`~.evaluation.template_detector`: the template library's 10 CEs, trained once per model and cached);
    ``rules=None`` the template library's scenario rules over those CEs (:func:`~.library.library_rules`).
    """

    def __init__(self, model, detector: CEDetector | None = None, rules: RuleSet | Sequence[Rule] | None = None,
                 history: int = 8, score_prompt: bool | str = False):
        if detector is None:
            from .evaluation import template_detector
            detector = template_detector(model)
        if rules is None:
            from .library import library_rules
            rules = library_rules()
        if detector.spec is None:
            raise ValueError("the detector has no FeatureSpec (train it with spec=...) so the monitor cannot know "
                             "which layers to read")
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValueError(f"history must be a positive integer (windows), got {history!r}")
        if score_prompt not in (True, False, "assistant"):
            raise ValueError(f"score_prompt must be True, False or 'assistant', got {score_prompt!r}")
        self.model, self.detector, self.history, self.score_prompt = model, detector, history, score_prompt
        self.rules = rules if isinstance(rules, RuleSet) else RuleSet(list(rules))
        if not len(self.rules):
            raise ValueError("Monitor needs at least one rule")
        for r in self.rules:
            r.check_ces(detector.ces)
        detector.spec.check(model)
        self.names = detector.spec.names()
        self._kv = model.cfg.n_kv_heads if detector.spec.group_kv else None
        self.reset()

    # ------------------------------------------------------------------------------------ state
    def reset(self) -> None:
        """Start a new conversation: empty the sliding window and forget fired rules."""
        self._windows: deque[torch.Tensor] = deque(maxlen=self.history)
        self._window_meta: deque[dict] = deque(maxlen=self.history)
        self._fired_rules: set[str] = set()

    def _new_call(self) -> None:
        self._parts: dict[int, torch.Tensor] = {}
        self._buffer: list[torch.Tensor] = []  # features of tokens read since the last window
        self._tokens: list[torch.Tensor] = []  # embeddings of the tokens read (pass k reads new token k)
        self._feats: list[torch.Tensor] = []
        self._probs: list[torch.Tensor] = []
        self._spans: list[list[int]] = []
        self._events: list[dict] = []
        self._no_more_redirects = False
        self._prompt_mask: torch.Tensor | None = None

    # ------------------------------------------------------------------------------------ hooks
    def _embed_hook(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        if ctx.pass_index > 0:
            self._tokens.append(tensor[0, -1].detach())
        return tensor

    def _z_hook(self, tensor: torch.Tensor, ctx) -> torch.Tensor:
        layer = ctx.layer
        if ctx.pass_index == 0 and not self.score_prompt:
            return tensor
        z = tensor.detach()[0]  # [pos, H, d]
        if ctx.attention_mask is not None:
            z = z[ctx.attention_mask[0].bool()]
        if ctx.pass_index == 0 and self._prompt_mask is not None:
            z = z[self._prompt_mask.to(z.device)]
            if not len(z):
                return tensor
        if self._kv is not None:
            H, d = z.shape[-2:]
            z = z.reshape(z.shape[0], self._kv, H // self._kv, d).mean(-2)
        self._parts[layer] = z.reshape(z.shape[0], -1).float()
        if layer == self.detector.spec.layers[-1]:
            feats = torch.cat([self._parts[lay] for lay in self.detector.spec.layers], -1)  # [pos, F]
            self._parts = {}
            self._consume(feats, prompt=ctx.pass_index == 0)
            if ctx.pass_index == 0 and self._buffer:  # prompt tail: a window ending at the last prompt token
                w = self.detector.window
                tail = feats[-w:]
                self._buffer = []
                self._score(tail, prompt=True)
        return tensor

    def _consume(self, feats: torch.Tensor, prompt: bool) -> None:
        w = self.detector.window
        for row in feats:
            self._buffer.append(row)
            if not prompt:
                self._feats.append(row)
            if len(self._buffer) == w:
                self._score(torch.stack(self._buffer), prompt)
                self._buffer = []

    def _score(self, window: torch.Tensor, prompt: bool) -> None:
        probs = self.detector.window_logits(window[None])[0].sigmoid()
        end = len(self._feats)
        span = [-1, -1] if prompt else [end - len(window), end]
        self._windows.append(probs)
        self._window_meta.append({"span": span, "call": id(self._events)})
        if not prompt:
            self._probs.append(probs)
            self._spans.append(span)
        self._check_rules(prompt)

    def _check_rules(self, prompt: bool) -> None:
        P = torch.stack(list(self._windows))  # [N, C]
        det = self.detector
        trig = compute_triggers(P, det.thresholds, det.inference_patience)
        fired = {c for c, t in zip(det.ces, trig) if t}
        for rule in self.rules:
            if rule.name in self._fired_rules or not rule.evaluate(fired & set(rule.condition_ces)):
                continue
            self._fired_rules.add(rule.name)
            hits = P >= det.thresholds
            causes = {}
            for ce in sorted(fired & set(rule.condition_ces)):
                c = det.index(ce)
                causes[ce] = [{"span": self._window_meta[i]["span"], "prob": float(P[i, c])}
                              for i in range(len(P)) if hits[i, c]]
            action = rule.action
            if action == "redirect" and self._no_more_redirects:
                action = "block"
            event = {"rule": rule.name, "action": action, "token": len(self._feats), "window": len(self._probs) - 1,
                     "fired": sorted(fired), "causes": causes,
                     "scores": {c: float(v) for c, v in zip(det.ces, P.max(0).values)},
                     "in_prompt": prompt, "text": ""}
            self._events.append(event)
            if action != "flag":
                raise _Stop(event)

    # ------------------------------------------------------------------------------------ public
    def _ids_of(self, embeds: list[torch.Tensor]) -> list[int]:
        if not embeds:
            return []
        W = self.model.weight("W_E").float()  # [V, d]
        E = torch.stack(embeds).float().to(W.device)
        # the embedding of a token is a row of W_E (up to a constant scale on some families)
        sim = torch.nn.functional.normalize(E, dim=-1) @ torch.nn.functional.normalize(W, dim=-1).T
        return sim.argmax(-1).tolist()

    def generate(self, prompt, max_new_tokens: int = 64, system_prompt: str | None = None, prefill: str | None = None,
                 **generate_kwargs: Any) -> MonitorOutput:
        """Generate one assistant turn for ``prompt`` (text or chat messages) under the rules; ``prefill``: text
        the assistant turn starts with (part of the prompt; the returned text is what follows it)."""
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], str):
            raise ValueError("Monitor.generate takes one conversation (a string or a list of messages), not a batch")
        self._new_call()
        return self._generate(prompt, max_new_tokens, system_prompt, generate_kwargs, redirect_ok=True, prefill=prefill)

    def _prompt_ids(self, prompt, system_prompt, prefill) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt ids ``[T]`` and the mask ``[T]`` of its assistant tokens (message-wise tokenisation)."""
        from .features import encode_conversation
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        msgs = [dict(m) for m in prompt if m.get("role") != "system" or system_prompt is None]
        if system_prompt is not None:
            msgs = [{"role": "system", "content": system_prompt}] + msgs
        ids, keep = encode_conversation(self.model, msgs, roles=("assistant",))
        tok = self.model.tokenizer
        full = render_prompt(self.model, msgs)
        hist = tok.apply_chat_template(msgs, tokenize=False) if getattr(tok, "chat_template", None) else \
            "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
        if not full.startswith(hist):
            raise ValueError("score_prompt='assistant' needs a chat template whose history is a prefix of the "
                             "generation prompt")
        tail = tok(full[len(hist):] + (prefill or ""), add_special_tokens=False)["input_ids"]
        ids = torch.cat([ids, torch.tensor(tail, dtype=torch.long)])
        keep = torch.cat([keep, torch.ones(len(tail), dtype=torch.bool)])
        return ids, keep

    def _generate(self, prompt, max_new_tokens, system_prompt, kw, redirect_ok: bool, prefill=None) -> MonitorOutput:
        self._no_more_redirects = not redirect_ok
        if self.score_prompt == "assistant":
            text_prompt, self._prompt_mask = self._prompt_ids(prompt, system_prompt, prefill)
        else:
            text_prompt = render_prompt(self.model, prompt, system_prompt) + (prefill or "")
        hooks = {name: self._z_hook for name in self.names}
        hooks["hook_embed"] = self._embed_hook
        stop: _Stop | None = None
        ids: list[int] | None = None
        with self.model.intervene(hooks):
            try:
                out = self.model.generate(text_prompt, max_new_tokens=max_new_tokens, return_text=False, **kw)
                ids = [int(t) for t in out[0] if t >= 0]
            except _Stop as s:
                stop = s
        if stop is None:
            # the last generated token is never read back: score the tail as a window ending at the last read token
            if self._buffer and len(self._feats) >= 1:
                w = min(self.detector.window, len(self._feats))
                self._buffer = []
                try:
                    self._score(torch.stack(self._feats[-w:]), prompt=False)
                except _Stop as s:
                    stop = s
        if ids is None:
            ids = self._ids_of(self._tokens)  # tokens 1..k were read by passes 1..k
        gen_text = self.model.tokenizer.decode(ids, skip_special_tokens=True)
        for e in self._events:
            if not e["in_prompt"]:
                e["text"] = self.model.tokenizer.decode(ids[: e["token"]], skip_special_tokens=True)
        probs = torch.stack(self._probs) if self._probs else torch.zeros(0, len(self.detector.ces))
        base = dict(generated_text=gen_text, token_ids=ids, events=list(self._events), window_probs=probs,
                    window_spans=[list(s) for s in self._spans], ces=list(self.detector.ces))
        if stop is None:
            return MonitorOutput(text=gen_text, stopped=False, action=None, **base)
        ev = stop.event
        rule = self.rules[ev["rule"]]
        if ev["action"] == "block":
            return MonitorOutput(text=gen_text, stopped=True, action="block", **base)
        if ev["action"] == "replace":
            return MonitorOutput(text=rule.message or "", stopped=True, action="replace", **base)
        # redirect: the same turn again under the rule's system prompt
        first = MonitorOutput(text=gen_text, stopped=True, action="redirect", **base)
        self._new_call()
        self._no_more_redirects = True
        again = self._generate(prompt, max_new_tokens, rule.system_prompt, kw, redirect_ok=False, prefill=prefill)
        return MonitorOutput(text=again.text, generated_text=again.generated_text, token_ids=again.token_ids,
                             stopped=again.stopped, action="redirect", events=first.events + again.events,
                             window_probs=again.window_probs, window_spans=again.window_spans, ces=again.ces,
                             redirected={"generated_text": first.generated_text, "token_ids": first.token_ids,
                                         "events": first.events})
